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

Bounds: ``max_entries`` (LRU) and ``max_age_s``: an entry older than that is recomputed even at the
same version. A write whose bump Redis refuses fails the request (the write stands, a retry is
safe), so the age only matters if Redis loses its data: its counters restart at 0 and could climb
back to a version an entry was computed at; the age bounds that window. When a process sees a
newer version of a tenant, it drops the tenant's older entries at once, so an erased belief's text
does not outlive the erase in the cache of a process that keeps serving the tenant.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from service.storage.beliefs import FilterTiers


@dataclass(frozen=True)
class _Entry:
    version: int
    stored_at: float
    tiers: FilterTiers


class TierCache:
    def __init__(self, *, max_entries: int, max_age_s: float):
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self._entries: OrderedDict[tuple[str, bytes], _Entry] = OrderedDict()
        self._by_tenant: dict[str, set[bytes]] = {}
        self._versions: dict[str, int] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_age_s > 0

    def bind(self, tenant_id: str, version: int | None) -> BoundTierCache | None:
        """The cache as seen by one recall of ``tenant_id`` at ``version``; None (no caching) when
        the version is unknown or the cache is off."""
        if version is None or not self.enabled:
            return None
        return BoundTierCache(self, tenant_id, version)

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, tenant_id: str, version: int, key: bytes) -> FilterTiers | None:
        with self._lock:
            self._observe(tenant_id, version)
            entry = self._entries.get((tenant_id, key))
            if entry is None or entry.version != version or time.monotonic() - entry.stored_at > self.max_age_s:
                self.misses += 1
                return None
            self._entries.move_to_end((tenant_id, key))
            self.hits += 1
            return entry.tiers

    def _put(self, tenant_id: str, version: int, key: bytes, tiers: FilterTiers) -> None:
        with self._lock:
            self._observe(tenant_id, version)
            if self._versions.get(tenant_id) != version:
                return  # a newer version was seen meanwhile: this result may predate that write
            self._entries[(tenant_id, key)] = _Entry(version, time.monotonic(), tiers)
            self._entries.move_to_end((tenant_id, key))
            self._by_tenant.setdefault(tenant_id, set()).add(key)
            while len(self._entries) > self.max_entries:
                (old_tenant, old_key), _ = self._entries.popitem(last=False)
                self._forget_key(old_tenant, old_key)

    def _observe(self, tenant_id: str, version: int) -> None:
        """A recall saw ``version``: if it is newer than any seen for the tenant, the tenant's
        older entries go (a recall that read an older version before a write changes nothing)."""
        seen = self._versions.get(tenant_id)
        if seen is not None and version <= seen:
            return
        self._versions[tenant_id] = version
        for key in self._by_tenant.pop(tenant_id, set()):
            self._entries.pop((tenant_id, key), None)

    def _forget_key(self, tenant_id: str, key: bytes) -> None:
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
