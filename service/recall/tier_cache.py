"""The filter-tier cache: persona, pinned facts and open questions per query and tenant write version.

Those three tiers are filters without text: for one user and one scope list they change only when
the tenant's beliefs change, yet they cost 2.4-5 ms of OpenSearch CPU per recall (issue 16). This
cache keeps their result in the API process, keyed by

- the tenant and its **write version** (:mod:`service.write_versions`), read in the same
  Redis round trip as the rate limit; every belief write bumps it once the write is visible, so an
  entry computed before a write is never served after it, in any process;
- the **exact queries** that computed the tiers (routing and bodies, built by the chokepoint from
  the principal, its grants, the session's scopes and the budget): the same key can only mean the
  same answer. Two tenants, two users, or one user with two scope lists never share an entry.

The results are identical to an uncached recall by construction. Recall without a known write
version (Redis unreachable, a caller that has none) does not use the cache at all.

Bounds: ``max_entries`` and ``max_bytes`` (LRU, whichever is reached first) and ``max_age_s``: an
entry older than that is recomputed even at the same version. An entry's bytes are estimated when
it is stored, conservatively: its own overhead plus every belief it holds as if no other entry or
the decode cache shared it (they usually do), text by its actual size. Measured on the generated
corpus (docs/operations.md, "Recall caches"): ~10.0 KB estimated per entry of ~1.8 beliefs (9.7 KB
measured when nothing shares them), where the process grows by ~0.6 KB per entry while the decode
cache holds the same beliefs. The key is a BLAKE2b-256 digest of the queries (~2 KB of JSON).

A write whose bump Redis refuses fails the request (the write stands, a retry is safe), so the age
only matters if Redis loses its data: its counters restart at 0 and could climb back to a version
an entry was computed at; the age bounds that window. When a process sees a
newer version of a tenant, it drops the tenant's older entries at once, so an erased belief's text
does not outlive the erase in the cache of a process that keeps serving the tenant.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from dataclasses import dataclass

from service.domain.belief import Belief
from service.lru import BoundedLru
from service.storage.beliefs import FilterTiers

# Estimated bytes (measured with tracemalloc, docs/operations.md "Recall caches"): an entry's own
# structures (key digest, tuples, records, LRU and per-tenant index slots), and a decoded belief
# apart from its text (model, field dict, timestamps, enums, provenance, lists).
ENTRY_BYTES = 1_200
BELIEF_BYTES = 4_400


def estimated_bytes(tiers: FilterTiers) -> int:
    """What an entry holding ``tiers`` costs at most (no belief shared with anything else)."""
    return ENTRY_BYTES + sum(_belief_bytes(b) for b in (*tiers.persona, *tiers.pinned, *tiers.questions))


def _belief_bytes(belief: Belief) -> int:
    texts = (belief.content, belief.why_it_matters, belief.canonical_name, *belief.aliases)
    return BELIEF_BYTES + sum(sys.getsizeof(text) for text in texts)


def _digest(key: bytes) -> bytes:
    # collision-resistant: two different queries never share an entry (and the tenant is part of
    # the entry's key beside it)
    return hashlib.blake2b(key, digest_size=32).digest()


@dataclass(frozen=True)
class _Entry:
    version: int
    stored_at: float
    tiers: FilterTiers


class TierCache:
    def __init__(self, *, max_entries: int, max_age_s: float, max_bytes: int | None = None):
        self.max_age_s = max_age_s
        # (tenant, key digest) -> entry, weighed by its estimated bytes; an evicted entry leaves
        # the per-tenant index too (_evicted)
        self._entries: BoundedLru[tuple[str, bytes], _Entry] = BoundedLru(
            max_entries, max_weight=max_bytes, on_evict=self._evicted
        )
        self._by_tenant: dict[str, set[bytes]] = {}
        self._versions: dict[str, int] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def max_entries(self) -> int:
        return self._entries.max_entries

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        self._entries.max_entries = value

    @property
    def max_bytes(self) -> int | None:
        return self._entries.max_weight

    @max_bytes.setter
    def max_bytes(self, value: int | None) -> None:
        self._entries.max_weight = value

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_age_s > 0 and (self.max_bytes is None or self.max_bytes > 0)

    @property
    def estimated_bytes(self) -> int:
        """The estimated bytes of the entries held (bounded by ``max_bytes``)."""
        return self._entries.weight

    def bind(self, tenant_id: str, version: int | None) -> BoundTierCache | None:
        """The cache as seen by one recall of ``tenant_id`` at ``version``; None (no caching) when
        the version is unknown or the cache is off."""
        if version is None or not self.enabled:
            return None
        return BoundTierCache(self, tenant_id, version)

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, tenant_id: str, version: int, key: bytes) -> FilterTiers | None:
        key = _digest(key)
        with self._lock:
            self._observe(tenant_id, version)
            entry = self._entries.peek((tenant_id, key))  # a stale entry keeps its place
            if entry is None or entry.version != version or time.monotonic() - entry.stored_at > self.max_age_s:
                self.misses += 1
                return None
            self._entries.get((tenant_id, key))  # now the most recently used
            self.hits += 1
            return entry.tiers

    def _put(self, tenant_id: str, version: int, key: bytes, tiers: FilterTiers) -> None:
        key, size = _digest(key), estimated_bytes(tiers)
        if self.max_bytes is not None and size > self.max_bytes:
            return  # larger than the whole cache: never kept
        with self._lock:
            self._observe(tenant_id, version)
            if self._versions.get(tenant_id) != version:
                return  # a newer version was seen meanwhile: this result may predate that write
            self._by_tenant.setdefault(tenant_id, set()).add(key)
            self._entries.put((tenant_id, key), _Entry(version, time.monotonic(), tiers), size)

    def _observe(self, tenant_id: str, version: int) -> None:
        """A recall saw ``version``: if it is newer than any seen for the tenant, the tenant's
        older entries go (a recall that read an older version before a write changes nothing)."""
        seen = self._versions.get(tenant_id)
        if seen is not None and version <= seen:
            return
        self._versions[tenant_id] = version
        for key in self._by_tenant.pop(tenant_id, set()):
            self._entries.pop((tenant_id, key))

    def _evicted(self, entry_key: tuple[str, bytes], _entry: _Entry) -> None:
        """The LRU pushed an entry out (within ``_put``, under the lock): forget its key."""
        tenant_id, key = entry_key
        keys = self._by_tenant.get(tenant_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_tenant[tenant_id]
                self._versions.pop(tenant_id, None)


@dataclass(frozen=True)
class BoundTierCache:
    """:class:`TierCache` for one tenant and write version (the store's ``FilterTierMemo``)."""

    cache: TierCache
    tenant_id: str
    version: int

    def get(self, key: bytes) -> FilterTiers | None:
        return self.cache._get(self.tenant_id, self.version, key)

    def put(self, key: bytes, tiers: FilterTiers) -> None:
        self.cache._put(self.tenant_id, self.version, key, tiers)
