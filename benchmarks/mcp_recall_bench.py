"""MCP recall overhead: the ``recall`` tool over streamable HTTP (``/mcp``) against ``POST /v1/recall``
on the same deployment, the same corpus, the same caller and query (not a test).

    .venv/bin/python -m benchmarks.mcp_recall_bench [--beliefs 2000] [-n 300] [--out benchmarks/results/mcp.json]

Starts its own stack (``deploy/localstack``: OpenSearch, Redis, uvicorn with 1 worker; no Celery
needed), seeds one tenant through the SDK, then alternates the two calls so both see the same
machine load. The MCP side uses the official SDK's client on one connection; each tool call is one
HTTP POST that the server executes as an in-process REST call of the caller's credential.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from tenure_client import Tenure, chunked

from deploy.localstack import LocalStack, StackConfig

QUERY = "can we just use sticky sessions behind the load balancer? what about the redis session cache?"
SCOPES = ["project:payments"]


def _seed(url: str, operator: str, beliefs: int) -> str:
    tenant = f"mcp-bench-{os.getpid()}"
    with Tenure(url, operator) as op:
        op.admin.create_tenant(tenant)
        op.admin.create_user(tenant, "dev", projects=["payments"])
        key = op.admin.issue_key(tenant, "dev").key
    records: list[dict[str, Any]] = [
        {
            "type": "decision",
            "canonical_name": f"topic_{i}_{'abcdefghij'[i % 10]}",
            "aliases": [f"alias {i} {'klmnopqrst'[i % 10]}"],
            "content": f"Decision number {i}.",
            "why_it_matters": "Background corpus.",
            "scope": SCOPES,
        }
        for i in range(beliefs)
    ]
    records += [
        {
            "type": "decision",
            "canonical_name": "session_cache",
            "aliases": ["redis session cache", "sticky sessions"],
            "content": "Sessions live in Redis; no sticky sessions.",
            "why_it_matters": "Never add sticky sessions.",
            "scope": SCOPES,
        }
    ]
    with Tenure(url, key) as dev:
        for batch in chunked(records):
            dev.beliefs.import_(batch)
    return key


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def _measure(url: str, key: str, n: int, warmup: int) -> dict[str, list[float]]:
    rest_body = {"scopes": SCOPES, "query": QUERY, "session_id": "mcp-bench-rest"}
    tool_args = {"query": QUERY, "scopes": SCOPES, "session_id": "mcp-bench-mcp"}
    timings: dict[str, list[float]] = {"rest": [], "mcp": []}
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as rest:
        mcp_http = httpx2.AsyncClient(headers=headers, timeout=30)
        async with Client(streamable_http_client(f"{url}/mcp", http_client=mcp_http), cache=None) as mcp:
            expected: list[str] | None = None
            for i in range(warmup + n):
                t0 = time.perf_counter()
                response = await rest.post("/v1/recall", json=rest_body)
                response.raise_for_status()
                t1 = time.perf_counter()
                result = await mcp.call_tool("recall", tool_args)
                t2 = time.perf_counter()
                if result.is_error or not result.structured_content:
                    raise RuntimeError(f"MCP recall failed: {result.content}")
                ids = result.structured_content["injected_ids"]
                if expected is None:
                    expected = response.json()["injected_ids"]
                if ids != expected:  # same corpus, same answer, or the comparison means nothing
                    raise RuntimeError(f"MCP and REST disagree: {ids} != {expected}")
                if i >= warmup:
                    timings["rest"].append((t1 - t0) * 1000)
                    timings["mcp"].append((t2 - t1) * 1000)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--beliefs", type=int, default=2000)
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as root:
        config = StackConfig(
            root=Path(root), api_workers=1, with_llm=False, with_worker=False, with_beat=False, opensearch_heap="1g"
        )
        with LocalStack(config) as stack:
            key = _seed(stack.api_url, stack.operator_key(), args.beliefs)
            timings = anyio.run(_measure, stack.api_url, key, args.n, args.warmup)
    summary: dict[str, Any] = {
        "beliefs": args.beliefs + 1,
        "n": args.n,
        "load_average": os.getloadavg()[0],
    }
    for name, values in timings.items():
        summary[name] = {
            "p50_ms": round(_pct(values, 50), 2),
            "p95_ms": round(_pct(values, 95), 2),
            "p99_ms": round(_pct(values, 99), 2),
            "mean_ms": round(statistics.fmean(values), 2),
        }
    summary["overhead_p50_ms"] = round(summary["mcp"]["p50_ms"] - summary["rest"]["p50_ms"], 2)
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
