"""Latency of ``POST /v1/recall`` over HTTP against a running service (not a test).

Usage: python -m benchmarks.http_recall_bench --url http://127.0.0.1:8000 --key tnr_... \
           --scopes project:payments --query "can we use sticky sessions?" [-n 500]
Run it against a deployment started with the rate limit off (TENURE_API_RATE_LIMIT_PER_S=0) or high
enough for the request rate. Every call also writes its injection receipt to the audit index,
synchronously, which is part of what is measured.
"""

from __future__ import annotations

import argparse
import os
import time

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", required=True)
    parser.add_argument("--scopes", default="project:payments", help="comma-separated")
    parser.add_argument("--query", default="can we just use sticky sessions behind the load balancer?")
    parser.add_argument("-n", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args(argv)
    body = {"scopes": args.scopes.split(","), "query": args.query, "session_id": "http-bench"}
    with httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {args.key}"}) as client:
        for _ in range(args.warmup):
            client.post("/v1/recall", json=body).raise_for_status()
        timings: list[float] = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            client.post("/v1/recall", json=body).raise_for_status()
            timings.append((time.perf_counter() - t0) * 1000)
    timings.sort()

    def pct(q: float) -> float:
        return timings[min(len(timings) - 1, int(q / 100 * len(timings)))]

    print(
        f"POST /v1/recall n={args.n} p50 {pct(50):.1f} ms p95 {pct(95):.1f} ms p99 {pct(99):.1f} ms "
        f"(load average {os.getloadavg()[0]:.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
