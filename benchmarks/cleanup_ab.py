"""Recall's message clean-up, fast form against the plain one, on the benchmark's messages.

``service.recall.query.clean_query`` skips a pattern when the text lacks a literal every match of it
needs, and writes the slow patterns so that re can scan for their first character. The plain form
kept here (:func:`reference_text`: every pattern tried on every message, in their original
spelling) is what it must equal: ``tests/test_query_cleanup.py`` compares the two over generated
text, and this script times both, alternating for ``--rounds`` rounds, over the session traffic's
long (60+ words) and short (< 20 words) messages. No server is needed.

    .venv/bin/python -m benchmarks.cleanup_ab

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections.abc import Callable

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Spec
from service.recall.query import MIN_RAW_CHARS, clean_query

_SEG = r"[A-Za-z0-9_.@\-\u00c0-\u024f]"
REFERENCE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(```|~~~)[\s\S]*?(\1|$)"), " "),
    (re.compile(r"^(?: {4,}|\t).*$", re.MULTILINE), " "),
    (
        re.compile(
            r"[\[<][^\]>\n]*\.(?:ts|tsx|js|jsx|py|json|toml|yaml|yml|md|txt|csv|pdf|png|jpg|jpeg|svg)[\]>]",
            re.IGNORECASE,
        ),
        " ",
    ),
    (re.compile(r"^\s+at\s.*$", re.MULTILINE), " "),
    (re.compile(r"\b(?:https?|ftp|file)://\S+|\bwww\.\S+", re.IGNORECASE), " "),
    (re.compile(r"`[^`\n]*`"), " "),
    (
        re.compile(
            rf"(?<!\S)(?:(?:~|\.{{1,2}})?/{_SEG}+(?:/{_SEG}*)*|{_SEG}+(?:/{_SEG}+){{2,}}|{_SEG}+/{_SEG}+\.[a-z]{{1,5}})(?=[?!.,;:]*(?:\s|$))"
        ),
        " ",
    ),
    (re.compile(r"</?[a-zA-Z][^>\n]*>"), " "),
    (re.compile(r"^\s{0,3}#{1,6}\s*", re.MULTILINE), " "),
    (re.compile(r"\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w)"), ""),
    (re.compile(r"\b(?:0x)?[0-9a-fA-F]{8,}\b"), " "),
    (re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])"), " "),
    (re.compile(r"[?!.,;:]+(?=\s|$)"), ""),
)
# the original spelling of the three patterns the fast form rewrites
REFERENCE_EMPHASIS, REFERENCE_HEX, REFERENCE_INTEGER = (REFERENCE[i][0] for i in (9, 10, 11))
_SPACES = re.compile(r"\s+")


def reference_text(message: str) -> str:
    """``clean_query(message, max_chars=...)``'s text before any clamp, the plain way."""
    text = message.strip()
    if len(text) < MIN_RAW_CHARS:
        return text
    for pattern, replacement in REFERENCE:
        text = pattern.sub(replacement, text)
    return _SPACES.sub(" ", text).strip()


def _fast_text(message: str) -> str:
    return clean_query(message, max_chars=1_000_000).text


def time_both(messages: list[str], rounds: int) -> dict[str, float]:
    forms: dict[str, Callable[[str], str]] = {"reference": reference_text, "fast": _fast_text}
    if any(forms["fast"](m) != forms["reference"](m) for m in messages):
        raise RuntimeError("the fast clean-up differs from the reference on a benchmark message")
    micros: dict[str, list[float]] = {name: [] for name in forms}
    for r in range(rounds):
        for name in list(forms) if r % 2 == 0 else list(forms)[::-1]:
            clean = forms[name]
            started = time.perf_counter()
            for message in messages:
                clean(message)
            micros[name].append((time.perf_counter() - started) / len(messages) * 1e6)
    return {
        "messages": len(messages),
        **{f"{name}_us": round(statistics.median(values), 1) for name, values in micros.items()},
        "fast_faster_rounds": sum(f < r for f, r in zip(micros["fast"], micros["reference"], strict=True)),
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queries", type=int, default=3000, help="session recalls drawn (their messages)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    calls = fb.parse_args(["--queries", str(args.queries), "--warmup", "0", "--seed", str(args.seed)])
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)
    messages = [q.message for q in fb.traffic(calls, "sessions", 1_000_000, spec)[: args.queries]]
    kinds = {
        "long": [m for m in messages if len(m.split()) >= 60],
        "short": [m for m in messages if len(m.split()) < 20],
    }
    for kind, selected in kinds.items():
        print(json.dumps({"kind": kind, **time_both(selected, args.rounds)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
