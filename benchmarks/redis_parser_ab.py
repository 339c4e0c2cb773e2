"""redis-py's answer parsers on the API's Redis round trip: the pure-Python one against hiredis's.

Every recall makes two Redis round trips through redis-py's asyncio client: the rate-limit
pipeline (``EVALSHA`` of the token-bucket script with the tenant's versions read alongside) and the
receipt. redis-py parses answers with hiredis (C) when it is installed, which the service's
dependencies now ask for (``redis[hiredis]``). This script times the rate-limit round trip's shape
with each parser forced (``parser_class``), one client each, in ``--rounds`` rounds of
``--calls`` pipelines alternating in order, on uvloop: this process's CPU per pipeline, the
median over rounds, and how many rounds the hiredis client was cheaper in.

    .venv/bin/python -m benchmarks.redis_parser_ab --redis-url $REDIS   # or none: its own redis-server

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import redis.asyncio as aredis
import uvloop
from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser

from deploy.devstack import start_redis
from service.auth.ratelimit import BUCKET_SCRIPT

PARSERS: dict[str, Any] = {"python": _AsyncRESP2Parser, "hiredis": _AsyncHiredisParser}


def redis_ab_parser(doc: str | None, *, rounds: int, calls_help: str) -> argparse.ArgumentParser:
    """The arguments :func:`run_on_redis` reads: ``--redis-url``, ``--rounds``, ``--calls``, ``--out``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--redis-url", help="a running Redis (default: start one)")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--calls", type=int, default=3000, help=calls_help)
    parser.add_argument("--out", type=Path)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return redis_ab_parser(__doc__, rounds=10, calls_help="pipelines per round and parser").parse_args(argv)


async def _pipeline(client: aredis.Redis[bytes], sha: str, i: int) -> list[Any]:
    """The rate limit's round trip: one bucket's script, two version reads."""
    pipe = client.pipeline(transaction=False)
    pipe.evalsha(sha, 1, f"parser-ab:bucket:{i % 50}", 1000.0, 2000)
    pipe.get("parser-ab:version:beliefs")
    pipe.get("parser-ab:version:accounts")
    answers: list[Any] = await pipe.execute(raise_on_error=False)
    return answers


async def measure(url: str, rounds: int, calls: int) -> dict[str, Any]:
    clients: dict[str, aredis.Redis[bytes]] = {
        name: aredis.Redis(connection_pool=aredis.ConnectionPool.from_url(url, parser_class=cls))
        for name, cls in PARSERS.items()
    }
    try:
        sha = await clients["python"].script_load(BUCKET_SCRIPT)  # type: ignore[no-untyped-call]
        answers = [await _pipeline(client, sha, 0) for client in clients.values()]
        if answers[0][1:] != answers[1][1:] or len(answers[0]) != len(answers[1]):
            raise RuntimeError(f"the parsers answered differently: {answers}")
        for client in clients.values():  # warm-up
            for i in range(calls // 2):
                await _pipeline(client, sha, i)
        spent: dict[str, list[float]] = {name: [] for name in clients}
        for r in range(rounds):
            for name in list(clients)[:: 1 if r % 2 == 0 else -1]:
                started = time.process_time()
                for i in range(calls):
                    await _pipeline(clients[name], sha, i)
                spent[name].append((time.process_time() - started) * 1e6 / calls)
    finally:
        for client in clients.values():
            await client.aclose()  # type: ignore[attr-defined]  # redis-py 5+: the stubs predate it
    return {
        "cpu_us_per_pipeline": {name: round(statistics.median(v), 1) for name, v in spent.items()},
        "by_round": {name: [round(x, 1) for x in v] for name, v in spent.items()},
        "hiredis_cheaper_rounds": sum(h < p for h, p in zip(spent["hiredis"], spent["python"], strict=True)),
        "rounds": rounds,
    }


Measure = Callable[[str, int, int], Coroutine[Any, Any, dict[str, Any]]]


def run_on_redis(measure_rounds: Measure, args: argparse.Namespace, prefix: str) -> int:
    """``measure_rounds(url, rounds, calls)`` on uvloop against ``--redis-url`` or a
    ``redis-server`` of its own (its directory named ``prefix...``); prints the figures and
    writes them to ``--out``."""
    owned = None if args.redis_url else start_redis(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        url = args.redis_url or owned.url  # type: ignore[union-attr]
        figures: dict[str, Any] = uvloop.run(measure_rounds(url, args.rounds, args.calls))
    finally:
        if owned is not None:
            owned.stop()
    print(json.dumps(figures), flush=True)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_on_redis(measure, parse_args(argv), "parser-ab-")


if __name__ == "__main__":
    raise SystemExit(main())
