"""The process's in-memory caches as Prometheus metrics: lookups by outcome, evictions, entries
and estimated bytes (``tenure_cache_*``, docs/operations.md "Recall caches").

A recall looks up four or five caches (tiers, message analysis, vocabulary, decoded beliefs); a
metric call on each lookup would cost every recall, and in multi-process mode each is a write
to a shared file. So each cache counts in plain integers on its own path, and a
:class:`CachePublisher` adds what changed since its last publication to the process's counters
and sets its gauges: every few seconds (a task on the API's loop) and at each scrape of this
process. Counters of every process sum (multi-process mode); entries and bytes are the live
processes' sum. An operator sizes the caches from these: a part whose hits stay low while its
cache evicts is a cache too small for its traffic (or a part that cannot repeat: the relevant
tier of messages that never come twice).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from service.telemetry.metrics import CACHE_BYTES, CACHE_ENTRIES, CACHE_EVICTIONS, CACHE_LOOKUPS

# a cache's lookups when it does not tell parts apart
ALL_PARTS = "all"


@dataclass(frozen=True)
class CacheCounts:
    """What a cache counted since it was made (monotonic), and what it holds now.
    ``lookups``: (hits, misses) by part; ``estimated_bytes`` None: the cache is bounded by
    entries only and does not estimate its bytes."""

    lookups: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    evictions: int = 0
    entries: int = 0
    estimated_bytes: int | None = None


CacheSource = Callable[[], CacheCounts]


class CachePublisher:
    """Publishes the counts of named caches (``sources``) into the process's metrics; each
    publication adds only what grew since the previous one."""

    def __init__(self, sources: Mapping[str, CacheSource]):
        self._sources = dict(sources)
        self._published: dict[str, CacheCounts] = {name: CacheCounts() for name in self._sources}
        self._lock = threading.Lock()  # callable from any thread: one publication at a time

    def publish(self) -> None:
        with self._lock:
            for name, read in self._sources.items():
                now = read()
                self._add(name, self._published[name], now)
                self._published[name] = now

    async def run(self, interval_s: float) -> None:
        """Publish every ``interval_s`` seconds until cancelled (the API's lifespan task)."""
        while True:
            await asyncio.sleep(interval_s)
            self.publish()

    @staticmethod
    def _add(name: str, before: CacheCounts, now: CacheCounts) -> None:
        for part, (hits, misses) in now.lookups.items():
            hits_before, misses_before = before.lookups.get(part, (0, 0))
            for outcome, grown in (("hit", hits - hits_before), ("miss", misses - misses_before)):
                if grown > 0:
                    CACHE_LOOKUPS.labels(name, part, outcome).inc(grown)
        if now.evictions > before.evictions:
            CACHE_EVICTIONS.labels(name).inc(now.evictions - before.evictions)
        CACHE_ENTRIES.labels(name).set(now.entries)
        if now.estimated_bytes is not None:
            CACHE_BYTES.labels(name).set(now.estimated_bytes)
