"""The tier cache: persona, pinned facts, open questions and the relevant tier per query and tenant
write version.

The three filter tiers are filters without text: for one user and one scope list they change only
when the tenant's beliefs change, yet they cost 2.4-5 ms of OpenSearch CPU per recall (issue 16).
The relevant tier is a text search, but with relevance matched from the tenant's own vocabulary
(exact weighted terms, :mod:`service.recall.vocabulary`) and the ``boolean`` similarity
(docs/scoring-independence.md) its hits, scores and order depend only on the query and the
tenant's own documents, and its sort ends on the belief id: at one tenant write version the same
relevant query has the same answer. (The Lucene fuzzy query, with vocabulary matching off, expands
over every tenant of the shard: its relevant tier is never cached.) Agent loops and client
retries recall for the same message again and again; with the analysis cache
(:mod:`service.recall.analysis_cache`) such a repeat sends nothing to OpenSearch. This cache keeps
the tiers' results in the API process, keyed by

- the tenant and its **write version** (:mod:`service.write_versions`), read in the same
  Redis round trip as the rate limit; every belief write bumps it once the write is visible, so an
  entry computed before a write is never served after it, in any process;
- the **exact queries** that computed the tiers (routing and bodies, built by the chokepoint from
  the principal, its grants, the session's scopes and the budget; for the relevant tier also the
  exact weighted clauses of the message): the same key can only mean the same answer. Two
  tenants, two users, or one user with two scope lists never share an entry. A user's persona
  (scoped ``user:universal`` whatever the session's scopes) is one entry, shared by all their
  scope lists, so a session in a new project searches only its pinned facts and open questions;
  those two tiers are a second entry per scope list, the relevant tier a third (one per message),
  so a new message reuses the first two; the beliefs a relation hit brings in (one read by id) a
  fourth, keyed by that read's query.
  ``explain`` recalls never use the relevant entries (their hits carry Lucene's explanation).

The results are identical to an uncached recall by construction, quarantined documents included
(an entry keeps the ids of the stored documents its tiers skipped, and a hit reports them again).
Recall without a known write version (Redis unreachable, a caller that has none) does not use the
cache at all. The entries' rules (version, age, bounds, dropping a tenant's entries when it writes)
are :class:`service.recall.versioned_cache.TenantVersionedCache`'s.

Two budgets. The filter tiers of a caller are looked up at every recall of their session and hit
~90 % of the time; the relevant tier and the relation hop's read are entries per message, which
hit only when a message comes again (agent loops, retries) and otherwise churn through. In one
LRU the per-message entries, larger and far more numerous, pushed the filter tiers out once many
sessions were active (1,000 sessions at 1M: 0.541 of filter lookups hit at 64 MB;
docs/benchmarks.md). So the filter tiers have this cache's own bounds and the per-message entries
a second cache beside it (:attr:`TierCache.messages`, its own ``message_max_bytes``), with the
same rules; a recall observes its version in both, so a write drops the tenant's entries from
both even when the recall looks up only one.

Bounds: ``max_entries`` and ``max_bytes`` (LRU, whichever is reached first) and ``max_age_s``: an
entry older than that is recomputed even at the same version. An entry's bytes are estimated when
it is stored, conservatively: its own overhead plus every belief it holds as if no other entry or
the decode cache shared it (they usually do), text by its actual size. Measured on the generated
corpus (docs/operations.md, "Recall caches"): ~10.0 KB estimated per entry of ~1.8 beliefs (9.7 KB
measured when nothing shares them), where the process grows by ~0.6 KB per entry while the decode
cache holds the same beliefs. A relevant entry is estimated the same way, plus its clause names
(:data:`CLAUSE_BYTES` each). The key is a BLAKE2b-256 digest of the queries (~2 KB of JSON).

After a write, the tenant's next recall would search its filter tiers again; the user who just
got an answer is usually the one whose next message comes. So each process remembers the
filter-tier searches of the tenants' recent recalls (at most :data:`QUERIES_PER_TENANT` per tenant,
the most recently used) and, when the API's listener hears of the write
(:mod:`service.recall.vocabulary_warmer`), :func:`refresh_filter_tiers` searches again those used
in the last ``tier_refresh_within_s`` seconds (all in one request) and stores them at the new
version, as the recall would have: the same searches (built by the chokepoint for that caller),
the same key, the same version rule. A caller whose grants changed since builds other searches, so
another key.

A write whose bump Redis refuses fails the request (the write stands, a retry is safe), so the age
only matters if Redis loses its data: its counters restart at 0 and could climb back to a version
an entry was computed at; the age bounds that window. When a process sees a
newer version of a tenant, it drops the tenant's older entries at once, so an erased belief's text
does not outlive the erase in the cache of a process that keeps serving the tenant.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

from service.domain.belief import Belief
from service.lru import BoundedLru
from service.recall.versioned_cache import TenantVersionedCache
from service.storage import calls
from service.storage.beliefs import (
    TIER_PARTS,
    BeliefStore,
    CachedTier,
    FilterTierQuery,
    FilterTiers,
    LinkedBeliefs,
    RelevantTier,
)

FILTERS = TIER_PARTS[FilterTiers]

# Estimated bytes (measured with tracemalloc, docs/operations.md "Recall caches"): an entry's own
# structures (key digest, tuples, records, LRU and per-tenant index slots), and a decoded belief
# apart from its text (model, field dict, timestamps, enums, provenance, lists).
ENTRY_BYTES = 1_200
BELIEF_BYTES = 4_400
# A relevant hit's scored record and each of its matched clause names (a small frozen dataclass
# and its name string, estimated high: the names are mostly the query's interned ``_name``s).
HIT_BYTES = 200
CLAUSE_BYTES = 200


def estimated_bytes(tiers: CachedTier) -> int:
    """What an entry holding ``tiers`` costs at most (no belief shared with anything else)."""
    if isinstance(tiers, RelevantTier):
        return ENTRY_BYTES + sum(
            HIT_BYTES + _belief_bytes(hit.belief) + CLAUSE_BYTES * len(hit.clauses) for hit in tiers.hits
        )
    if isinstance(tiers, LinkedBeliefs):
        return ENTRY_BYTES + sum(_belief_bytes(b) for b in tiers.beliefs)
    return ENTRY_BYTES + sum(_belief_bytes(b) for b in (*tiers.persona, *tiers.pinned, *tiers.questions))


def _belief_bytes(belief: Belief) -> int:
    texts = (belief.content, belief.why_it_matters, belief.canonical_name, *belief.aliases)
    return BELIEF_BYTES + sum(sys.getsizeof(text) for text in texts)


# The filter-tier searches remembered for a refresh: per tenant the most recently used ones (two
# per recent caller: the persona and the scope list's tiers), for this many tenants (~1-2 KB each
# as JSON: at most ~32 MB, far less for most deployments).
QUERIES_PER_TENANT = 8
QUERY_TENANTS = 2048


MessageTier = RelevantTier | LinkedBeliefs


class TierCache(TenantVersionedCache[FilterTiers]):
    """The filter tiers (this cache's own entries and bounds) and, in :attr:`messages`, the
    per-message entries (the relevant tier, the relation hop's read) under their own byte bound
    ``message_max_bytes`` (None: the entry count only); the entry count and age apply to both."""

    def __init__(
        self,
        *,
        max_entries: int,
        max_age_s: float,
        max_bytes: int | None = None,
        message_max_bytes: int | None = None,
    ):
        super().__init__(max_entries=max_entries, max_age_s=max_age_s, max_bytes=max_bytes, weigh=estimated_bytes)
        self.messages: TenantVersionedCache[MessageTier] = TenantVersionedCache(
            max_entries=max_entries, max_age_s=max_age_s, max_bytes=message_max_bytes, weigh=estimated_bytes
        )
        # tenant -> {key: (the filter tiers' searches, monotonic time of their last use)}
        self._queries: BoundedLru[str, dict[bytes, tuple[FilterTierQuery, float]]] = BoundedLru(QUERY_TENANTS)
        self._queries_lock = threading.Lock()

    def remember(self, tenant_id: str, query: FilterTierQuery) -> None:
        """Note that a recall of the tenant searched these filter tiers (a cached answer's use is
        :meth:`used`); the tenant keeps its :data:`QUERIES_PER_TENANT` most recently used."""
        with self._queries_lock:
            recent = self._queries.get(tenant_id)
            if recent is None:
                recent = {}
                self._queries.put(tenant_id, recent)
            recent[query.key] = (query, time.monotonic())
            while len(recent) > QUERIES_PER_TENANT:
                del recent[min(recent, key=lambda k: recent[k][1])]

    def used(self, tenant_id: str, key: bytes) -> None:
        """A recall found the filter tiers under ``key``: their searches were used now."""
        with self._queries_lock:
            recent = self._queries.peek(tenant_id)
            held = recent.get(key) if recent is not None else None
            if recent is not None and held is not None:
                recent[key] = (held[0], time.monotonic())

    def recent_queries(self, tenant_id: str, within_s: float) -> list[FilterTierQuery]:
        """The tenant's filter-tier searches used in the last ``within_s`` seconds."""
        since = time.monotonic() - within_s
        with self._queries_lock:
            recent = self._queries.peek(tenant_id) or {}
            return [query for query, used in recent.values() if used >= since]

    def bind(self, tenant_id: str, version: int | None) -> BoundTierCache | None:
        """The cache as seen by one recall of ``tenant_id`` at ``version``; None (no caching) when
        the version is unknown or both caches are off (one of them off: it keeps nothing)."""
        if version is None or not (self.enabled or self.messages.enabled):
            return None
        # the recall may look up only one of the two (an ``explain`` recall skips the relevant
        # entries): both drop the tenant's older entries now
        self.observe(tenant_id, version)
        self.messages.observe(tenant_id, version)
        return BoundTierCache(self, tenant_id, version)


@dataclass(frozen=True)
class BoundTierCache:
    """:class:`TierCache` for one tenant and write version (the store's ``TierMemo``); the keys are
    the store's digests of its queries (the tenant is part of the entry's key beside them)."""

    cache: TierCache
    tenant_id: str
    version: int

    def get(self, key: bytes, part: str) -> CachedTier | None:
        """``part``: :data:`~service.storage.beliefs.TIER_PARTS`' name for what is looked up, which
        also says which of the two caches holds it."""
        if part != FILTERS:
            return self.cache.messages.lookup(self.tenant_id, self.version, key, part)
        found = self.cache.lookup(self.tenant_id, self.version, key, part)
        if found is not None:
            self.cache.used(self.tenant_id, key)
        return found

    def put(self, key: bytes, tiers: CachedTier, query: FilterTierQuery | None = None) -> None:
        if not isinstance(tiers, FilterTiers):
            self.cache.messages.store(self.tenant_id, self.version, key, tiers)
            return
        self.cache.store(self.tenant_id, self.version, key, tiers)
        if query is not None and self.cache.enabled:  # a refresh needs the filter tiers kept
            self.cache.remember(self.tenant_id, query)


def refresh_filter_tiers(cache: TierCache, store: BeliefStore, tenant_id: str, *, within_s: float) -> int:
    """Search again the filter tiers of the tenant's recalls of the last ``within_s`` seconds in
    this process, at the tenant's current write version (read first, as a recall reads it before
    it searches), and keep them: after a write, the next recall of the same caller finds them
    instead of searching them. Only what a recall would have stored is stored (the same searches,
    the same key, the same version rule), so answers are unchanged. Searches already held at the
    current version are skipped (a notice without a write); the others go in one request. Returns
    how many entries were searched."""
    if store.versions is None or not cache.enabled:
        return 0
    wanted = cache.recent_queries(tenant_id, within_s)
    if not wanted:
        return 0
    version = store.versions.current(tenant_id)
    stale = [query for query in wanted if not cache.holds(tenant_id, version, query.key)]
    if stale:
        for query, tiers in zip(stale, calls.run(store.client, store.filter_tiers_reads(stale)), strict=True):
            cache.store(tenant_id, version, query.key, tiers)
    return len(stale)
