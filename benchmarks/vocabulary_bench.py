"""Relevance path A/B: recall latency with the Lucene query vs the tenant's own vocabulary.

One index (``recall_bench``'s corpus: N beliefs over 1,000 tenants), one Redis for the tenant write
versions, the same messages for both paths, alternating rounds (so machine load hits both alike).
Also reports what the vocabularies cost: build time per tenant (cold recalls) and estimated memory.

    .venv/bin/python -m benchmarks.vocabulary_bench --start-node --sizes 10000,100000 \
        --out benchmarks/results/vocab.json
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import redis

from benchmarks.recall_bench import (
    Spec,
    add_server_arguments,
    draw_queries,
    load_range,
    loadavg,
    measure,
    recall_clients,
    report_head,
    result_path,
    start_servers,
    wind_down,
)
from loadtest.stats import percentile
from service.config import RecallDefaults
from service.recall.context import ContextBuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS, apply_templates, drop_namespace
from service.write_versions import TenantWriteVersions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=1000, help="measured queries per round and path")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    add_server_arguments(parser, heap="1g", redis_url=True)
    args = parser.parse_args(argv)

    spec = Spec(tenants=args.tenants)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    servers = start_servers("vocab-bench-", args)
    url, redis_url = servers.opensearch_url, servers.redis_url
    namespace = f"vbench-{uuid.uuid4().hex[:8]}"
    base, client = recall_clients(url, namespace, pool_maxsize=32)
    redis_client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    what = "relevance path A/B: ContextBuilder.build with the Lucene query vs the tenant vocabulary"
    report: dict[str, Any] = {**report_head("vocabulary_bench", what, argv, started), "stages": []}
    try:
        apply_templates(base, namespace)
        alias = BELIEFS.alias(namespace)
        store = BeliefStore(client, namespace, TenantWriteVersions(redis_client, namespace))
        defaults = RecallDefaults()
        loaded = 0
        for size in sorted(int(s) for s in args.sizes.split(",")):
            print(f"loading {loaded:,}..{size:,} beliefs ...", flush=True)
            load_range(base, alias, loaded, size, spec, now, 2000)
            loaded = size
            base.indices.refresh(index=alias)
            queries = draw_queries(args.warmup + args.queries, loaded, spec, now, seed=size)
            matcher = VocabularyMatcher.for_store(store, defaults)  # a cold cache per stage
            builders = {
                "lucene": ContextBuilder(store, defaults),
                "vocabulary": ContextBuilder(store, defaults, matcher),
            }
            stage: dict[str, Any] = {"beliefs": loaded, "rounds": []}
            for r in range(args.rounds):
                for path, builder in builders.items():
                    m = measure(builder, client, queries, args.warmup, threads=1)
                    stage["rounds"].append({"round": r, "path": path, **m, "loadavg": loadavg()})
                    print(
                        f"  {loaded:>9,} round {r} {path:>10}: p50 {m['p50_ms']:.2f} p95 {m['p95_ms']:.2f} "
                        f"p99 {m['p99_ms']:.2f} ms, {m['throughput_qps']:.0f} q/s; by kind p50 {m['by_kind_p50_ms']}",
                        flush=True,
                    )
            stats = matcher.cache.stats
            sizes = [e.approx_bytes for e in matcher.cache.entries()]
            builds = [e.build_ms for e in matcher.cache.entries()]
            stage["vocabulary"] = {
                "builds": stats.builds,
                "hits": stats.hits,
                "build_ms_mean": stats.build_ms_total / max(1, stats.builds),
                "build_ms_p50": percentile(builds, 50) if builds else 0.0,
                "build_ms_max": stats.build_ms_max,
                "tenants_cached": len(matcher.cache),
                "bytes_per_tenant_mean": sum(sizes) / max(1, len(sizes)),
                "bytes_total": matcher.cache.cached_bytes,
            }
            print(f"  vocabulary cache: {json.dumps(stage['vocabulary'])}", flush=True)
            report["stages"].append(stage)
    finally:
        drop_namespace(base, namespace)
        base.close()
        client.close()
        redis_client.close()
        wind_down(report, result_path(args.out, "vocab", started), servers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
