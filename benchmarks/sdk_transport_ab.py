"""The SDK's cost per recall over its transports, against the real API at the loaded corpus:
the synchronous client over httpx's default transport and over
``tenure_client.keepalive.KeepAliveSyncTransport``, the async client over httpx's default
transport and over ``tenure_client.keepalive.KeepAliveTransport``; over the keep-alive transports
both through an ``httpx`` client passed in (``*-keepalive``) and given the transport itself, which
the SDK then calls directly (``*-direct``; the SDK clients of one kind share one transport).

One API (``--api-workers``, the source tree of the one ``--variant``) against the corpus ``fastpath_bench --load-only``
loaded; every tenant primed; then ``--blocks`` blocks of ``--block`` sequential session recalls,
the clients taking turns block by block (so the machine's drift falls on all of them), each
caller with its own API key as in ``fastpath_bench``. Per client: the client process's CPU per
recall (it runs only the client, the API and the node run elsewhere) and the latency p50 / p99.
``--answers typed`` reads answers into the SDK's models (``recall``) instead of decoded JSON
(``recall_json``, the default).

Then the SDK's reading of an answer alone: ``--decode-sample`` real answers (their bytes, as the
API sent them for session recalls) read in process by the SDK's way (pydantic's JSON parser from
the bytes: :class:`tenure_client._calls.Parser`) and by the way before it (the stdlib ``json``, then
validation of the decoded data), alternating, in µs per answer.

    .venv/bin/python -m benchmarks.sdk_transport_ab --opensearch-url $OS --redis-url $REDIS --variant main=.

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from tenure_client import AsyncTenure, Tenure
from tenure_client import _calls as calls
from tenure_client.keepalive import KeepAliveSyncTransport, KeepAliveTransport

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec
from loadtest.stats import latency_block

CLIENTS = ("sync", "sync-keepalive", "sync-direct", "async-httpx", "async-keepalive", "async-direct")
SYNC = ("sync", "sync-keepalive", "sync-direct")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = fb.running_node_parser(__doc__)
    parser.add_argument("--api-workers", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1500)
    parser.add_argument("--block", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=12, help="blocks per client")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--answers", choices=("json", "typed"), default="json")
    parser.add_argument("--decode-sample", type=int, default=500, help="answers for the decoding comparison; 0: none")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if len(args.variant) != 1:
        parser.error("one --variant: the API the clients call")
    return args


class _Turns:
    """The clients, each with one SDK client per (tenant, user) over its own connection."""

    def __init__(self, url: str, typed: bool = False):
        self.url = url
        self.typed = typed
        self.sync_http = httpx.Client(base_url=url, timeout=fb.TIMEOUT_S)
        self.sync_lean_http = httpx.Client(base_url=url, timeout=fb.TIMEOUT_S, transport=KeepAliveSyncTransport())
        self.async_http = httpx.AsyncClient(base_url=url, timeout=fb.TIMEOUT_S)
        self.lean_http = httpx.AsyncClient(base_url=url, timeout=fb.TIMEOUT_S, transport=KeepAliveTransport())
        self.sync_direct = KeepAliveSyncTransport()
        self.async_direct = KeepAliveTransport()
        self.sdk: dict[tuple[str, str, str], Any] = {}

    def _client(self, kind: str, q: Query) -> Any:
        who = (kind, q.principal.tenant_id, q.principal.user_id)
        if who not in self.sdk:
            key = fb.key_of(q.principal.tenant_id, q.principal.user_id)[1]
            if kind == "sync-direct":
                self.sdk[who] = Tenure(self.url, key, timeout=fb.TIMEOUT_S, transport=self.sync_direct, max_retries=0)
            elif kind == "async-direct":
                self.sdk[who] = AsyncTenure(
                    self.url, key, timeout=fb.TIMEOUT_S, transport=self.async_direct, max_retries=0
                )
            elif kind in SYNC:
                http_client = self.sync_http if kind == "sync" else self.sync_lean_http
                self.sdk[who] = Tenure(self.url, key, http_client=http_client, max_retries=0)
            else:
                http = self.async_http if kind == "async-httpx" else self.lean_http
                self.sdk[who] = AsyncTenure(self.url, key, http_client=http, max_retries=0)
        return self.sdk[who]

    async def block(self, kind: str, queries: list[Query]) -> tuple[float, list[float]]:
        """CPU seconds and latencies (ms) of ``queries`` sent one after the other by ``kind``."""
        timings: list[float] = []
        cpu0 = time.process_time()
        for q in queries:
            client = self._client(kind, q)
            t0 = time.perf_counter()
            send = client.recall if self.typed else client.recall_json
            if kind in SYNC:
                send(q.message, scopes=q.scopes)
            else:
                await send(q.message, scopes=q.scopes)
            timings.append((time.perf_counter() - t0) * 1000)
        return time.process_time() - cpu0, timings

    async def aclose(self) -> None:
        self.sync_http.close()
        self.sync_lean_http.close()
        await self.async_http.aclose()
        await self.lean_http.aclose()
        self.sync_direct.close()
        await self.async_direct.aclose()


async def _measure(turns: _Turns, args: argparse.Namespace, queries: list[Query]) -> dict[str, Any]:
    cpu = dict.fromkeys(CLIENTS, 0.0)
    timings: dict[str, list[float]] = {kind: [] for kind in CLIENTS}
    warmup, measured = queries[: args.warmup], queries[args.warmup :]
    for i, kind in enumerate(CLIENTS * (args.warmup // (len(CLIENTS) * args.block) + 1)):
        await turns.block(kind, warmup[i * args.block : (i + 1) * args.block])
    for b in range(args.blocks * len(CLIENTS)):
        kind = CLIENTS[(b + b // len(CLIENTS)) % len(CLIENTS)]  # rotating order: no client always first
        spent, took = await turns.block(kind, measured[b * args.block : (b + 1) * args.block])
        cpu[kind] += spent
        timings[kind].extend(took)
    return {
        kind: {"client_cpu_ms_per_recall": round(cpu[kind] * 1000 / len(took), 3), **latency_block(took)}
        for kind, took in timings.items()
    }


def _answers(url: str, queries: list[Query]) -> list[bytes]:
    """The answers' bytes as the API sends them (through the SDK, each caller's own key; an httpx
    response hook keeps each body before the SDK reads it)."""
    kept: list[bytes] = []

    def keep(response: httpx.Response) -> None:
        kept.append(response.read())

    with httpx.Client(base_url=url, timeout=fb.TIMEOUT_S, event_hooks={"response": [keep]}) as http:
        for q in queries:
            key = fb.key_of(q.principal.tenant_id, q.principal.user_id)[1]
            Tenure(url, key, http_client=http, max_retries=0).recall_json(q.message, scopes=q.scopes)
    return kept


def decode_costs(answers: list[bytes], rounds: int = 6) -> dict[str, Any]:
    """µs per answer of each reading, the median over ``rounds`` alternating passes (every
    reading gives the same result: checked on the first pass)."""
    readings: dict[str, Callable[[bytes], Any]] = {
        "json: stdlib json.loads": json.loads,
        "json: Parser (pydantic_core.from_json)": calls.raw.from_bytes,
        "typed: stdlib json.loads + model_validate": lambda b: calls.recall_out(json.loads(b)),
        "typed: Parser (model_validate_json)": calls.recall_out.from_bytes,
    }
    for answer in answers:
        assert readings["json: stdlib json.loads"](answer) == readings["json: Parser (pydantic_core.from_json)"](answer)
        assert readings["typed: stdlib json.loads + model_validate"](answer) == calls.recall_out.from_bytes(answer)
    spent: dict[str, list[float]] = {name: [] for name in readings}
    for r in range(rounds):
        for name in list(readings)[:: 1 if r % 2 == 0 else -1]:
            read = readings[name]
            t0 = time.perf_counter()
            for answer in answers:
                read(answer)
            spent[name].append((time.perf_counter() - t0) * 1e6 / len(answers))
    sizes = sorted(len(a) for a in answers)
    return {
        "answers": len(answers),
        "bytes_p50": sizes[len(sizes) // 2],
        "bytes_max": sizes[-1],
        "us_per_answer": {name: round(statistics.median(v), 1) for name, v in spent.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = Spec(tenants=1000, users_per_tenant=5)  # fastpath_bench's corpus
    calls = fb.parse_args(["--queries", str(args.block * args.blocks * len(CLIENTS)), "--warmup", str(args.warmup),
                           "--seed", str(args.seed)])  # fmt: skip
    queries = fb.traffic(calls, "sessions", args.size, spec)
    variant = fb.Variant.parse(args.variant[0])
    log = Path(tempfile.gettempdir()) / "sdk-transport-ab.log"
    api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), args.api_workers, log)
    try:
        asyncio.run(fb.prime(api, spec, 4))

        async def run() -> dict[str, Any]:
            turns = _Turns(api.url, typed=args.answers == "typed")
            try:
                return await _measure(turns, args, queries)
            finally:
                await turns.aclose()

        figures = asyncio.run(run())
        decoding = decode_costs(_answers(api.url, queries[: args.decode_sample])) if args.decode_sample else None
    finally:
        api.stop()
    for kind, row in figures.items():
        print(json.dumps({"client": kind, **row}), flush=True)
    if decoding:
        print(json.dumps({"decoding": decoding}), flush=True)
    if args.out:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "figures": figures, "decoding": decoding}
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
