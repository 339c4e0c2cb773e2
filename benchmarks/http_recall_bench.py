"""Latency of ``POST /v1/recall`` over HTTP against a running service (not a test).

Usage: python -m benchmarks.http_recall_bench --url http://127.0.0.1:8000 --key tnr_... \
           --scopes project:payments --query "can we use sticky sessions?" [-n 500]
Run it against a deployment started with the rate limit off (TENURE_API_RATE_LIMIT_PER_S=0) or high
enough for the request rate. Every call also writes its injection receipt to the audit index,
synchronously, which is part of what is measured. Calls go through the Python SDK
(``tenure_client``, retries off: a 429 or 503 stops the run), so a timing includes the SDK's
reading of the answer into its typed model.
"""

from __future__ import annotations

import argparse
import os
import time

from tenure_client import Tenure

from loadtest.stats import latency_block


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", required=True)
    parser.add_argument("--scopes", default="project:payments", help="comma-separated")
    parser.add_argument("--query", default="can we just use sticky sessions behind the load balancer?")
    parser.add_argument("-n", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args(argv)
    scopes = args.scopes.split(",")
    with Tenure(args.url, args.key, session_id="http-bench", max_retries=0) as tenure:
        for _ in range(args.warmup):
            tenure.recall(args.query, scopes=scopes)
        timings: list[float] = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            tenure.recall(args.query, scopes=scopes)
            timings.append((time.perf_counter() - t0) * 1000)
    block = latency_block(timings)
    print(
        f"POST /v1/recall n={args.n} p50 {block['p50_ms']:.1f} ms p95 {block['p95_ms']:.1f} ms "
        f"p99 {block['p99_ms']:.1f} ms (load average {os.getloadavg()[0]:.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
