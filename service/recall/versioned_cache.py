"""A per-process cache of per-tenant answers, each valid for one tenant write version and a max age.

The recall caches (:mod:`service.recall.tier_cache`, :mod:`service.recall.analysis_cache`) share
these rules; what an entry holds, how its key is made and how its bytes are estimated stay with
each of them.

- An entry is stored and found under ``(tenant, key)`` and records the tenant's **write version**
  (:mod:`service.write_versions`) it was computed at; it is served only to a recall that read the
  same version, and only within ``max_age_s`` of being stored.
- When a process sees a newer version of a tenant, it drops all of the tenant's entries at once,
  so what they hold (an erased belief's text, a message's words) does not outlive the write in the
  cache of a process that keeps serving the tenant; an idle tenant's entries leave by the LRU or
  are never served again after ``max_age_s``.
- A result computed at an older version than one already seen is not stored (a recall that read
  its version before a write and finished after it).
- Bounds: ``max_entries`` and ``max_bytes`` (LRU, whichever is reached first), the bytes being each
  entry's estimate at the time it is stored (``weigh``); an entry heavier than the whole bound is
  never kept. ``max_entries``, ``max_age_s`` or ``max_bytes`` of 0 turns the cache off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from service.lru import BoundedLru, LruBound
from service.telemetry.cache_metrics import ALL_PARTS, CacheCounts

V = TypeVar("V")


@dataclass(frozen=True)
class _Entry(Generic[V]):
    version: int
    stored_at: float
    value: V


class TenantVersionedCache(Generic[V]):
    """Entries keyed by (tenant, ``key`` bytes), valid for one tenant write version and
    ``max_age_s``; see the module docstring. ``hits`` and ``misses`` count lookups (all parts)."""

    def __init__(
        self,
        *,
        max_entries: int,
        max_age_s: float,
        weigh: Callable[[V], int],
        max_bytes: int | None = None,
    ):
        self.max_age_s = max_age_s
        self._weigh = weigh
        # (tenant, key) -> entry, weighed by its estimated bytes; an evicted entry leaves the
        # per-tenant index too (_evicted)
        self._entries: BoundedLru[tuple[str, bytes], _Entry[V]] = BoundedLru(
            max_entries, max_weight=max_bytes, on_evict=self._evicted
        )
        self._by_tenant: dict[str, set[bytes]] = {}
        self._versions: dict[str, int] = {}
        self._lock = threading.Lock()
        # [hits, misses] by the part a lookup named (the tier cache's filters, relevant, linked)
        self._by_part: dict[str, list[int]] = {}

    # the LRU's bounds, settable at any time (they apply from the next store)
    max_entries = LruBound[int]("max_entries")
    max_bytes = LruBound[int | None]("max_weight")

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_age_s > 0 and (self.max_bytes is None or self.max_bytes > 0)

    @property
    def estimated_bytes(self) -> int:
        """The estimated bytes of the entries held (bounded by ``max_bytes``)."""
        return self._entries.weight

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tenant_id: str, version: int, key: bytes, part: str = ALL_PARTS) -> V | None:
        """The value stored under ``key`` for ``tenant_id`` at ``version``, if still young enough.
        ``part``: what is looked up, for the counts (:meth:`counts`)."""
        with self._lock:
            self._observe(tenant_id, version)
            counted = self._by_part.get(part)
            if counted is None:
                counted = self._by_part[part] = [0, 0]
            entry = self._entries.peek((tenant_id, key))  # a stale entry keeps its place
            if entry is None or entry.version != version or time.monotonic() - entry.stored_at > self.max_age_s:
                counted[1] += 1
                return None
            self._entries.get((tenant_id, key))  # now the most recently used
            counted[0] += 1
            return entry.value

    @property
    def hits(self) -> int:
        with self._lock:
            return sum(hits for hits, _ in self._by_part.values())

    @property
    def misses(self) -> int:
        with self._lock:
            return sum(misses for _, misses in self._by_part.values())

    def counts(self) -> CacheCounts:
        """Lookups by part, evictions, entries and estimated bytes (service/telemetry/cache_metrics.py)."""
        with self._lock:
            lookups = {part: (hits, misses) for part, (hits, misses) in self._by_part.items()}
            return CacheCounts(lookups, self._entries.evictions, len(self._entries), self._entries.weight)

    def holds(self, tenant_id: str, version: int, key: bytes) -> bool:
        """Whether :meth:`lookup` would find ``key`` (not counted as a lookup, recency unchanged)."""
        with self._lock:
            entry = self._entries.peek((tenant_id, key))
            return (
                entry is not None and entry.version == version and time.monotonic() - entry.stored_at <= self.max_age_s
            )

    def observe(self, tenant_id: str, version: int) -> None:
        """A recall of ``tenant_id`` read ``version``: as a lookup would, drop the tenant's entries
        if it is newer than any seen (for a cache this recall may not look up)."""
        with self._lock:
            self._observe(tenant_id, version)

    def store(self, tenant_id: str, version: int, key: bytes, value: V) -> None:
        """Keep ``value``, computed at ``version``, unless a newer version of the tenant was seen
        meanwhile or it is larger than the whole cache. A cache that is off keeps nothing: it does
        not weigh the value either (~12 µs for a relevant tier of 16 hits)."""
        if not self.enabled:
            return
        size = self._weigh(value)
        if self.max_bytes is not None and size > self.max_bytes:
            return  # larger than the whole cache: never kept
        with self._lock:
            self._observe(tenant_id, version)
            if self._versions.get(tenant_id) != version:
                return  # a newer version was seen meanwhile: this result may predate that write
            self._by_tenant.setdefault(tenant_id, set()).add(key)
            self._entries.put((tenant_id, key), _Entry(version, time.monotonic(), value), size)

    def _observe(self, tenant_id: str, version: int) -> None:
        """A recall saw ``version``: if it is newer than any seen for the tenant, the tenant's
        older entries go (a recall that read an older version before a write changes nothing)."""
        seen = self._versions.get(tenant_id)
        if seen is not None and version <= seen:
            return
        self._versions[tenant_id] = version
        for key in self._by_tenant.pop(tenant_id, set()):
            self._entries.pop((tenant_id, key))

    def _evicted(self, entry_key: tuple[str, bytes], _entry: _Entry[V]) -> None:
        """The LRU pushed an entry out (within ``store``, under the lock): forget its key."""
        tenant_id, key = entry_key
        keys = self._by_tenant.get(tenant_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_tenant[tenant_id]
                self._versions.pop(tenant_id, None)
