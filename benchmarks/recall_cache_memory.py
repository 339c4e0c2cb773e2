"""Bytes per entry of recall's per-process caches (the figures of docs/operations.md "Recall caches").

Fills the filter-tier cache (service/recall/tier_cache.py) with one entry per (tenant, user, scope
list) of a generated corpus through the real recall path and reports, from tracemalloc, what the
process grew by per entry: once with the decode cache off (every belief counted as the tier
cache's own: what its estimate assumes) and once with the decode cache holding the same beliefs
(what a warm process adds), beside the cache's own estimate. Also the bytes of one decoded belief.

    .venv/bin/python -m benchmarks.recall_cache_memory --opensearch-url http://127.0.0.1:9200 --load
    .venv/bin/python -m benchmarks.recall_cache_memory --opensearch-url http://127.0.0.1:9200   # loaded already

A benchmark, not a test: it prints figures and writes nothing.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tracemalloc
from datetime import UTC, datetime

import orjson

from benchmarks.recall_bench import Spec, belief_at, load_range
from service.config import RecallDefaults, Settings
from service.domain.principal import Principal
from service.domain.stored_belief import decode_stored
from service.recall.context import ContextBuilder
from service.recall.tier_cache import TierCache
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.storage.templates import BELIEFS, apply_templates

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def _combinations(spec: Spec, count: int) -> list[tuple[Principal, list[str]]]:
    out: list[tuple[Principal, list[str]]] = []
    for t in range(spec.tenants):
        for u in range(spec.users_per_tenant):
            principal = Principal(tenant_id=f"t{t:04d}", user_id=f"u{u}", projects=frozenset({"p0", "p1"}))
            out += [(principal, ["domain:code"]), (principal, ["domain:code", "project:p0"])]
    return out[:count]


def tier_cache_bytes(store: BeliefStore, spec: Spec, count: int, *, shared: bool) -> dict[str, float]:
    """What ``count`` entries cost: measured growth per entry, the cache's estimate, beliefs held."""
    store.decoded.max_entries = 1_000_000 if shared else 0
    cache = TierCache(max_entries=1_000_000, max_age_s=3600)
    builder = ContextBuilder(store, RecallDefaults(), tier_cache=cache)
    combinations = _combinations(spec, count)
    if shared:  # the decode cache holds the beliefs first (no write version: the tier cache is unused)
        for principal, scopes in combinations:
            builder.build(principal, scopes, "")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for principal, scopes in combinations:
        builder.build(principal, scopes, "", write_version=1)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    held = [len(e.value.persona) + len(e.value.pinned) + len(e.value.questions) for e in cache._entries.values()]
    return {
        "entries": len(cache),
        "measured_bytes_per_entry": round(grown / len(cache)),
        "estimated_bytes_per_entry": round(cache.estimated_bytes / len(cache)),
        "beliefs_per_entry": round(statistics.fmean(held), 2),
        "max_beliefs_in_an_entry": max(held),
    }


def belief_bytes(spec: Spec, count: int = 2000) -> float:
    """Bytes of one decoded belief of the generated corpus, as recall reads it."""
    sources = []
    for i in range(count):
        source = orjson.loads(orjson.dumps(belief_at(i, spec, NOW).to_document()))
        for derived in ("change_log", "lifecycle", "content_hash"):
            source.pop(derived)
        sources.append(source)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [decode_stored(source) for source in sources]
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return grown / len(kept)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--namespace", default="cachemem")
    parser.add_argument("--load", action="store_true", help="load the corpus into the namespace first")
    parser.add_argument("--beliefs", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=200, help="100 beliefs a tenant at the default size")
    parser.add_argument("--entries", type=int, default=2000)
    args = parser.parse_args(argv)
    spec = Spec(tenants=args.tenants)
    client = build_client(Settings(opensearch_url=args.opensearch_url, opensearch_timeout_s=120))
    if args.load:
        apply_templates(client, args.namespace)
        load_range(client, BELIEFS.alias(args.namespace), 0, args.beliefs, spec, NOW, 2000)
    store = BeliefStore(client, args.namespace)
    print(f"decoded belief: {belief_bytes(spec):.0f} bytes")
    for shared in (False, True):
        figures = tier_cache_bytes(store, spec, args.entries, shared=shared)
        label = "beliefs shared with the decode cache" if shared else "beliefs counted as the entry's own"
        print(f"tier cache, {label}: {orjson.dumps(figures).decode()}")
    client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
