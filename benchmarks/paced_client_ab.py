"""What the paced run's client costs: one httpx pool of 64 connections, :class:`~loadtest.http.LaneTransport`
and the SDK's ``KeepAliveTransport``, alternating on one API over the 1M corpus.

``fastpath_bench``'s paced phase (open loop, at most 64 in flight) is run several times at one
rate, the clients (``--clients``) taking turns on the same API processes, each round on calls no round sent
before. For each run: what was served, latency from the due time, the requests shed, and the CPU
per served recall of the API, OpenSearch and the client itself (``/proc``). Needs a running node
and Redis holding ``fastpath_bench``'s 1M corpus (``--load-only``).

    python -m benchmarks.paced_client_ab --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --rate 150 --rounds 3 --clients lanes,keepalive
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Spec, draw_sessions
from loadtest.__main__ import CpuMeter


@contextlib.asynccontextmanager
async def shared_pool_to(api: fb.Api, connections: int) -> AsyncIterator[fb.AsyncCallers]:
    """The paced run's client before 2026-12-02: one httpx pool of ``connections``."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(timeout=fb.TIMEOUT_S, limits=limits) as http:
        yield fb.AsyncCallers(api.url, http)


CLIENTS: dict[str, fb.Connect] = {"shared-pool": shared_pool_to, "lanes": fb.lanes_to, "keepalive": fb.keepalive_to}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--opensearch-pid", type=int, required=True)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="shared-pool,lanes", help=f"which to compare, of {', '.join(CLIENTS)}")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    clients = args.clients.split(",")
    if unknown := set(clients) - set(CLIENTS):
        parser.error(f"unknown clients: {', '.join(sorted(unknown))}")
    spec = Spec(tenants=1000, users_per_tenant=5)
    calls_per_run = int(args.rate * args.seconds)
    runs = len(clients) * args.rounds
    calls = draw_sessions(3000 + runs * calls_per_run, 1_000_000, spec, fb.NOW, seed=21, length=10, active=64)
    log = Path("/tmp/tenure-paced-client-ab.log")  # noqa: S108
    api = fb.Api(fb.Variant.parse("main=."), args.opensearch_url, args.redis_url, fb.namespace_of(1_000_000), 2, log)
    meter = CpuMeter(lambda: {"opensearch": [args.opensearch_pid], "api": api.pids()})
    rows = []
    try:
        asyncio.run(fb.prime(api, spec, 4))
        fb.sequential(api, calls[:3000], 0, None)
        start = 3000
        for r in range(args.rounds):
            order = clients if r % 2 == 0 else list(reversed(clients))
            for name in order:
                batch = calls[start : start + calls_per_run]
                start += calls_per_run
                meter.begin()
                result = asyncio.run(fb.paced(api, batch, args.rate, args.seconds, 10.0, connect=CLIENTS[name]))
                used = meter.finish()
                fb.drain(api, batch[0])
                row = {
                    "round": r + 1,
                    "client": name,
                    "served": result["n"],
                    "achieved_per_s": result["achieved_per_s"],
                    "p50_ms": result.get("p50_ms"),
                    "p99_ms": result.get("p99_ms"),
                    "errors": result["error_causes"],
                    "cpu_ms_per_served": fb.cpu_per_recall(used, max(result["n"], 1)),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        api.stop()
    if args.out:
        args.out.write_text(json.dumps({"rate": args.rate, "seconds": args.seconds, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
