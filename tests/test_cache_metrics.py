"""The caches' counts as Prometheus metrics (service/telemetry/cache_metrics.py): each
publication adds what grew since the last one, once; gauges show what is held now."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from service.recall.versioned_cache import TenantVersionedCache
from service.telemetry.cache_metrics import ALL_PARTS, CacheCounts, CachePublisher


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_each_publication_adds_only_what_grew() -> None:
    name = f"probe-{uuid.uuid4().hex[:6]}"  # a cache of its own: other tests' publications do not count here
    counts = [CacheCounts({"filters": (3, 1), ALL_PARTS: (0, 2)}, evictions=1, entries=4, estimated_bytes=900)]
    publisher = CachePublisher({name: lambda: counts[-1]})

    publisher.publish()
    publisher.publish()  # nothing grew: nothing added
    assert _sample("tenure_cache_lookups_total", cache=name, part="filters", outcome="hit") == 3
    assert _sample("tenure_cache_lookups_total", cache=name, part="filters", outcome="miss") == 1
    assert _sample("tenure_cache_lookups_total", cache=name, part=ALL_PARTS, outcome="miss") == 2
    assert _sample("tenure_cache_evictions_total", cache=name) == 1
    assert _sample("tenure_cache_entries", cache=name) == 4
    assert _sample("tenure_cache_estimated_bytes", cache=name) == 900

    counts.append(CacheCounts({"filters": (5, 1), "relevant": (0, 7)}, evictions=3, entries=2, estimated_bytes=400))
    publisher.publish()
    assert _sample("tenure_cache_lookups_total", cache=name, part="filters", outcome="hit") == 5
    assert _sample("tenure_cache_lookups_total", cache=name, part="filters", outcome="miss") == 1
    assert _sample("tenure_cache_lookups_total", cache=name, part="relevant", outcome="miss") == 7
    assert _sample("tenure_cache_evictions_total", cache=name) == 3
    assert (_sample("tenure_cache_entries", cache=name), _sample("tenure_cache_estimated_bytes", cache=name)) == (
        2,
        400,
    )


def test_a_versioned_cache_counts_lookups_by_part_and_evictions() -> None:
    cache: TenantVersionedCache[str] = TenantVersionedCache(max_entries=2, max_age_s=60, weigh=len, max_bytes=1000)
    assert cache.lookup("t1", 1, b"a", "filters") is None
    cache.store("t1", 1, b"a", "xx")
    assert cache.lookup("t1", 1, b"a", "filters") == "xx"
    assert cache.lookup("t1", 2, b"a", "relevant") is None  # a newer version: the entry is stale
    for key in (b"b", b"c", b"d"):
        cache.store("t1", 2, key, "yyy")
    counts = cache.counts()
    assert counts.lookups == {"filters": (1, 1), "relevant": (0, 1)}
    assert (counts.evictions, counts.entries, counts.estimated_bytes) == (1, 2, 6)
