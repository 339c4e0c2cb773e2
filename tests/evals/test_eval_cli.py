"""The evaluation CLI end to end on a real OpenSearch: example set, paper set, gate, ablations.

Runs ``evals.cli.main`` in-process against the session's OpenSearch node (tests/conftest.py).
The vector backend needs the optional ``vector`` extra and is not part of these runs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from evals.backends import ABLATIONS, vector_available
from evals.cases import PAPER_DIR, load_case_set
from evals.cli import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE, main

EXAMPLE = Path(__file__).resolve().parents[2] / "evals" / "examples" / "tiny"
SUMMARY = re.compile(
    r"^(?P<set>\S+) (?P<backend>\S+): (?P<passed>\d+)/(?P<total>\d+) passed, "
    r"mean precision (?P<p>n/a|\d\.\d\d), max drift (?P<d>\d\.\d\d)$"
)
BM25_AND_ABLATIONS = ",".join(["bm25", *ABLATIONS])


@pytest.fixture(scope="session")
def stores(opensearch_url: str, redis_url: str) -> list[str]:
    """The session's OpenSearch and Redis, as tenure-eval's options."""
    return ["--opensearch-url", opensearch_url, "--redis-url", redis_url]


def _run(out: Path, stores: list[str], *extra: str) -> int:
    return main([*stores, "--out", str(out), "--no-progress", *extra])


def _failed(report: dict[str, Any], backend: str) -> set[str]:
    return {c["case_id"] for c in report["backends"][backend]["cases"] if not c["passed"]}


@pytest.fixture(scope="module")
def example_run(stores: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("eval-example")
    code = _run(out, stores, "--cases", str(EXAMPLE), "--backends", BM25_AND_ABLATIONS)
    return code, out, json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def paper_run(stores: list[str], tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("eval-paper")
    capture: list[str] = []
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = _run(out, stores, "--backends", BM25_AND_ABLATIONS, "--gate", "bm25")
    capture.append(buf.getvalue())
    return code, out, json.loads((out / "report.json").read_text()), capture[0]


def test_example_run_writes_json_markdown_and_charts(
    example_run: tuple[int, Path, dict[str, Any]],
) -> None:
    code, out, report = example_run
    assert code == EXIT_OK
    assert set(report["backends"]) == {"bm25", *ABLATIONS}
    for png in ("pass_rate_by_category.png", "precision_by_category.png", "drift_by_turn.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "## Summary" in md
    assert "## By category" in md
    assert "## Drift per session turn" in md
    assert "![Pass rate by category](pass_rate_by_category.png)" in md
    case = next(c for c in report["backends"]["bm25"]["cases"] if c["case_id"] == "alias-psql")
    assert case["passed"]
    assert case["precision"] == 1.0
    assert case["recall"] == 1.0
    assert case["category"] == "Alias resolution"
    assert case["latency_ms"] > 0
    assert {m["clause"] for m in case["matched_clauses"]["b-postgres"]} == {"aliases"}
    turn = next(c for c in report["backends"]["bm25"]["cases"] if c["case_id"] == "session-kafka-lag#2")
    assert turn["kind"] == "session"
    assert turn["drift"] == 0.0


def test_example_bm25_passes_everything(example_run: tuple[int, Path, dict[str, Any]]) -> None:
    _, _, report = example_run
    summary = report["backends"]["bm25"]["summary"]
    assert summary["passed"] == summary["total"] == 13
    assert summary["mean_precision"] == 1.0


def test_example_ablations_fail_where_the_design_predicts(
    example_run: tuple[int, Path, dict[str, Any]],
) -> None:
    _, _, report = example_run
    # the standard analyzer splits "event bus" into words: a partial match surfaces b-kafka
    assert _failed(report, "bm25-standard-analyzer") == {"partial-alias-no-match"}
    # without aliases only canonical names are left: every alias case misses
    assert {"alias-psql", "alias-two-word", "scope-writing", "session-kafka-lag#2"} <= _failed(
        report, "bm25-no-aliases"
    )
    # exact terms only: the typo no longer reaches pytest
    assert _failed(report, "bm25-no-fuzzy") == {"fuzzy-typo"}
    # searching content surfaces b-retry from words that are only in its content
    assert _failed(report, "bm25-content-searched") == {"content-not-searched"}
    # every whole-unit match scores >= 3.3 under the boolean similarity: the threshold is never
    # what keeps a belief out, so dropping it changes nothing (identical relevant tiers)
    tiers = {
        b: {c["case_id"]: c["tiers"] for c in report["backends"][b]["cases"]}
        for b in ("bm25", "bm25-no-threshold", "bm25-lucene-query")
    }
    assert tiers["bm25"] == tiers["bm25-no-threshold"]
    # the Lucene fuzzy/shingle query answers as the tenant-vocabulary path does, every tier
    assert tiers["bm25"] == tiers["bm25-lucene-query"]
    assert not _failed(report, "bm25-lucene-query")
    # bm25 ran as the API does: Redis for the write versions, the query analysed in process
    assert report["query_analysis"].startswith("in process")


def test_paper_run_gate_passes_and_prints_summary_lines(
    paper_run: tuple[int, Path, dict[str, Any], str],
) -> None:
    code, out, report, stdout = paper_run
    assert code == EXIT_OK
    every = [m.groupdict() for m in map(SUMMARY.match, stdout.splitlines()) if m]
    lines = [d for d in every if d["set"] == "tenure-paper-v1"]
    assert [d["backend"] for d in lines] == ["bm25", *ABLATIONS]
    bm25 = lines[0]
    assert (bm25["set"], bm25["passed"], bm25["total"], bm25["p"], bm25["d"]) == (
        "tenure-paper-v1",
        "72",
        "72",
        "1.00",
        "0.00",
    )
    assert "tenure-paper-v1 bm25: 72/72 passed, mean precision 1.00, max drift 0.00" in stdout
    md = (out / "report.md").read_text()
    assert "## Against the paper's published numbers" in md
    # by default our multilingual set is reported beside the paper's, in its own directory
    ours = [d for d in every if d["set"] == "multilingual-v1"]
    assert [d["backend"] for d in ours] == ["bm25", *ABLATIONS]
    assert ours[0]["passed"] == ours[0]["total"] and ours[0]["p"] == "1.00" and ours[0]["d"] == "0.00"
    multilingual = json.loads((out / "multilingual-v1" / "report.json").read_text())
    assert multilingual["backends"]["bm25"]["summary"]["passed"] == int(ours[0]["total"])


def test_paper_report_has_every_case_with_metrics_and_categories(
    paper_run: tuple[int, Path, dict[str, Any], str],
) -> None:
    _, _, report, _ = paper_run
    cases = report["backends"]["bm25"]["cases"]
    assert len(cases) == 72
    by_cat = report["backends"]["bm25"]["summary"]["by_category"]
    assert by_cat["Alias resolution"]["total"] == 21
    assert by_cat["Scope disambiguation"]["total"] == 9
    assert by_cat["Session drift"]["total"] == 11
    assert all(c["category"] != "uncategorised" for c in cases)
    ts = next(c for c in cases if c["case_id"] == "alias-ts-resolves")
    assert {"clause": "aliases", "term": "ts", "score": 5.0} in ts["matched_clauses"]["b-ts-pref"]
    turns = report["backends"]["bm25"]["summary"]["drift_by_turn"]
    assert len(turns) == 12
    assert set(turns.values()) == {0.0}


def test_paper_no_aliases_fails_alias_cases(
    paper_run: tuple[int, Path, dict[str, Any], str],
) -> None:
    _, _, report, _ = paper_run
    failed = _failed(report, "bm25-no-aliases")
    assert {"alias-ts-resolves", "alias-kube-resolves", "negative-guidance-mongoose"} <= failed
    assert report["backends"]["bm25-no-aliases"]["summary"]["passed"] < 72
    # fuzziness earns the typo cases; the counter-signal 'moongoose' is reached by one edit
    assert {"fuzzy-single-edit-fires-non-pinned", "negative-guidance-mongoose"} <= _failed(report, "bm25-no-fuzzy")


def test_gate_fails_when_a_case_fails(stores: list[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(EXAMPLE, broken)
    cases = json.loads((broken / "retrieval.cases.json").read_text())
    cases[0]["expect"]["relevantBeliefs"]["shouldOnlyInclude"] = ["b-kafka"]  # deliberately wrong
    (broken / "retrieval.cases.json").write_text(json.dumps(cases))
    args = ("--cases", str(broken), "--backends", "bm25")
    assert _run(tmp_path / "gated", stores, *args, "--gate", "bm25", "--no-charts") == EXIT_GATE_FAILED
    report = json.loads((tmp_path / "gated" / "report.json").read_text())
    failed = next(c for c in report["backends"]["bm25"]["cases"] if c["case_id"] == cases[0]["caseId"])
    assert failed["failures"] == ["relevantBeliefs.shouldOnlyInclude: expected ['b-kafka'], got ['b-postgres']"]
    # the same run without a gate reports the failure but exits 0
    assert _run(tmp_path / "ungated", stores, *args, "--no-charts") == EXIT_OK


def test_usage_errors(opensearch_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backends", "bm25,nope", "--out", str(tmp_path)]) == EXIT_USAGE
    assert main(["--cases", str(tmp_path), "--out", str(tmp_path)]) == EXIT_USAGE
    # the BM25 backends run recall as the API does, with write versions in Redis: no Redis, no run
    nowhere = ["--opensearch-url", opensearch_url, "--redis-url", "redis://127.0.0.1:1/0"]
    assert main([*nowhere, "--cases", str(EXAMPLE), "--backends", "bm25", "--out", str(tmp_path)]) == EXIT_USAGE
    assert "Redis at redis://127.0.0.1:1/0 does not answer" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()


def test_example_set_is_loadable_and_documented() -> None:
    case_set = load_case_set(EXAMPLE)
    assert (len(case_set.beliefs), len(case_set.static), case_set.total) == (10, 10, 13)
    assert all(c.category for c in case_set.static)
    assert PAPER_DIR.exists()


@pytest.mark.skipif(not vector_available(), reason="needs the 'vector' extra (.venv-vector)")
def test_vector_backend_on_the_example_set(stores: list[str], tmp_path: Path) -> None:
    """Runs only where the optional extra is installed (README: .venv-vector)."""
    out = tmp_path / "vector"
    code = _run(out, stores, "--cases", str(EXAMPLE), "--backends", "bm25,vector")
    assert code == EXIT_OK
    report = json.loads((out / "report.json").read_text())
    vector = report["backends"]["vector"]
    # no threshold, top 20: every in-scope, live, non-question belief comes back, so precision
    # collapses wherever a scope holds more than one belief
    assert vector["summary"]["passed"] < report["backends"]["bm25"]["summary"]["passed"]
    case = next(c for c in vector["cases"] if c["case_id"] == "alias-psql")
    assert not case["passed"]
    assert "b-postgres" in case["tiers"]["relevant"]
    assert "b-mysql-old" not in case["tiers"]["relevant"]  # same status filter as BM25
    assert "b-cache-q" not in case["tiers"]["relevant"]  # same type routing
    assert "b-other-secret" not in case["tiers"]["relevant"]  # same access filters
    assert case["embed_ms"] > 0
    assert case["matched_clauses"]["b-postgres"][0]["clause"] == "cosine"


def test_tenure_eval_subcommand_is_the_same_tool(stores: list[str], tmp_path: Path) -> None:
    from service.cli import main as tenure_main

    args = ["eval", *stores, "--out", str(tmp_path), "--no-progress"]
    assert (
        tenure_main([*args, "--cases", str(EXAMPLE), "--backends", "bm25", "--no-charts", "--gate", "bm25"]) == EXIT_OK
    )
    assert json.loads((tmp_path / "report.json").read_text())["backends"]["bm25"]["cases"]
