"""Where a recall's API time goes: the API's CPU per request by kind of request, for one or more
source trees at once.

``fastpath_bench`` gives a recall's CPU over all processes; this splits the API's share by what the
request asks, over the loaded corpus (``fastpath_bench --load-only``), one uvicorn worker per
variant:

- ``healthz``: ``GET /healthz``, no work behind it: uvicorn, the middleware and the router;
- ``empty``: a recall with an empty message: authentication, the rate limit and write version
  (one Redis round trip), the filter tiers (from the tier cache once warm), the block, the receipt
  (one Redis round trip) and the response;
- ``short`` / ``long``: a sessions recall whose message has fewer than 20 / at least 60 words: all
  of the above plus relevance (the analysis round trip, vocabulary matching, the search, decoding
  the hits);
- ``new-scopes``: a recall with an empty message in a scope list never used before (a sub-domain
  of ``domain:code`` named by a counter): its pinned facts and open questions are searched (no
  cache entry can hold them); its persona is the user's (cached apart from the scope list since
  2026-12-05, when the user recalled before).

With ``--opensearch-pid`` the node's CPU over each block is read too (per recall, beside the
API's); the node serves the variants' blocks one at a time, so only a drain's late receipts blur it.

Every ``--variant`` (``fastpath_bench``'s ``name=path[:VAR=value,...]``) runs at the same time in
its own API process, primed (every tenant's vocabulary built) and warmed; then blocks of each kind
go to each variant in turn, the order reversed every block, over one keep-alive ``http.client``
connection per variant (no client library in the API's figures). A variant's CPU is read from
``/proc`` before and after each of its blocks, so the machine's drift (its speed varies by tens of
percent within minutes) falls on every variant and kind alike.

    .venv/bin/python -m benchmarks.recall_cost_split --opensearch-url $OS --redis-url $REDIS \\
        --variant main=. [--variant other=/path/to/tree:VAR=value]

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec, draw_sessions
from loadtest.__main__ import process_cpu_s

SHORT_WORDS, LONG_WORDS = 20, 60
KINDS = ("healthz", "empty", "short", "long", "new-scopes")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = fb.running_node_parser(__doc__)
    parser.add_argument("--warmup", type=int, default=3000, help="untimed sessions recalls per variant")
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each kind per variant")
    parser.add_argument("--block", type=int, default=500, help="requests per block")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/tenure-fastpath"))  # noqa: S108
    parser.add_argument("--opensearch-pid", type=int, help="the node's process: its CPU per recall too")
    return parser.parse_args(argv)


def latency_row(latencies_ms: list[float]) -> dict[str, float | int]:
    """The count, p50 and p99 of a series of sequential timings (the rows of these benchmarks)."""
    timings = sorted(latencies_ms)
    n = len(timings)
    return {"n": n, "p50_ms": round(timings[n // 2], 2), "p99_ms": round(timings[min(n - 1, int(n * 0.99))], 2)}


@dataclass
class Measured:
    """One variant's timings and API CPU, per kind."""

    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    node_cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def row(self, kind: str, *, node: bool) -> dict[str, float | int]:
        n = len(self.latencies_ms[kind])
        row = {**latency_row(self.latencies_ms[kind]), "api_cpu_ms": round(self.cpu_s[kind] * 1000 / n, 2)}
        return {**row, "node_cpu_ms": round(self.node_cpu_s[kind] * 1000 / n, 2)} if node else row


class Caller:
    """One keep-alive connection to one variant's API."""

    def __init__(self, api: fb.Api):
        host, port = api.url.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=30)
        self.connection.connect()
        assert self.connection.sock is not None
        self.connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.worker = api.first_worker()
        self.scope_lists = itertools.count()  # names no scope list sent before on this connection

    def send(self, method: str, path: str, body: bytes | None = None, key: str | None = None) -> None:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")

    def recall(self, query: Query, message: str) -> None:
        body = orjson.dumps({"scopes": query.scopes, "query": message})
        self.send("POST", "/v1/recall", body, fb.key_of(query.principal.tenant_id, query.principal.user_id)[1])


def requests_of(kind: str, caller: Caller) -> Callable[[Query], None]:
    if kind == "healthz":
        return lambda _query: caller.send("GET", "/healthz")
    if kind == "empty":
        return lambda query: caller.recall(query, "")
    if kind == "new-scopes":
        return lambda query: caller.recall(replace(query, scopes=[f"domain:code/s{next(caller.scope_lists)}"]), "")
    return lambda query: caller.recall(query, query.message)


def blocks_of(queries: list[Query], args: argparse.Namespace) -> dict[str, list[list[Query]]]:
    """Each kind's blocks: every kind but ``long`` over the same queries; ``short`` and ``long``
    from their messages' lengths (cycled when there are too few)."""
    short = [q for q in queries if len(q.message.split()) < SHORT_WORDS]
    long = [q for q in queries if len(q.message.split()) >= LONG_WORDS]

    def cut(pool: list[Query]) -> list[list[Query]]:
        repeated = pool * (args.blocks * args.block // max(1, len(pool)) + 1)
        return [repeated[b * args.block : (b + 1) * args.block] for b in range(args.blocks)]

    same = cut(queries)
    return {"healthz": same, "empty": same, "short": cut(short), "long": cut(long), "new-scopes": same}


@contextmanager
def apis(args: argparse.Namespace) -> Iterator[dict[str, fb.Api]]:
    with ExitStack() as stack:
        started: dict[str, fb.Api] = {}
        for text in args.variant:
            variant = fb.Variant.parse(text)
            log = args.log_dir / f"cost-split-{variant.name}.log"
            api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), 1, log)
            stack.callback(api.stop)
            started[variant.name] = api
        yield started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = Spec(tenants=1000, users_per_tenant=5)  # fastpath_bench's corpus
    queries = draw_sessions(args.warmup + 6 * args.blocks * args.block, args.size, spec, fb.NOW, seed=args.seed,
                            length=10, active=64)  # fmt: skip
    warmup, rest = queries[: args.warmup], queries[args.warmup :]

    def node_cpu_s() -> float:
        return process_cpu_s(args.opensearch_pid) if args.opensearch_pid else 0.0

    blocks = blocks_of(rest, args)
    with apis(args) as started:
        callers: dict[str, Caller] = {}
        for name, api in started.items():
            asyncio.run(fb.prime(api, spec, 1))
            fb.sequential(api, warmup, 0, None)
            callers[name] = Caller(api)
        measured = {name: Measured() for name in started}
        for b in range(args.blocks):
            for kind in KINDS if b % 2 == 0 else KINDS[::-1]:
                for name in list(callers) if b % 2 == 0 else list(callers)[::-1]:
                    caller, into = callers[name], measured[name]
                    send = requests_of(kind, caller)
                    cpu0, node0 = process_cpu_s(caller.worker), node_cpu_s()
                    for query in blocks[kind][b]:
                        t0 = time.perf_counter()
                        send(query)
                        into.latencies_ms[kind].append((time.perf_counter() - t0) * 1000)
                    into.cpu_s[kind] += process_cpu_s(caller.worker) - cpu0
                    into.node_cpu_s[kind] += node_cpu_s() - node0
    for name, into in measured.items():
        for kind in KINDS:
            row = into.row(kind, node=args.opensearch_pid is not None)
            print(json.dumps({"variant": name, "kind": kind, **row}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
