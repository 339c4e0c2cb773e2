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
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from benchmarks.recall_bench import (
    REPO,
    Spec,
    TimedClient,
    draw_queries,
    load_range,
    loadavg,
    measure,
    wind_down,
)
from deploy.devstack import Service, start_opensearch, start_redis
from loadtest.stats import percentile
from service.config import RecallDefaults, Settings
from service.recall.context import ContextBuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.client import FastJSONSerializer, build_client
from service.storage.templates import BELIEFS, apply_templates, drop_namespace
from service.write_versions import TenantWriteVersions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=1000, help="measured queries per round and path")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--start-node", action="store_true")
    parser.add_argument("--heap", default="1g")
    parser.add_argument("--opensearch-url", default=None)
    parser.add_argument("--redis-url", default=None, help="default: start a throw-away redis-server")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    spec = Spec(tenants=args.tenants)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    tmp = Path(tempfile.mkdtemp(prefix="vocab-bench-"))
    node: Service | None = start_opensearch(tmp / "os", heap=args.heap) if args.start_node else None
    rds: Service | None = None if args.redis_url else start_redis(tmp / "redis")
    url = node.url if node else (args.opensearch_url or Settings().opensearch_url)
    redis_url = args.redis_url or (rds.url if rds else "")
    namespace = f"vbench-{uuid.uuid4().hex[:8]}"
    settings = Settings(opensearch_url=url, opensearch_namespace=namespace, opensearch_timeout_s=60)
    base = build_client(settings)
    client = TimedClient(hosts=[url], timeout=60, max_retries=1, pool_maxsize=32, serializer=FastJSONSerializer())
    client.took = []
    redis_client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    report: dict[str, Any] = {
        "benchmark": "relevance path A/B: ContextBuilder.build with the Lucene query vs the tenant vocabulary",
        "command": "python -m benchmarks.vocabulary_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_at": started.isoformat(),
        "loadavg_before": loadavg(),
        "stages": [],
    }
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
        out = args.out or REPO / "benchmarks" / "results" / f"vocab-{started:%Y%m%dT%H%MZ}.json"
        wind_down(report, out, (node, rds), tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
