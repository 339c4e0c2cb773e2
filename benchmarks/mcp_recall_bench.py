"""MCP recall overhead: the ``recall`` tool over streamable HTTP (``/mcp``) against ``POST /v1/recall``
on the same deployment, the same corpus, the same caller and query (not a test).

    .venv/bin/python -m benchmarks.mcp_recall_bench [--beliefs 2000] [-n 300] [--out benchmarks/results/mcp.json]

Starts its own stack (``deploy/localstack``: OpenSearch, Redis, uvicorn with 1 worker; no Celery
needed), seeds one tenant through the SDK, then alternates the two calls so both see the same
machine load. The REST side is the Python SDK (``tenure_client``, retries off), the MCP side the
official MCP SDK's client, each on one connection: both timings include their client's reading of
the answer. Each tool call is one HTTP POST that the server executes as an in-process REST call of
the caller's credential.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from tenure_client import AsyncTenure, Tenure, chunked

from deploy.localstack import LocalStack, StackConfig
from loadtest.stats import latency_block

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


async def _measure(url: str, key: str, n: int, warmup: int) -> dict[str, list[float]]:
    tool_args = {"query": QUERY, "scopes": SCOPES, "session_id": "mcp-bench-mcp"}
    timings: dict[str, list[float]] = {"rest": [], "mcp": []}
    headers = {"Authorization": f"Bearer {key}"}
    async with AsyncTenure(url, key, timeout=30, session_id="mcp-bench-rest", max_retries=0) as rest:
        mcp_http = httpx2.AsyncClient(headers=headers, timeout=30)
        async with Client(streamable_http_client(f"{url}/mcp", http_client=mcp_http), cache=None) as mcp:
            expected: list[str] | None = None
            for i in range(warmup + n):
                t0 = time.perf_counter()
                answer = await rest.recall(QUERY, scopes=SCOPES)
                t1 = time.perf_counter()
                result = await mcp.call_tool("recall", tool_args)
                t2 = time.perf_counter()
                if result.is_error or not result.structured_content:
                    raise RuntimeError(f"MCP recall failed: {result.content}")
                ids = result.structured_content["injected_ids"]
                if expected is None:
                    expected = answer.injected_ids
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
        block = latency_block(values, with_mean=True)
        summary[name] = {key: block[key] for key in ("p50_ms", "p95_ms", "p99_ms", "mean_ms")}
    summary["overhead_p50_ms"] = round(summary["mcp"]["p50_ms"] - summary["rest"]["p50_ms"], 2)
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
