"""Recall latency on the multilingual case set beside English, on one index: does the CJK analysis
chain cost more than the English one?

One fresh namespace holds the English synthetic corpus of ``recall_bench`` (default 100k beliefs
over 1,000 tenants) plus the multilingual case set's corpus (evals/data/multilingual-v1) copied
into every tenant. Queries alternate, in one shuffled stream through the real recall path
(``ContextBuilder.build``), between ``recall_bench``'s English messages (alias hits, misses, long
messages) and the multilingual case set's own questions (Japanese, Chinese, German, Spanish), each
for a random tenant. Figures per kind come from ``recall_bench.measure``.

    .venv/bin/python -m benchmarks.multilingual_bench --start-node --heap 2g --out benchmarks/results/multilingual.json
    # both relevance paths (the vocabulary path, the service's default, needs Redis for its cache),
    # on a corpus loaded once and kept under --namespace
    .venv/bin/python -m benchmarks.multilingual_bench --opensearch-url URL --redis-url URL \\
        --namespace ml-bench --load-only
    .venv/bin/python -m benchmarks.multilingual_bench --opensearch-url URL --redis-url URL \\
        --namespace ml-bench --paths lucene,vocabulary --rounds 2

A benchmark, not a test: it prints figures and writes a JSON (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from opensearchpy import OpenSearch

from benchmarks.recall_bench import (
    Query,
    Spec,
    draw_queries,
    load_range,
    loadavg,
    measure,
    recall_clients,
    report_head,
    result_path,
)
from deploy.devstack import Service, start_opensearch
from evals.cases import CaseSet, multilingual_case_set
from service.config import RecallDefaults, Settings
from service.domain.belief import Belief
from service.domain.text import has_hangul, has_unspaced_script
from service.recall.context import ContextBuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS, apply_templates, drop_namespace
from service.write_versions import TenantWriteVersions

# the corpus's clock: the same beliefs on every run, so a kept namespace matches its queries
NOW = datetime(2026, 11, 1, tzinfo=UTC)


def load_multilingual(store: BeliefStore, cases: CaseSet, tenants: int) -> int:
    """The case set's corpus in every tenant (the ids are per tenant already)."""
    count = 0
    for t in range(tenants):
        beliefs = [Belief.from_record(r, tenant_id=f"t{t:04d}") for r in cases.beliefs]
        result = store.put_many(beliefs, refresh="false")
        if result.failed:
            raise RuntimeError(f"multilingual load failed: {list(result.failed.items())[:3]}")
        count += len(beliefs)
    return count


def _kind(query: str) -> str:
    """Korean (the `.ko` clauses run beside the `.cjk` ones), other unspaced scripts, or Latin."""
    if has_hangul(query):
        return "multilingual-korean"
    return "multilingual-cjk" if has_unspaced_script(query) else "multilingual-latin"


def multilingual_queries(cases: CaseSet, n: int, tenants: int, seed: int) -> list[Query]:
    """The case set's static questions, each asked in a random tenant by the case's user."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        case = rng.choice(cases.static)
        principal = cases.principal(f"t{rng.randrange(tenants):04d}", case.user_id)  # with its grants
        kind = _kind(case.query)
        out.append(Query(kind, principal, list(case.scope), case.query))
    return out


def relevance_paths(store: BeliefStore, paths: list[str]) -> dict[str, ContextBuilder]:
    """``lucene``: the fuzzy/shingle query; ``vocabulary``: the tenant-vocabulary path the service
    runs by default (``TENURE_RECALL_VOCABULARY_MATCHING``), with a cold per-process cache."""
    defaults = RecallDefaults()
    builders = {
        "lucene": lambda: ContextBuilder(store, defaults),
        "vocabulary": lambda: ContextBuilder(store, defaults, VocabularyMatcher.for_store(store, defaults)),
    }
    return {path: builders[path]() for path in paths}


def load_corpus(base: OpenSearch, store: BeliefStore, namespace: str, english: int, tenants: int) -> dict[str, int]:
    """The English corpus plus the case set's in every tenant, unless the namespace already holds
    exactly that (``--namespace`` reuses a corpus loaded by an earlier run)."""
    cases = multilingual_case_set()
    alias = BELIEFS.alias(namespace)
    expected = english + len(cases.beliefs) * tenants
    if base.indices.exists_alias(name=alias) and int(base.count(index=alias)["count"]) == expected:
        print(f"reusing {namespace}: {expected:,} beliefs", flush=True)
        return {"english": english, "multilingual": expected - english, "tenants": tenants, "reused": 1}
    apply_templates(base, namespace)
    print(f"loading {english:,} English + {len(cases.beliefs)} x {tenants} multilingual ...", flush=True)
    load_range(base, alias, 0, english, Spec(tenants=tenants), NOW, 2000)
    multilingual = load_multilingual(store, cases, tenants)
    base.indices.refresh(index=alias)
    base.indices.forcemerge(index=alias, max_num_segments=1, request_timeout=3600)
    base.indices.refresh(index=alias)
    return {"english": english, "multilingual": multilingual, "tenants": tenants, "reused": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--english", type=int, default=100_000, help="English synthetic beliefs")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=4000, help="measured queries (both kinds together)")
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--opensearch-url", default=None)
    parser.add_argument("--start-node", action="store_true")
    parser.add_argument("--heap", default="2g")
    parser.add_argument("--redis-url", default=None, help="Redis for the tenant write versions (vocabulary path)")
    parser.add_argument("--paths", default="lucene", help="relevance paths, comma-separated: lucene,vocabulary")
    parser.add_argument("--rounds", type=int, default=1, help="each path measured this many times, alternating")
    parser.add_argument("--namespace", default=None, help="load into / reuse this namespace and keep it")
    parser.add_argument("--load-only", action="store_true", help="load (with --namespace) and measure nothing")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    if "vocabulary" in paths and not args.redis_url:
        parser.error("the vocabulary path needs --redis-url (its cache follows the tenant write versions)")

    cases = multilingual_case_set()
    spec = Spec(tenants=args.tenants)
    started = datetime.now(UTC)
    node: Service | None = None
    home = Path(tempfile.mkdtemp(prefix="bench-os-")) if args.start_node else None
    if home is not None:
        node = start_opensearch(home, heap=args.heap)
    url = node.url if node else (args.opensearch_url or Settings().opensearch_url)
    namespace = args.namespace or f"bench-ml-{uuid.uuid4().hex[:8]}"
    base, client = recall_clients(url, namespace, pool_maxsize=8)
    redis_client: redis.Redis[bytes] | None = redis.Redis.from_url(args.redis_url) if args.redis_url else None
    versions = TenantWriteVersions(redis_client, namespace) if redis_client is not None else None
    what = "recall latency, multilingual case set questions beside English messages, one index"
    report: dict[str, Any] = {**report_head("multilingual_bench", what, argv, started), "runs": []}
    try:
        store = BeliefStore(client, namespace, versions)
        report["corpus"] = load_corpus(base, store, namespace, args.english, args.tenants)
        if args.load_only:
            return 0
        total = args.warmup + args.queries
        stream = draw_queries(total // 2, args.english, spec, NOW, seed=1) + multilingual_queries(
            cases, total - total // 2, args.tenants, seed=2
        )
        random.Random(3).shuffle(stream)
        builders = relevance_paths(store, paths)
        for r in range(args.rounds):
            for path, builder in builders.items():
                result = measure(builder, client, stream, args.warmup, threads=1)
                report["runs"].append({"round": r, "path": path, "loadavg": loadavg(), **result})
                print(f"round {r}, {path} path: p50 {result['p50_ms']:.2f}  p99 {result['p99_ms']:.2f} ms", flush=True)
                for kind, v in result["by_kind_ms"].items():
                    print(
                        f"  {kind:20} n={v['n']:>5.0f}  p50 {v['p50']:.2f}  p95 {v['p95']:.2f}  p99 {v['p99']:.2f} ms"
                    )
        report["result"] = report["runs"][-1] if report["runs"] else None
    finally:
        report["loadavg_after"] = loadavg()
        report["finished_at"] = datetime.now(UTC).isoformat()
        if not args.namespace:
            drop_namespace(base, namespace)
        base.close()
        client.close()
        if redis_client is not None:
            redis_client.close()
        if node:
            node.stop()
            if home is not None:
                shutil.rmtree(home, ignore_errors=True)
        if not args.load_only:
            out = result_path(args.out, "multilingual", started)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
            print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
