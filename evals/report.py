"""Reports of an evaluation run: one JSON (everything), one Markdown (people), PNG charts.

The JSON holds every case of every backend: pass/fail with the failed assertions, precision,
recall, pinned coverage, question precision/recall, drift (session turns), latency, the tiers
returned, and for BM25 backends the clauses each relevant hit matched.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.cases import CaseSet
from evals.judge import Verdict, mean
from evals.runner import RunResult

# The paper's published numbers on its 72 cases (paper notes §7.4; the eval-data README).
PAPER_RESULTS: dict[str, dict[str, Any]] = {
    "bm25": {
        "label": "alias-weighted BM25 (Atlas Search)",
        "static": "60/60",
        "session": "12/12",
        "total": "72/72",
        "precision": "1.0",
        "drift": "0.0",
    },
    "vector": {
        "label": "cosine, nomic-embed-text 768-d, top 20, no threshold",
        "static": "8/60",
        "session": "0/12",
        "total": "8/72",
        "precision": "0.12",
        "drift": "0.43-0.50 (turns 9-10)",
    },
}
PAPER_CASE_SET = "tenure-paper-v1"
UNCATEGORISED = "uncategorised"


@dataclass
class BackendRun:
    """A backend's run plus what the report needs beyond the verdicts."""

    result: RunResult
    description: str
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)  # case id -> extra fields
    elapsed_s: float = 0.0


def load_categories(case_set: CaseSet, case_dir: Path | None) -> dict[str, str]:
    """caseId -> category: a case's own ``category`` field wins, then ``categories.json`` beside
    the cases, then ``evals/data/<case set>.categories.json``; session turns take their
    session's."""
    mapping: dict[str, str] = {}
    sources = [
        *([case_dir / "categories.json"] if case_dir else []),
        Path(__file__).resolve().parent / "data" / f"{case_set.name}.categories.json",
    ]
    for path in sources:
        if path.exists():
            data = json.loads(path.read_text())
            mapping.update(data.get("static", {}))
            for session_id, category in data.get("sessions", {}).items():
                mapping.setdefault(session_id, category)
            break
    for case in case_set.static:
        if case.category:
            mapping[case.case_id] = case.category
    return mapping


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def case_rows(run: BackendRun, case_set: CaseSet, categories: dict[str, str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    static = {c.case_id: c for c in case_set.static}
    turns = {f"{s.case_id}#{t.index}": (s, t) for s in case_set.sessions for t in s.turns}

    def row(v: Verdict, kind: str, extra: dict[str, Any]) -> dict[str, Any]:
        t = v.tiers
        return {
            "case_id": v.case_id,
            "kind": kind,
            **extra,
            "passed": v.passed,
            "failures": v.failures,
            "precision": _r(v.precision),
            "recall": _r(v.recall),
            "pinned_coverage": _r(v.pinned_coverage),
            "question_precision": _r(v.question_precision),
            "question_recall": _r(v.question_recall),
            "drift": _r(v.drift) if kind == "session" else None,
            "latency_ms": round(t.latency_ms, 2),
            "tiers": {
                "persona": t.persona,
                "pinned": t.pinned,
                "relevant": t.relevant,
                "questions": t.questions,
            },
            "scores": {k: round(s, 4) for k, s in t.scores.items()},
            "matched_clauses": t.clauses,
            **run.extras.get(v.case_id, {}),
        }

    for v in run.result.static:
        case = static[v.case_id]
        rows.append(
            row(
                v,
                "static",
                {
                    "category": categories.get(v.case_id, UNCATEGORISED),
                    "scope": case.scope,
                    "query": case.query,
                    "user_id": case.user_id,
                },
            )
        )
    for session_id, index, v in run.result.sessions:
        session, turn = turns[v.case_id]
        rows.append(
            row(
                v,
                "session",
                {
                    "category": categories.get(session_id, UNCATEGORISED),
                    "session": session_id,
                    "turn": index,
                    "label": turn.label,
                    "scope": turn.scope,
                    "query": turn.user_message,
                    "user_id": session.user_id,
                },
            )
        )
    return rows


def summarize(rows: list[dict[str, Any]], result: RunResult) -> dict[str, Any]:
    static = [r for r in rows if r["kind"] == "static"]
    session = [r for r in rows if r["kind"] == "session"]
    latencies = [r["latency_ms"] for r in rows]
    by_cat: dict[str, dict[str, Any]] = {}
    for category in sorted({r["category"] for r in rows}):
        members = [r for r in rows if r["category"] == category]
        by_cat[category] = {
            "passed": sum(r["passed"] for r in members),
            "total": len(members),
            "pass_rate": sum(r["passed"] for r in members) / len(members),
            "mean_precision": _r(mean([r["precision"] for r in members])),
        }
    return {
        "passed": result.passed,
        "total": result.total,
        "static_passed": sum(r["passed"] for r in static),
        "static_total": len(static),
        "session_passed": sum(r["passed"] for r in session),
        "session_total": len(session),
        "mean_precision": _r(result.mean_precision),
        "mean_recall": _r(mean([r["recall"] for r in rows])),
        "mean_pinned_coverage": _r(mean([r["pinned_coverage"] for r in rows])),
        "mean_question_precision": _r(mean([r["question_precision"] for r in rows])),
        "mean_question_recall": _r(mean([r["question_recall"] for r in rows])),
        "max_drift": round(result.max_drift, 3),
        "drift_by_turn": {r["case_id"]: r["drift"] for r in session},
        "latency_ms": {
            "p50": _r(_pct(latencies, 50), 2),
            "p95": _r(_pct(latencies, 95), 2),
            "max": _r(max(latencies, default=0.0), 2),
            "mean": _r(statistics.fmean(latencies) if latencies else None, 2),
        },
        "by_category": by_cat,
        "summary_line": result.summary_line(),
    }


def build_report(
    case_set: CaseSet, runs: dict[str, BackendRun], categories: dict[str, str], meta: dict[str, Any]
) -> dict[str, Any]:
    backends: dict[str, Any] = {}
    for name, run in runs.items():
        rows = case_rows(run, case_set, categories)
        backends[name] = {
            "description": run.description,
            "elapsed_s": round(run.elapsed_s, 2),
            "summary": summarize(rows, run.result),
            "cases": rows,
        }
    return {
        **meta,
        "case_set": {
            "name": case_set.name,
            "beliefs": len(case_set.beliefs),
            "static": len(case_set.static),
            "session_turns": sum(len(s.turns) for s in case_set.sessions),
            "total": case_set.total,
        },
        "paper": PAPER_RESULTS if case_set.name == PAPER_CASE_SET else None,
        "backends": backends,
    }


# ------------------------------------------------------------------------------- markdown


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(report: dict[str, Any], charts: dict[str, str]) -> str:
    cs = report["case_set"]
    backends: dict[str, Any] = report["backends"]
    names = list(backends)
    lines = [
        f"# Evaluation: {cs['name']} ({report['started_at'][:10]})",
        "",
        f"{cs['beliefs']} beliefs, {cs['static']} static cases, "
        f"{cs['session_turns']} session turns ({cs['total']} cases); every backend ran on the "
        "same corpus and cases, each in its own fresh "
        f"namespace on a real OpenSearch ({report['opensearch']['version']}).",
        "",
        "Command:",
        "",
        "```",
        report["command"],
        "```",
        "",
        "## Summary",
        "",
    ]
    lines += _table(
        [
            "backend",
            "static",
            "session",
            "total",
            "mean precision",
            "mean recall",
            "max drift",
            "latency p50 / p95 (ms)",
            "what it is",
        ],
        (
            [
                f"`{n}`",
                f"{b['summary']['static_passed']}/{b['summary']['static_total']}",
                f"{b['summary']['session_passed']}/{b['summary']['session_total']}",
                f"**{b['summary']['passed']}/{b['summary']['total']}**",
                _fmt(b["summary"]["mean_precision"]),
                _fmt(b["summary"]["mean_recall"]),
                _fmt(b["summary"]["max_drift"]),
                f"{_fmt(b['summary']['latency_ms']['p50'], 1)} / {_fmt(b['summary']['latency_ms']['p95'], 1)}",
                b["description"],
            ]
            for n, b in backends.items()
        ),
    )
    lines += ["", "```", *[b["summary"]["summary_line"] for b in backends.values()], "```", ""]
    if report.get("paper"):
        lines += ["## Against the paper's published numbers", ""]
        rows = []
        for key, paper in report["paper"].items():
            ours = backends.get(key)
            rows.append(
                [
                    f"paper: {paper['label']}",
                    paper["static"],
                    paper["session"],
                    paper["total"],
                    paper["precision"],
                    paper["drift"],
                ]
            )
            if ours:
                s = ours["summary"]
                rows.append(
                    [
                        f"measured here: `{key}`",
                        f"{s['static_passed']}/{s['static_total']}",
                        f"{s['session_passed']}/{s['session_total']}",
                        f"{s['passed']}/{s['total']}",
                        _fmt(s["mean_precision"]),
                        _fmt(s["max_drift"]) + " (max)",
                    ]
                )
        lines += _table(["", "static", "session", "total", "mean precision", "drift"], rows)
        lines.append("")
    categories = sorted({c for b in backends.values() for c in b["summary"]["by_category"]})
    lines += ["## By category", "", "Passed / total (mean precision):", ""]
    lines += _table(
        ["category", *[f"`{n}`" for n in names]],
        (
            [
                c,
                *[
                    (lambda s: f"{s['passed']}/{s['total']} ({_fmt(s['mean_precision'])})" if s else "–")(
                        backends[n]["summary"]["by_category"].get(c)
                    )
                    for n in names
                ],
            ]
            for c in categories
        ),
    )
    turns = list(next(iter(backends.values()))["summary"]["drift_by_turn"]) if backends else []
    if turns:
        lines += [
            "",
            "## Drift per session turn",
            "",
            "noise surfaced / (relevant + pinned); 0 when nothing surfaced.",
            "",
        ]
        lines += _table(
            ["turn", *[f"`{n}`" for n in names]],
            ([t, *[_fmt(backends[n]["summary"]["drift_by_turn"].get(t)) for n in names]] for t in turns),
        )
    if charts:
        lines += ["", "## Charts", ""]
        lines += [f"![{title}]({path})" for title, path in charts.items()]
    if "bm25" in backends and len(names) > 1:
        lines += [
            "",
            "## What each design choice earns",
            "",
            "Cases `bm25` passes and the other backend fails (and the reverse):",
            "",
        ]
        base = {r["case_id"]: r["passed"] for r in backends["bm25"]["cases"]}
        for n in names:
            if n == "bm25":
                continue
            other = {r["case_id"]: r["passed"] for r in backends[n]["cases"]}
            lost = [c for c in base if base[c] and not other.get(c, False)]
            won = [c for c in base if not base[c] and other.get(c, False)]
            lines.append(
                f"- `{n}` loses {len(lost)}"
                + (f": {', '.join(lost[:12])}" + (" …" if len(lost) > 12 else "") if lost else "")
                + (f"; wins {len(won)}: {', '.join(won)}" if won else "")
            )
    lines += ["", "## Failures", ""]
    for n, b in backends.items():
        failed = [r for r in b["cases"] if not r["passed"]]
        lines.append(f"<details><summary><code>{n}</code>: {len(failed)} failed</summary>\n")
        for r in failed:
            first = "; ".join(r["failures"][:3]) + (" …" if len(r["failures"]) > 3 else "")
            lines.append(f"- `{r['case_id']}`: {first}")
        lines.append("\n</details>\n")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------- charts


def render_charts(report: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """PNG charts; returns {title: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends: dict[str, Any] = report["backends"]
    names = list(backends)
    if not names:
        return {}
    charts: dict[str, str] = {}
    categories = sorted({c for b in backends.values() for c in b["summary"]["by_category"]})
    width = 0.8 / len(names)
    for metric, title, fname in (
        ("pass_rate", "Pass rate by category", "pass_rate_by_category.png"),
        ("mean_precision", "Mean precision by category", "precision_by_category.png"),
    ):
        fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(categories) + 2), 5.5))
        for i, n in enumerate(names):
            values = [(backends[n]["summary"]["by_category"].get(c) or {}).get(metric) or 0.0 for c in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=n)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(categories))])
        ax.set_xticklabels(categories, rotation=35, ha="right", fontsize=8)
        ax.set_ylim(0, 1.3)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.set_ylabel(metric.replace("_", " "))
        if metric == "mean_precision":
            ax.set_xlabel("no bar: precision undefined (nothing returned in the relevant tier)", fontsize=7)
        ax.set_title(f"{title} — {report['case_set']['name']}")
        ax.legend(fontsize=7, ncol=min(len(names), 4), loc="upper center")
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        charts[title] = fname
    turns = list(next(iter(backends.values()))["summary"]["drift_by_turn"])
    if turns:
        sessions = list(dict.fromkeys(t.rsplit("#", 1)[0] for t in turns))
        letter = {s: chr(ord("A") + i) for i, s in enumerate(sessions)}
        labels = [letter[t.rsplit("#", 1)[0]] + t.rsplit("#", 1)[-1] for t in turns]
        fig, ax = plt.subplots(figsize=(max(8.0, 0.6 * len(turns) + 2), 4.8))
        for n in names:
            drift = backends[n]["summary"]["drift_by_turn"]
            ax.plot(range(len(turns)), [drift.get(t) or 0.0 for t in turns], marker="o", label=n)
        ax.set_xticks(range(len(turns)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_xlabel("; ".join(f"{letter[s]} = {s}" for s in sessions), fontsize=7)
        ax.set_ylabel("drift score")
        ax.set_ylim(-0.02, 1.0)
        ax.set_title(f"Drift per session turn — {report['case_set']['name']}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(out_dir / "drift_by_turn.png", dpi=110)
        plt.close(fig)
        charts["Drift per session turn"] = "drift_by_turn.png"
    return charts


def write_reports(report: dict[str, Any], out_dir: Path, *, charts: bool = True) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    chart_files = render_charts(report, out_dir) if charts else {}
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    md_path = out_dir / "report.md"
    md_path.write_text(render_markdown(report, chart_files))
    return {
        "json": json_path,
        "markdown": md_path,
        **{k: out_dir / v for k, v in chart_files.items()},
    }
