"""The floor of one recall over HTTP: its network round trips alone, without any Python of ours.

Issue 16 asks for p50 ≤ 3 ms at 1M beliefs. A recall is a chain of round trips that cannot
overlap: the caller's HTTP request, one Redis round trip (rate limit and tenant write version),
the message's analysis by OpenSearch (``_mtermvectors``: the issue requires OpenSearch's own
analyzers), the search, a read by id when a relation hit brings in its participants, and one Redis
round trip for the injection receipt. This script measures what those round trips cost on this
machine when nothing else runs in between:

1. The real API runs in this process (``service.app.create_app``, every cache as deployed) over
   the loaded corpus and answers ``--warmup`` sessions recalls, then ``--queries`` more while the
   OpenSearch requests each recall sends are recorded as sent (method, path, parameters, body
   bytes), and its Redis round trips are counted.
2. Each recorded recall is replayed: its OpenSearch requests in order over one keep-alive HTTP
   connection (``http.client``), each Redis round trip as a ``PING`` over a raw socket. The sum is
   the recall's floor without the HTTP hop to the API.
3. The HTTP hop: ``GET /healthz`` (no work behind it) of the same app under uvicorn, one worker,
   over one keep-alive connection: what uvicorn, FastAPI and the middleware cost per request.

With ``--opensearch-pid`` and ``--redis-pid`` the replay also reports their CPU per recall (from
``/proc``), and (3) the API process's CPU per request: what a paced rate costs those processes at
the least.

The floor of a recall is (2) plus the p50 of (3). No Python of the recall itself is in it (the
vocabulary matching, decoding, rendering, the OpenSearch and Redis client libraries), so a recall
can never be faster than this on the same machine, whatever the API does. The corpus and accounts
must be loaded already (``fastpath_bench --load-only``); a node started from that state dir
serves them.

    .venv/bin/python -m benchmarks.recall_floor --opensearch-url $OS --redis-url $REDIS

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec
from loadtest.__main__ import CpuMeter
from loadtest.stats import latency_block, percentile

TARGET_P50_MS = 3.0


@dataclass(frozen=True)
class Sent:
    """One OpenSearch request as the API's connection sent it."""

    method: str
    path: str
    body: bytes | None

    @property
    def kind(self) -> str:
        return self.path.split("?", 1)[0].rsplit("/", 1)[-1]

    def tier_searches(self) -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
        """The recall tiers' searches this request carries, as (header, body) pairs (the header
        names the index and the routing): each item of an ``_msearch``, or the one tier searched
        alone as a plain ``_search`` (its body has a ``min_score``: the relevant tier; the
        relation hop's read by id has none). None for any other request."""
        if self.kind == "_msearch":
            lines = [json.loads(line) for line in (self.body or b"").split(b"\n") if line.strip()]
            return list(zip(lines[0::2], lines[1::2], strict=True))
        if self.kind == "_search" and b'"min_score"' in (self.body or b""):
            path, _, query = self.path.partition("?")
            header = {"index": path.strip("/").split("/")[0], **dict(urllib.parse.parse_qsl(query))}
            header.pop("filter_path", None)
            return [(header, json.loads(self.body or b"{}"))]
        return None


@dataclass
class Recorded:
    """The round trips of one recall."""

    opensearch: list[Sent] = field(default_factory=list)
    redis_round_trips: int = 0


def add_recording_arguments(parser: argparse.ArgumentParser) -> None:
    """The servers, the corpus and the recalls to record (shared with ``index_order_ab``)."""
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--size", type=int, default=1_000_000, help="the loaded corpus (its namespace)")
    parser.add_argument("--traffic", choices=("sessions", "random"), default="sessions")
    parser.add_argument("--warmup", type=int, default=3000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_recording_arguments(parser)
    parser.add_argument("--replays", type=int, default=3, help="times each recorded recall is replayed")
    parser.add_argument("--http-calls", type=int, default=3000, help="GET /healthz calls for the HTTP hop")
    parser.add_argument("--opensearch-pid", type=int, default=None, help="for its CPU per replayed recall")
    parser.add_argument("--redis-pid", type=int, default=None, help="for its CPU per replayed recall")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--log", type=Path, default=Path("/tmp/tenure-fastpath/recall-floor-api.log"))  # noqa: S108
    return parser.parse_args(argv)


def app_environment(args: argparse.Namespace) -> dict[str, str]:
    namespace = fb.namespace_of(args.size)
    return {
        "TENURE_OPENSEARCH_URL": args.opensearch_url,
        "TENURE_REDIS_URL": args.redis_url,
        "TENURE_OPENSEARCH_NAMESPACE": namespace,
        "TENURE_AUTH_API_KEY_PEPPER": fb.PEPPER,
        "TENURE_LOOP_COMPACTION_INTERVAL_S": "86400",
        "TENURE_CELERY_QUEUE_PREFIX": namespace,
        "TENURE_OBSERVABILITY_LOG_LEVEL": "WARNING",  # no access log line per recorded recall
    }


@contextmanager
def recording() -> Iterator[list[Recorded]]:
    """Record, per recall, what the API's OpenSearch connection sends and how many Redis round
    trips it makes (the API's own classes, wrapped for the length of the block)."""
    import redis.asyncio.client as redis_client

    from service.storage.client import ObservedAsyncConnection

    recalls: list[Recorded] = []
    send: Any = ObservedAsyncConnection.perform_request
    execute: Any = redis_client.Pipeline.execute
    command: Any = redis_client.Redis.execute_command  # untyped in redis-py

    async def perform_request(self: Any, method: str, url: str, params: Any = None, body: Any = None, **kw: Any) -> Any:
        if recalls:
            query = f"?{urllib.parse.urlencode(params)}" if params else ""
            raw = body.encode() if isinstance(body, str) else body
            recalls[-1].opensearch.append(Sent(method, url + query, raw))
        return await send(self, method, url, params, body, **kw)

    async def pipeline_execute(self: Any, *a: Any, **kw: Any) -> Any:
        if recalls:
            recalls[-1].redis_round_trips += 1
        return await execute(self, *a, **kw)

    async def execute_command(self: Any, *a: Any, **kw: Any) -> Any:
        if recalls:
            recalls[-1].redis_round_trips += 1
        return await command(self, *a, **kw)

    ObservedAsyncConnection.perform_request = perform_request  # type: ignore[method-assign,assignment]
    redis_client.Pipeline.execute = pipeline_execute  # type: ignore[method-assign]
    redis_client.Redis.execute_command = execute_command  # type: ignore[method-assign]
    try:
        yield recalls
    finally:
        ObservedAsyncConnection.perform_request = send  # type: ignore[method-assign]
        redis_client.Pipeline.execute = execute  # type: ignore[method-assign]
        redis_client.Redis.execute_command = command  # type: ignore[method-assign]


def record(args: argparse.Namespace, queries: list[Query]) -> list[Recorded]:
    """Run the warm-up and the recorded recalls through the real API in this process."""
    import httpx
    import uvloop

    os.environ.update(app_environment(args))
    from service.app import create_app

    app = create_app()
    warmup, timed = queries[: args.warmup], queries[args.warmup :]

    async def run() -> list[Recorded]:
        async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                callers = fb.AsyncCallers("http://api", http)
                for q in warmup:
                    await callers.recall(q)
                with recording() as recalls:
                    for q in timed:
                        recalls.append(Recorded())
                        await callers.recall(q)
                    return list(recalls)

    return uvloop.run(run())


class RawRedis:
    """One Redis round trip as bare as it gets: ``PING`` over a raw socket."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def round_trip(self) -> float:
        started = time.perf_counter()
        self.sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        if self.sock.recv(64) != b"+PONG\r\n":
            raise RuntimeError("unexpected answer to PING")
        return time.perf_counter() - started


def replay(args: argparse.Namespace, recalls: list[Recorded]) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Each recall's OpenSearch requests and Redis round trips again, raw, ``--replays`` times;
    times in ms, and the CPU each process spent per replayed recall (with their pids)."""
    parsed = urllib.parse.urlparse(args.opensearch_url.split(",")[0])
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 9200)
    redis = RawRedis(args.redis_url)
    parts: dict[str, list[float]] = {"backend": [], "opensearch": [], "redis": []}
    pids = {"opensearch": [args.opensearch_pid], "redis": [args.redis_pid]}
    meter = CpuMeter(lambda: {name: [p for p in found if p] for name, found in pids.items()})
    meter.begin()
    for _ in range(args.replays):
        for recall in recalls:
            opensearch_ms = 0.0
            for sent in recall.opensearch:
                ms = _send(connection, sent)
                opensearch_ms += ms
                parts.setdefault(f"opensearch {sent.kind}", []).append(ms)
            redis_ms = sum(redis.round_trip() for _ in range(recall.redis_round_trips)) * 1000
            parts["opensearch"].append(opensearch_ms)
            parts["redis"].append(redis_ms)
            parts["backend"].append(opensearch_ms + redis_ms)
    return parts, fb.cpu_per_recall(meter.finish(), max(len(recalls) * args.replays, 1))


def _send(connection: http.client.HTTPConnection, sent: Sent) -> float:
    ndjson = sent.kind in ("_msearch", "_bulk")
    headers = {"Content-Type": "application/x-ndjson" if ndjson else "application/json"}
    started = time.perf_counter()
    connection.request(sent.method, sent.path, body=sent.body, headers=headers)
    response = connection.getresponse()
    response.read()
    elapsed = (time.perf_counter() - started) * 1000
    if response.status >= 300:
        raise RuntimeError(f"{sent.method} {sent.path} answered {response.status}")
    return elapsed


def http_hop(args: argparse.Namespace) -> tuple[list[float], dict[str, Any]]:
    """``GET /healthz`` of the app under uvicorn (one worker): the HTTP hop alone, times in ms,
    and the CPU per call of the API process and of this client."""
    variant = fb.Variant("floor", Path.cwd(), {})
    api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), 1, args.log)
    try:
        parsed = urllib.parse.urlparse(api.url)
        connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80)
        for _ in range(200):  # warm the connection and the worker
            _get(connection, "/healthz")
        meter = CpuMeter(lambda: {"api": api.pids()})
        meter.begin()
        times = [_get(connection, "/healthz") for _ in range(args.http_calls)]
        return times, fb.cpu_per_recall(meter.finish(), max(args.http_calls, 1))
    finally:
        api.stop()


def _get(connection: http.client.HTTPConnection, path: str) -> float:
    started = time.perf_counter()
    connection.request("GET", path)
    connection.getresponse().read()
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    calls = fb.parse_args(["--queries", str(args.queries), "--warmup", str(args.warmup), "--seed", str(args.seed)])
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)
    queries = fb.traffic(calls, args.traffic, args.size, spec)[: args.warmup + args.queries]
    recalls = record(args, queries)
    parts, backend_cpu = replay(args, recalls)
    hop, hop_cpu = http_hop(args)
    hop_p50 = percentile(hop, 50)
    floor = [backend + hop_p50 for backend in parts["backend"]]
    report: dict[str, Any] = {
        "what": "recall_floor",
        "command": "python -m benchmarks.recall_floor " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "loadavg": os.getloadavg(),
        "size": args.size,
        "traffic": args.traffic,
        "recalls": len(recalls),
        "requests_per_recall": {
            "opensearch": round(sum(len(r.opensearch) for r in recalls) / max(len(recalls), 1), 2),
            "redis": round(sum(r.redis_round_trips for r in recalls) / max(len(recalls), 1), 2),
        },
        "http_hop": latency_block(hop),
        "http_hop_cpu_ms": hop_cpu,
        "backend_cpu_ms_per_recall": backend_cpu,
        "parts": {name: latency_block(values) for name, values in sorted(parts.items())},
        "floor": latency_block(floor),
        "target_p50_ms": TARGET_P50_MS,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
