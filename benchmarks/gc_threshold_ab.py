"""The API's CPU per recall under two generation-0 GC thresholds, or without and with the paced
collector, in one process (the figures behind ``TENURE_GC_YOUNG_THRESHOLD`` and
``TENURE_GC_COLLECT_INTERVAL_S``, service/process.py).

Over HTTP a few percent of the API's CPU is inside this machine's drift between runs, so the A/B
runs in process: the real app (its lifespan, every cache as deployed) is called through httpx's
ASGI transport, every tenant primed, ``--warmup`` session recalls untimed, then ``--blocks``
blocks of ``--block`` recalls, each block under one threshold in ABBA order (so drift and the
blocks' contents fall on both). With ``--collect-interval-s``, A is CPython's collections alone
and B adds a :class:`~service.process.PacedCollector` at that interval for the block (its
thread's CPU is the process's too). Process CPU covers the app and the in-process client; OpenSearch
and Redis run elsewhere. The corpus must already be loaded (``fastpath_bench --load-only``).

    .venv/bin/python -m benchmarks.gc_threshold_ab --opensearch-url $OS --redis-url $REDIS \\
        --thresholds 700,20000
    .venv/bin/python -m benchmarks.gc_threshold_ab --opensearch-url $OS --redis-url $REDIS \\
        --collect-interval-s 1 --block 1000 --blocks 16

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import time
from typing import Any

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec
from benchmarks.recall_floor import app_environment
from service.domain.principal import Principal
from service.process import PacedCollector


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--size", type=int, default=1_000_000, help="the loaded corpus (its namespace)")
    parser.add_argument("--thresholds", default="700,20000", help="two generation-0 thresholds, A,B")
    parser.add_argument("--warmup", type=int, default=3000)
    parser.add_argument("--block", type=int, default=250)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--collect-interval-s", type=float, default=0.0,
                        help="compare without (A) and with (B) the paced collector instead of thresholds")  # fmt: skip
    return parser.parse_args(argv)


def _configure(args: argparse.Namespace) -> None:
    os.environ.update(
        {
            **app_environment(args),  # recall_floor's in-process app: same corpus, same accounts
            # the blocks set the threshold, or start the paced collector (at the deployed threshold)
            **({} if args.collect_interval_s > 0 else {"TENURE_GC_YOUNG_THRESHOLD": "0"}),
            "TENURE_GC_COLLECT_INTERVAL_S": "0",
        }
    )


async def _measure(args: argparse.Namespace, thresholds: tuple[int, int]) -> dict[int, list[float]]:
    import httpx

    from service.app import create_app

    calls = fb.parse_args(
        ["--queries", str(args.block * args.blocks), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    )
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)
    queries = fb.traffic(calls, "sessions", args.size, spec)
    cpu: dict[int, list[float]] = {t: [] for t in thresholds}
    app = create_app()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            callers = fb.AsyncCallers("http://bench", http)
            for tenant in range(spec.tenants):
                principal = Principal(tenant_id=f"t{tenant:04d}", user_id="u0")
                await callers.recall(Query("prime", principal, ["domain:code"], "hello there"))
            for query in queries[: args.warmup]:
                await callers.recall(query)
            for block in range(args.blocks):
                threshold = thresholds[(block + block // 2) % 2]  # A B B A A B B A ...
                collector = None
                if args.collect_interval_s > 0:
                    if threshold == thresholds[1]:
                        collector = PacedCollector(args.collect_interval_s).start()
                else:
                    gc.set_threshold(threshold, *gc.get_threshold()[1:])
                start = args.warmup + block * args.block
                t0 = time.process_time()
                for query in queries[start : start + args.block]:
                    await callers.recall(query)
                cpu[threshold].append((time.process_time() - t0) / args.block * 1000)
                if collector is not None:
                    collector.stop()
    return cpu


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    a, b = (0, 1) if args.collect_interval_s > 0 else (int(t) for t in args.thresholds.split(","))
    _configure(args)
    cpu = asyncio.run(_measure(args, (a, b)))
    summary: dict[str, Any] = {
        str(t): {
            "blocks": len(rows),
            "cpu_ms_per_recall_mean": round(statistics.mean(rows), 3),
            "per_block": [round(r, 2) for r in rows],
        }
        for t, rows in cpu.items()
    }
    summary["b_over_a"] = round(statistics.mean(cpu[b]) / statistics.mean(cpu[a]), 3)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
