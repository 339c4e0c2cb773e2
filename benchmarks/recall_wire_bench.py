"""What a recall reads from OpenSearch and what decoding its hits costs (issue 16, item 4).

In process, on a running node: the generated corpus (``--load``: 20,000 beliefs over 200 tenants,
100 a tenant) and ``--queries`` recalls of ``recall_bench.draw_queries`` through
``ContextBuilder.build`` (the Lucene relevance path, no caches across the filter tiers), counting
the bytes of every OpenSearch answer, the answers per recall and the client's CPU per recall; then
the CPU per hit of full validation (``Belief.from_document``) beside the read path's own decoding
(``unreadable.BELIEF_RECORDS.parse``) over the corpus's documents as recall reads them.

Run it as a file so an older tree can be measured with the same script (``PYTHONPATH`` puts that
tree's ``service`` first; the editable install's finder comes after it):

    PYTHONPATH=. .venv/bin/python benchmarks/recall_wire_bench.py --opensearch-url http://127.0.0.1:9200 --load
    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/recall_wire_bench.py --opensearch-url http://127.0.0.1:9200

A benchmark, not a test: it prints figures (relative ones on a busy machine) and writes nothing.
"""

from __future__ import annotations

import argparse
import gc
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from benchmarks.recall_bench import Spec, belief_at, draw_queries, load_range
from service.config import RecallDefaults, Settings
from service.domain.belief import Belief
from service.recall.context import ContextBuilder
from service.storage import unreadable
from service.storage.beliefs import BeliefStore
from service.storage.client import FastJSONSerializer, build_client
from service.storage.templates import BELIEFS, apply_templates

NOW = datetime(2026, 11, 30, tzinfo=UTC)


class CountingSerializer(FastJSONSerializer):
    """The client's JSON serializer, counting the bytes of every answer it decodes."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.answers = 0

    def loads(self, s: Any) -> Any:
        self.bytes += len(s.encode() if isinstance(s, str) else s)
        self.answers += 1
        return super().loads(s)


def wire(url: str, namespace: str, spec: Spec, size: int, queries: int, load: bool) -> dict[str, float]:
    client = build_client(Settings(opensearch_url=url, opensearch_timeout_s=120))
    counting = CountingSerializer()
    client.transport.serializer = counting
    client.transport.deserializer.serializers["application/json"] = counting
    if load:
        apply_templates(client, namespace)
        load_range(client, BELIEFS.alias(namespace), 0, size, spec, NOW, 2000)
    store = BeliefStore(client, namespace)
    builder = ContextBuilder(store, RecallDefaults())
    drawn = draw_queries(queries, size, spec, NOW, seed=5)
    for q in drawn[:200]:  # warm-up
        builder.build(q.principal, q.scopes, q.message)
    counting.bytes = counting.answers = 0
    gc.collect()
    cpu = time.process_time()
    entries = 0
    for q in drawn:
        result = builder.build(q.principal, q.scopes, q.message)
        entries += len(result.pinned) + len(result.relevant) + len(result.questions)
    cpu = time.process_time() - cpu
    client.close()
    return {
        "recalls": len(drawn),
        "answer_bytes_per_recall": round(counting.bytes / len(drawn)),
        "answers_per_recall": round(counting.answers / len(drawn), 3),
        "client_cpu_ms_per_recall": round(cpu / len(drawn) * 1000, 3),
        "tier_entries_per_recall": round(entries / len(drawn), 2),
    }


def decoding(spec: Spec, count: int = 3000, rounds: int = 5) -> dict[str, float]:
    sources = []
    for i in range(count):
        source = orjson.loads(orjson.dumps(belief_at(i, spec, NOW).to_document()))
        sources.append({k: v for k, v in source.items() if k not in ("change_log", "lifecycle", "content_hash")})

    def best(decode: Any) -> float:
        times = []
        for _ in range(rounds):
            started = time.process_time()
            for source in sources:
                decode(source)
            times.append(time.process_time() - started)
        return round(min(times) / count * 1e6, 1)

    return {
        "full_validation_us_per_hit": best(Belief.from_document),
        "read_path_us_per_hit": best(unreadable.BELIEF_RECORDS.parse),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--namespace", default="recallwire")
    parser.add_argument("--load", action="store_true", help="load the corpus into the namespace first")
    parser.add_argument("--beliefs", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--queries", type=int, default=1500)
    args = parser.parse_args(argv)
    spec = Spec(tenants=args.tenants)
    figures = wire(args.opensearch_url, args.namespace, spec, args.beliefs, args.queries, args.load)
    print(orjson.dumps({**figures, **decoding(spec)}).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
