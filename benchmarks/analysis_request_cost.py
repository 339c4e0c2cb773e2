"""What analysing a recall message costs the node: one ``_mtermvectors`` (as recall sends it) or an
``_analyze`` per analysis.

Recall analyses each message with the index's own search analyzers in one ``_mtermvectors``
round trip of artificial documents (``service/storage/vocabulary.py``): up to three analyses (the
phrase field, the alias shingles, the fuzzy words) in one request. ``_analyze`` takes one analyzer
per request, but does no per-document work (no in-memory index, no term vectors). This script asks
which costs the node less per message:

1. The real API runs in process (``recall_floor.record``, every cache as deployed) over the loaded
   corpus, answers ``--warmup`` session recalls and records the OpenSearch requests of
   ``--queries`` more as sent; their ``_mtermvectors`` requests are the messages.
2. Each message is replayed raw over one keep-alive ``http.client`` connection in three shapes:
   ``mtermvectors`` (the recorded request), ``analyze`` (one ``_analyze`` per field and analyzer
   of the recorded request, the text its document gives that field: the same analyses) and
   ``analyze_one`` (only the first of them: the node's cost of one ``_analyze`` request), in
   ``--rounds`` rounds, the order reversed every round.

Per shape: the node's CPU per message (``/proc/<pid>/stat`` of ``--opensearch-pid``), requests per
message and the wall time p50 per message.

    .venv/bin/python -m benchmarks.analysis_request_cost --opensearch-url $OS --redis-url $REDIS \
        --opensearch-pid $OS_PID

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import recall_floor as rf
from benchmarks.index_order_ab import recorded_requests
from benchmarks.relevant_query_cost import Node, keep_result

SHAPES = ("mtermvectors", "analyze", "analyze_one")
# One message in one shape: the requests as Node.send takes them (method, path, body, content type).
Requests = list[tuple[str, str, bytes | None, str]]
ANALYZE_FILTER = "filter_path=tokens.token,tokens.position"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    rf.add_recording_arguments(parser)
    parser.add_argument("--opensearch-pid", type=int, required=True, help="the node's JVM, for its CPU")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def shapes_of(path: str, body: bytes) -> dict[str, Requests]:
    """A recorded ``_mtermvectors`` request in the three shapes (see the module docstring)."""
    index = path.lstrip("/").split("/", 1)[0]
    analyses = [
        {"analyzer": analyzer, "text": doc["doc"][field.split(".", 1)[0]]}
        for doc in json.loads(body)["docs"]
        for field, analyzer in doc["per_field_analyzer"].items()
    ]
    separate: Requests = [
        ("POST", f"/{index}/_analyze?{ANALYZE_FILTER}", json.dumps(a).encode(), "application/json") for a in analyses
    ]
    return {
        "mtermvectors": [("POST", path, body, "application/json")],
        "analyze": separate,
        "analyze_one": separate[:1],
    }


def measure(node: Node, messages: list[dict[str, Requests]], rounds: int) -> dict[str, Any]:
    for shape in SHAPES:  # the node's caches and JIT, once for every shape
        for message in messages[:100]:
            for request in message[shape]:
                node.send(*request)
    cpu: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    wall: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for r in range(rounds):
        for shape in SHAPES[:: 1 if r % 2 == 0 else -1]:
            started, times = node.cpu_s(), []
            for message in messages:
                t0 = time.perf_counter()
                for request in message[shape]:
                    node.send(*request)
                times.append((time.perf_counter() - t0) * 1000)
            cpu[shape].append((node.cpu_s() - started) * 1000 / len(messages))
            wall[shape].append(statistics.median(times))
    return {
        "messages": len(messages),
        "rounds": rounds,
        **{
            shape: {
                "requests_per_message": round(sum(len(m[shape]) for m in messages) / len(messages), 2),
                "node_cpu_ms_per_message": round(statistics.median(cpu[shape]), 3),
                "node_cpu_ms_by_round": [round(c, 3) for c in cpu[shape]],
                "wall_p50_ms_per_message": round(statistics.median(wall[shape]), 3),
            }
            for shape in SHAPES
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the requests to measure are the node's analyses: the recorded API sends them (without its
    # in-process analysis, service/storage/local_analysis.py)
    os.environ["TENURE_RECALL_LOCAL_ANALYSIS"] = "false"
    messages = [
        shapes_of(sent.path, sent.body)
        for sent in recorded_requests(args)
        if sent.kind == "_mtermvectors" and sent.body is not None
    ]
    if not messages:
        raise SystemExit("no message analysis was recorded (every message cached or empty?)")
    figures = measure(Node(args.opensearch_url, args.opensearch_pid), messages, args.rounds)
    print(json.dumps(figures), flush=True)
    keep_result(args.out, "analysis_request_cost", argv, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
