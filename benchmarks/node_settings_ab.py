"""Does a node-level OpenSearch setting change what recall's requests cost the node?

OpenSearch 2.19 runs, by default, bookkeeping around every search task that recall never reads:
per-task resource tracking (``task_resource_tracking.enabled``), search backpressure in monitor
mode (``search_backpressure.mode``), per-request search stats (``search.request_stats_enabled``)
and workload-management monitoring (``wlm.query_group.mode``). Each is a dynamic cluster setting.
This script asks whether turning them off makes the node cheaper per request:

1. The real API runs in process (``recall_floor.record``: every cache as deployed) over the loaded
   corpus, answers ``--warmup`` session recalls, and records every OpenSearch request of
   ``--queries`` more as sent (the message analyses, the tier searches, the reads by id).
2. The recorded requests are replayed raw over one keep-alive ``http.client`` connection in
   ``--rounds`` rounds, each round once with the node's defaults ("A") and once with the
   ``--setting name=value`` pairs applied as transient cluster settings ("B"), the order
   alternating by round. The defaults are set again before every A block and at the end, also on
   failure.

Per variant: the node's CPU per request (``/proc/<pid>/stat`` of ``--opensearch-pid``) and the wall
time p50, the median over rounds, and in how many rounds B was cheaper.

    .venv/bin/python -m benchmarks.node_settings_ab --opensearch-url $OS --redis-url $REDIS \
        --opensearch-pid $OS_PID --setting task_resource_tracking.enabled=false

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks import recall_floor as rf
from benchmarks.index_order_ab import recorded_requests, request_headers
from benchmarks.recall_floor import Sent
from benchmarks.relevant_query_cost import Node, keep_result

# One recorded request as Node.send takes it: method, path, body, content type.
Request = tuple[str, str, bytes | None, str]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    rf.add_recording_arguments(parser)
    parser.add_argument("--opensearch-pid", type=int, required=True, help="the node's JVM, for its CPU")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--setting", action="append", default=[], type=setting, help="name=value, applied in the B blocks"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.setting:
        parser.error("name at least one --setting")
    return args


def setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    return name.strip(), value.strip()


def replayable(sent: list[Sent]) -> list[Request]:
    """The recorded requests, in order, as Node.send takes them."""
    return [(s.method, s.path, s.body, request_headers(s)["Content-Type"] if s.body else "") for s in sent]


def put_transient(node: Node, values: dict[str, str | None]) -> None:
    """Set (or, with None, reset to the default) transient cluster settings, outside the timing."""
    node.send("PUT", "/_cluster/settings", json.dumps({"transient": values}).encode(), "application/json")


def measure(node: Node, requests: list[Request], values: dict[str, str], rounds: int) -> dict[str, Any]:
    defaults: dict[str, str | None] = dict.fromkeys(values)
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    wall: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for _ in range(2):  # the node's caches and JIT, once for both variants
            for request in requests:
                node.send(*request)
        for r in range(rounds):
            for variant in ("A", "B") if r % 2 == 0 else ("B", "A"):
                put_transient(node, dict(values) if variant == "B" else defaults)
                started = node.cpu_s()
                times = [node.send(*request)[0] for request in requests]
                cpu[variant].append((node.cpu_s() - started) * 1000 / len(requests))
                wall[variant].append(statistics.median(times))
    finally:
        put_transient(node, defaults)
    return {
        "settings": values,
        "requests": len(requests),
        "rounds": rounds,
        **{
            variant: {
                "node_cpu_ms_per_request": round(statistics.median(cpu[variant]), 3),
                "node_cpu_ms_by_round": [round(c, 3) for c in cpu[variant]],
                "wall_p50_ms": round(statistics.median(wall[variant]), 3),
            }
            for variant in ("A", "B")
        },
        "b_cheaper_rounds": sum(b < a for a, b in zip(cpu["A"], cpu["B"], strict=True)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests = replayable(recorded_requests(args))
    node = Node(args.opensearch_url, args.opensearch_pid)
    figures = measure(node, requests, dict(args.setting), args.rounds)
    print(json.dumps(figures), flush=True)
    keep_result(args.out, "node_settings_ab", argv, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
