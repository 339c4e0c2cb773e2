"""What one rewrite of Redis's append-only file does to the recalls in flight, with and without
``rdbcompression``, in one paced pass.

At a few hundred recalls a second Redis rewrites its append-only file every minute or two (each
time the file has doubled), and a forked child writes the whole dataset: mostly the tenants' shared
recall vocabularies, zlib-compressed already. In ``fastpath_bench`` runs, the worst paced second at
each such rewrite had a p99 of 128-390 ms (docs/benchmarks.md, "Redis's append-only rewrites").

This runs one open-loop paced pass of ``--seconds`` at ``--rate`` over the 1M corpus (the API,
two workers, and the receipt drain as ``fastpath_bench`` starts them, primed and warmed), and
every ``--every-s`` seconds sets ``rdbcompression`` to the next arm (``yes``, ``no``, ``no``,
``yes``, ...: ABBA, so the machine's drift falls on both) and asks Redis for a rewrite
(``BGREWRITEAOF``). For each rewrite: the rewrite child's time as Redis's log gives it, and the
p50/p99/max latency of the recalls due in the ``--window-s`` after it was asked, beside the same
figures for the recalls due in the windows just before each rewrite (the baseline of the same
moment of the machine). Needs a running node and Redis holding the corpus
(``fastpath_bench --load-only``) and Redis's log file (``--redis-log``) for the child's times.

    .venv/bin/python -m benchmarks.aof_rewrite_stall --opensearch-url $OS --redis-url $REDIS \\
        --redis-log /path/to/redis/server.log --seconds 96 --every-s 6

This is a benchmark, not a test: it prints figures (benchmarks/README.md). It leaves Redis with
``rdbcompression`` as it found it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec
from loadtest.stats import latency_block

ARMS = ("yes", "no", "no", "yes")  # ABBA, repeated
_CHILD_DONE = re.compile(r"^(\d+):C .*Successfully created the temporary AOF base file")
_STARTED = re.compile(r"^\d+:M .*(\d\d:\d\d:\d\d\.\d+) \* Background append only file rewriting started by pid (\d+)")
_CHILD_TIME = re.compile(r"(\d\d:\d\d:\d\d\.\d+)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--redis-log", type=Path, required=True, help="redis-server's log (the child's times)")
    parser.add_argument("--size", type=int, default=1_000_000, help="the loaded corpus (its namespace)")
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=96.0)
    parser.add_argument("--every-s", type=float, default=6.0, help="a rewrite this often (the first after one period)")
    parser.add_argument("--window-s", type=float, default=1.0, help="the recalls due this long after a rewrite")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


class Rewrites(threading.Thread):
    """Every ``every_s``: ``rdbcompression`` set to the next arm, then ``BGREWRITEAOF``; records
    (perf_counter time, arm, Redis's answer)."""

    def __init__(self, rds: redis.Redis[bytes], every_s: float, count: int):
        super().__init__(daemon=True)
        self.redis, self.every_s, self.count = rds, every_s, count
        self.asked: list[tuple[float, str, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for k in range(self.count):
            if self.stop.wait(self.every_s):
                return
            arm = ARMS[k % len(ARMS)]
            self.redis.config_set("rdbcompression", arm)
            at = time.perf_counter()
            self.asked.append((at, arm, fb.ask_aof_rewrite(self.redis)))  # refused: an automatic one under way


def child_seconds(log: Path, since_line: int) -> list[float]:
    """The rewrite children's times (start to base file written), in order, from Redis's log
    lines after ``since_line``."""
    started: dict[str, str] = {}
    times: list[float] = []
    for line in log.read_text(errors="replace").splitlines()[since_line:]:
        begun = _STARTED.match(line)
        if begun:
            started[begun.group(2)] = begun.group(1)
            continue
        done = _CHILD_DONE.match(line)
        clock = _CHILD_TIME.search(line)
        if done and clock and done.group(1) in started:
            times.append(round(_seconds(clock.group(1)) - _seconds(started.pop(done.group(1))), 3))
    return times


def _seconds(clock: str) -> float:
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def windows(
    answered: list[tuple[float, float]], asked: list[tuple[float, str, str]], window_s: float
) -> list[dict[str, Any]]:
    """Per rewrite: the latencies of the recalls due in the window after it, and in the window
    before it (the baseline)."""
    rows = []
    for at, arm, answer in asked:
        after = [ms for due, ms in answered if at <= due < at + window_s]
        before = [ms for due, ms in answered if at - window_s <= due < at]
        rows.append({"arm": arm, "answer": answer, "after": latency_block(after), "before": latency_block(before)})
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm, over its accepted rewrites: the median of the windows' p99 and max, after and before."""
    out: dict[str, Any] = {}
    for arm in sorted({r["arm"] for r in rows}):
        mine = [r for r in rows if r["arm"] == arm and r["answer"] == "True" and r["after"].get("n")]
        if not mine:
            continue
        children = [r["child_s"] for r in mine if r.get("child_s") is not None]
        out[arm] = {
            "rewrites": len(mine),
            "after_p99_ms": statistics.median(r["after"]["p99_ms"] for r in mine),
            "after_max_ms": statistics.median(r["after"]["max_ms"] for r in mine),
            "before_p99_ms": statistics.median(r["before"]["p99_ms"] for r in mine),
            "child_s": statistics.median(children) if children else None,
        }
    return out


async def paced_with_rewrites(
    api: fb.Api, queries: list[Query], args: argparse.Namespace, rds: redis.Redis[bytes]
) -> tuple[list[tuple[float, float]], list[tuple[float, str, str]], dict[str, int]]:
    total = int(args.rate * args.seconds)
    tally = fb.Tally()
    rewrites = Rewrites(rds, args.every_s, int(args.seconds // args.every_s) - 1)
    async with fb.keepalive_to(api, fb.MAX_IN_FLIGHT) as callers:
        rewrites.start()
        try:
            await fb.open_loop(
                args.rate, total, args.seconds + 10, lambda k, due: tally.send(callers, queries[k % len(queries)], due)
            )
        finally:
            rewrites.stop.set()
            rewrites.join()
    return tally.answered, rewrites.asked, tally.causes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rds = redis.Redis.from_url(args.redis_url)
    found = rds.config_get("rdbcompression")["rdbcompression"]
    calls = fb.parse_args(["--warmup", str(args.warmup), "--seed", str(args.seed), "--paced-s", str(args.seconds)])
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)
    queries = fb.traffic(calls, "sessions", args.size, spec)
    log = Path("/tmp/tenure-fastpath/aof-rewrite-stall-api.log")  # noqa: S108
    api = fb.Api(fb.Variant.parse("main=."), args.opensearch_url, args.redis_url, fb.namespace_of(args.size),
                 args.api_workers, log)  # fmt: skip
    try:
        asyncio.run(fb.prime(api, spec, 4))
        asyncio.run(fb.warm(api, queries[: args.warmup], fb.WARM_LANES))
        api.drain.wait_empty()
        since = len(args.redis_log.read_text(errors="replace").splitlines())
        answered, asked, causes = asyncio.run(paced_with_rewrites(api, queries[args.warmup :], args, rds))
    finally:
        api.stop()
        rds.config_set("rdbcompression", found)
    rows = windows(answered, asked, args.window_s)
    children = child_seconds(args.redis_log, since)
    accepted = [r for r in rows if r["answer"] == "True"]
    for row, child in zip(accepted, children, strict=False):  # an automatic rewrite could be among them
        row["child_s"] = child
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "errors": causes,
        "pass": latency_block([ms for _, ms in answered]),
        "children_logged": len(children),
        "summary": summary(rows),
        "rewrites": rows,
    }
    text = json.dumps(result, indent=2)
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
