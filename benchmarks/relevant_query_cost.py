"""What one relevant-tier search costs the OpenSearch node, and which part of its body costs it.

With the filter tiers in the tier cache, most session recalls send OpenSearch two requests: the
message's analysis (``_mtermvectors``) and a search of the relevant tier alone (a handful of exact
weighted ``term`` clauses from the tenant's vocabulary, routed to one shard).
This script asks whether that search can be made cheaper for the node by its shape:

1. The real API runs in process (``recall_floor.record``: every cache as deployed) over the loaded
   corpus, answers ``--warmup`` session recalls, and records the OpenSearch requests of
   ``--queries`` more as sent. The searches of the relevant tier alone are kept.
2. Each is replayed raw over one keep-alive ``http.client`` connection in several shapes:
   ``msearch`` (a one-item ``_msearch``, as recall sent it before), ``search`` (``_search?routing=``,
   as it sends it now: ``BeliefStore._tiers_call``), and ``_search``
   without a part of the body: ``no_names`` (no ``_name`` on the clauses, so no matched-queries
   fetch phase), ``no_source``, ``score_sort`` (``_score`` only, no tie-break fields),
   ``no_seqno``, ``bare`` (all four removed); plus ``GET /`` (the node's per-request floor). The
   shapes take turns in ``--rounds`` rounds, alternating order; a check first asserts that
   ``search`` returns the same ids as ``msearch``.

Per shape: the node's CPU per request (``/proc/<pid>/stat`` of ``--opensearch-pid``) and the
wall time p50, the median over rounds. The figures say what a shape change could save; the shapes
other than ``msearch`` and ``search`` drop something recall uses (the matched clauses, the beliefs,
the deterministic order, the decode cache's version), so they are bounds, not proposals.

    .venv/bin/python -m benchmarks.relevant_query_cost --opensearch-url $OS --redis-url $REDIS --opensearch-pid $OS_PID

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from benchmarks import fastpath_bench as fb
from benchmarks import recall_floor as rf
from benchmarks.recall_bench import Spec
from loadtest.__main__ import process_cpu_s

# The exclusions recall's ``_msearch`` carried until 2026-12-07 (the tiers' answers are taken whole
# since: docs/benchmarks.md, "Tier answers unfiltered"); the ``msearch`` shape keeps them, so its
# figures stay comparable with the earlier runs'.
MSEARCH_FILTER_PATH = (
    "-took,-responses._shards,-responses.timed_out,-responses.hits.max_score,-responses.hits.hits._routing"
)
SHAPES = ("msearch", "search", "no_names", "no_source", "score_sort", "no_seqno", "bare", "floor")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    rf.add_recording_arguments(parser)
    parser.add_argument("--opensearch-pid", type=int, required=True, help="the node's JVM, for its CPU")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def _without_names(query: Any) -> Any:
    if isinstance(query, dict):
        return {k: _without_names(v) for k, v in query.items() if k != "_name"}
    if isinstance(query, list):
        return [_without_names(v) for v in query]
    return query


def shaped(shape: str, body: dict[str, Any]) -> dict[str, Any]:
    """The search body of ``shape`` (``msearch`` and ``search`` send it as recorded)."""
    out = _without_names(body) if shape in ("no_names", "bare") else dict(body)
    if shape in ("no_source", "bare"):
        out["_source"] = False
    if shape in ("score_sort", "bare"):
        out["sort"] = ["_score"]
    if shape in ("no_seqno", "bare"):
        out["seq_no_primary_term"] = False
    return out


def requests_of(sent: rf.Sent) -> dict[str, tuple[str, str, bytes | None, str]] | None:
    """Every shape's (method, path, body, content type) for one recorded search of the relevant
    tier alone (a plain ``_search``, as recall sends it since the tier searched alone stopped
    being a one-item ``_msearch``; or such an ``_msearch`` recorded from older code), or None
    for any other request."""
    tiers = sent.tier_searches()
    if tiers is None or len(tiers) != 1:
        return None
    head, body = tiers[0]
    search = f"/{head['index']}/_search?" + urllib.parse.urlencode({"routing": head["routing"]})
    msearch = f"/_msearch?{urllib.parse.urlencode({'filter_path': MSEARCH_FILTER_PATH})}"
    lines = f"{json.dumps({'index': head['index'], 'routing': head['routing']})}\n{json.dumps(body)}\n"
    out = {"msearch": ("POST", msearch, lines.encode(), "application/x-ndjson"), "floor": ("GET", "/", None, "")}
    for shape in SHAPES:
        if shape not in out:
            out[shape] = ("POST", search, json.dumps(shaped(shape, body)).encode(), "application/json")
    return out


class Node:
    def __init__(self, url: str, pid: int):
        parsed = urllib.parse.urlparse(url.split(",")[0])
        self.connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 9200)
        self.pid = pid

    def send(self, method: str, path: str, body: bytes | None, content_type: str) -> tuple[float, Any]:
        headers = {"Content-Type": content_type} if content_type else {}
        started = time.perf_counter()
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        elapsed = (time.perf_counter() - started) * 1000
        if response.status >= 300:
            raise RuntimeError(f"{method} {path} answered {response.status}: {data[:300]!r}")
        return elapsed, data

    def cpu_s(self) -> float:
        return process_cpu_s(self.pid)


def keep_result(out: Path | None, module: str, argv: list[str] | None, result: dict[str, Any]) -> None:
    """Write ``result`` to ``out`` (if given) as JSON, headed by the command that made it."""
    if out is not None:
        command = f"python -m benchmarks.{module} " + " ".join(sys.argv[1:] if argv is None else argv)
        out.write_text(json.dumps({"command": command, **result}, indent=1))


def _ids(answer: bytes, multi: bool) -> list[str]:
    data = json.loads(answer)
    result = data["responses"][0] if multi else data
    return [hit["_id"] for hit in result.get("hits", {}).get("hits", [])]


def measure(node: Node, requests: list[dict[str, tuple[str, str, bytes | None, str]]], rounds: int) -> dict[str, Any]:
    for shapes in requests[:100]:  # the same search either way
        if _ids(node.send(*shapes["msearch"])[1], True) != _ids(node.send(*shapes["search"])[1], False):
            raise RuntimeError("_search and _msearch answered different hits")
    cpu: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    wall: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for r in range(rounds):
        for shape in SHAPES[:: 1 if r % 2 == 0 else -1]:
            started = node.cpu_s()
            times = [node.send(*shapes[shape])[0] for shapes in requests]
            cpu[shape].append((node.cpu_s() - started) * 1000 / len(requests))
            wall[shape].append(statistics.median(times))
    return {
        shape: {
            "node_cpu_ms_per_request": round(statistics.median(cpu[shape]), 3),
            "node_cpu_ms_by_round": [round(c, 3) for c in cpu[shape]],
            "wall_p50_ms": round(statistics.median(wall[shape]), 3),
        }
        for shape in SHAPES
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    calls = fb.parse_args(["--queries", str(args.queries), "--warmup", str(args.warmup), "--seed", str(args.seed)])
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)
    queries = fb.traffic(calls, args.traffic, args.size, spec)[: args.warmup + args.queries]
    recalls = rf.record(args, queries)
    requests = [shapes for r in recalls for sent in r.opensearch if (shapes := requests_of(sent)) is not None]
    if not requests:
        raise SystemExit("no recorded recall sent the relevant tier alone")
    figures = measure(Node(args.opensearch_url, args.opensearch_pid), requests, args.rounds)
    for shape, row in figures.items():
        print(json.dumps({"shape": shape, "requests": len(requests), **row}), flush=True)
    keep_result(args.out, "relevant_query_cost", argv, {"requests": len(requests), "figures": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
