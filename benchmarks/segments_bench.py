"""Refresh interval and merge policy A/B under the service's own write pattern (issue 16, item 3).

Each variant gets its own beliefs index (same node, same corpus, force-merged like a fresh load),
then the same steady load the API puts on it: single belief writes acknowledged with
``refresh=wait_for`` (the API's default) from ``--writers`` threads, while one thread recalls
through ``ContextBuilder`` (the vocabulary path the service runs, with write versions in Redis);
then recalls alone on the segments the writes left. Variants run in alternating rounds so the
machine's load hits them alike. Reported per variant: write acknowledgement p50/p99, recall
p50/p99 during and after the writes, searchable segments per primary shard, merge time.

    .venv/bin/python -m benchmarks.segments_bench --start-node --out benchmarks/results/segments.json
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import redis

from benchmarks.recall_bench import (
    Spec,
    add_server_arguments,
    belief_at,
    draw_queries,
    load_range,
    loadavg,
    report_head,
    result_path,
    start_servers,
    wind_down,
)
from loadtest.stats import percentile
from service.config import RecallDefaults, Settings
from service.recall.context import ContextBuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.storage.templates import BELIEFS, apply_templates, drop_namespace
from service.write_versions import TenantWriteVersions

# (name, refresh_interval, index.merge.policy.segments_per_tier)
VARIANTS = [("refresh-1s/tier-10", "1s", 10), ("refresh-1s/tier-4", "1s", 4), ("refresh-5s/tier-10", "5s", 10)]


def _segments_per_shard(client: Any, alias: str) -> float:
    primaries = client.indices.stats(index=alias, metric="segments")["_all"]["primaries"]["segments"]["count"]
    settings = next(iter(client.indices.get_settings(index=alias).values()))["settings"]["index"]
    return float(primaries) / int(settings["number_of_shards"])


def _merge_ms(client: Any, alias: str) -> int:
    return int(client.indices.stats(index=alias, metric="merge")["_all"]["primaries"]["merges"]["total_time_in_millis"])


def _recalls(builder: ContextBuilder, queries: list[Any], stop: threading.Event | None) -> list[float]:
    out: list[float] = []
    for q in queries:
        if stop is not None and stop.is_set():
            break
        t0 = time.perf_counter()
        builder.build(q.principal, q.scopes, q.message)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def run_variant(
    store: BeliefStore, builder: ContextBuilder, spec: Spec, now: datetime, args: argparse.Namespace, r: int
) -> dict[str, Any]:
    client = store.client
    rng = random.Random(r)
    writes = [belief_at(rng.randrange(args.beliefs), spec, now) for _ in range(args.writes)]  # updates
    queries = draw_queries(args.recalls * 2, args.beliefs, spec, now, seed=r)
    merge0 = _merge_ms(client, store.alias)
    acks: list[float] = []
    lock = threading.Lock()

    def write(belief: Any) -> None:
        t0 = time.perf_counter()
        store.put(belief, refresh="wait_for")  # the API's acknowledgement: visible to the next recall
        with lock:
            acks.append((time.perf_counter() - t0) * 1000)

    stop = threading.Event()
    during: list[float] = []
    recaller = threading.Thread(target=lambda: during.extend(_recalls(builder, queries[: args.recalls], stop)))
    recaller.start()
    with ThreadPoolExecutor(args.writers) as pool:
        list(pool.map(write, writes))
    stop.set()
    recaller.join()
    client.indices.refresh(index=store.alias)
    after = _recalls(builder, queries[args.recalls :], None)
    return {
        "writes": len(acks),
        "write_ack_p50_ms": percentile(acks, 50),
        "write_ack_p99_ms": percentile(acks, 99),
        "recall_during_writes_p50_ms": percentile(during, 50) if during else None,
        "recall_during_writes_p99_ms": percentile(during, 99) if during else None,
        "recalls_during_writes": len(during),
        "recall_after_p50_ms": percentile(after, 50),
        "recall_after_p99_ms": percentile(after, 99),
        "segments_per_shard": _segments_per_shard(client, store.alias),
        "merge_ms": _merge_ms(client, store.alias) - merge0,
        "loadavg": loadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--beliefs", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--writes", type=int, default=150, help="single writes per variant and round")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--recalls", type=int, default=200, help="recalls during and after the writes")
    parser.add_argument("--rounds", type=int, default=2)
    add_server_arguments(parser, heap="1g", redis_url=False)
    args = parser.parse_args(argv)

    spec = Spec(tenants=args.tenants)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    servers = start_servers("segments-bench-", args)  # always its own Redis
    url = servers.opensearch_url
    redis_client: redis.Redis[bytes] = redis.Redis.from_url(servers.redis_url)
    what = "refresh interval and merge policy A/B: wait_for writes with concurrent recalls"
    report: dict[str, Any] = {
        **report_head("segments_bench", what, argv, started),
        "variants": {name: [] for name, _, _ in VARIANTS},
    }
    namespaces: list[str] = []
    base = build_client(Settings(opensearch_url=url, opensearch_timeout_s=120))
    try:
        stores: dict[str, tuple[BeliefStore, ContextBuilder]] = {}
        for name, refresh, tier in VARIANTS:
            namespace = f"segbench-{uuid.uuid4().hex[:8]}"
            namespaces.append(namespace)
            apply_templates(base, namespace)
            alias = BELIEFS.alias(namespace)
            print(f"{name}: loading {args.beliefs:,} beliefs ...", flush=True)
            load_range(base, alias, 0, args.beliefs, spec, now, 2000)
            base.indices.put_settings(
                index=alias,
                body={"index": {"refresh_interval": refresh, "merge.policy.segments_per_tier": tier}},
            )
            store = BeliefStore(base, namespace, TenantWriteVersions(redis_client, namespace))
            defaults = RecallDefaults()
            builder = ContextBuilder(store, defaults, VocabularyMatcher.for_store(store, defaults))
            _recalls(builder, draw_queries(args.recalls, args.beliefs, spec, now, seed=99), None)  # warm
            stores[name] = (store, builder)
        for r in range(args.rounds):
            for name, (store, builder) in stores.items():
                m = run_variant(store, builder, spec, now, args, r)
                report["variants"][name].append(m)
                print(f"round {r} {name}: {json.dumps(m)}", flush=True)
    finally:
        for namespace in namespaces:
            drop_namespace(base, namespace)
        base.close()
        redis_client.close()
        wind_down(report, result_path(args.out, "segments", started), servers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
