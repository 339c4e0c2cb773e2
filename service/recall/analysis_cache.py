"""The analysis cache: a message's analysis by OpenSearch's search analyzers, per tenant and text.

Recall by vocabulary (:mod:`service.recall.vocabulary`) splits the message with the index's own
search analyzers, one ``_mtermvectors`` round trip per recall
(:meth:`service.storage.vocabulary.VocabularyStore.analyze`). Agent loops through the proxy (one
recall per tool-call iteration) and client retries recall for the same latest user message again
and again; this cache keeps each text's analysis (the per-field token positions of its plan's
artificial documents) in the API process, so a repeat is not analysed again.

**Why it is exact.** An analysis is a function of the text and the analyzers alone: term vectors of
an artificial document with positions only, no term statistics, no stored document involved. The
entry's key holds both: a BLAKE2b-256 digest of the text, and the fingerprint of the analyzers in
use (:attr:`service.storage.vocabulary.NameMapping.fingerprint`: the concrete index behind the
beliefs alias, whose settings define the analyzers, and every field's search analyzer), so an
analysis made under one mapping is never used under another: after ``tenure reindex beliefs`` or a
template change (a new index) the key changes. The plan of a text (which analyses it needs) is
made from the same text and analyzers, so it is the same too. The clauses rendered from a cached
analysis are identical to those of a fresh one. The mapping itself is read once a minute at most
(``VocabularyStore.mapping_reads``): within a minute of an alias move a process still analyses,
cached or not, with the field analyzers it read before it.

**What is held, and for how long.** Each entry holds the words of a message (its tokens by
position, not the text itself) in memory, keyed per tenant and user: two users never share an
entry, even for the same text (no timing side channel between tenants or colleagues). Entries
follow the tenant write version like the tier cache's
(:class:`service.recall.versioned_cache.TenantVersionedCache`): an entry is used only at the
version it was made at, all of a tenant's entries are dropped when the process sees a newer version
(any belief write or erase of the tenant), and none is used after ``max_age_s``. Recall without a
known write version does not use the cache. Bounds: entries and bytes (LRU, whichever first).

**Held as one bytes object.** An entry is the analysis marshalled (``marshal``: tuples, dicts and
strings, written and read in C), not its tuples: a long message's analysis is ~1,000 tuples of
tokens, and every one of them kept by the cache was walked by the next generation-2 collection
before the freezer (:mod:`service.process`) froze it. Nearly every message is new, so the cache
added tens of thousands of such tuples a second at 300 recalls/s, ~10 ms of each API worker's paced
collection, a pause every recall on that worker waited out (docs/benchmarks.md, issue 16). A bytes
object holds no reference the collector follows. A repeat pays one ``marshal.loads``; an entry's
size is its bytes', exactly.
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from service.recall.versioned_cache import TenantVersionedCache
from service.storage.local_analysis import Positions

# One text's analysis: what VocabularyStore.analyze answers for each request of the text's plan.
Analysis = tuple[dict[str, Positions], ...]

# An entry's own structures beside its bytes (key, record, LRU and per-tenant index slots).
ENTRY_BYTES = 600


def encode(analysis: Sequence[dict[str, Positions]]) -> bytes:
    """An analysis as the cache keeps it (``surrogatepass`` is marshal's own: any str round-trips)."""
    return marshal.dumps(tuple(analysis))


def decode(encoded: bytes) -> Analysis:
    analysis: Analysis = marshal.loads(encoded)  # noqa: S302 - only ever bytes this process encoded
    return analysis


def entry_bytes(encoded: bytes) -> int:
    """What an entry holding ``encoded`` costs: its bytes object and its own structures."""
    return ENTRY_BYTES + sys.getsizeof(encoded)


def text_key(fingerprint: bytes, user_id: str, text: str) -> bytes:
    """The entry's key within its tenant: the analyzers' fingerprint and a digest of the user and
    the text (collision-resistant: two texts, or one text of two users, never share an entry; the
    user id never holds the separator). ``surrogatepass``: any str encodes, and two different strs
    never encode alike."""
    keyed = f"{user_id}\x00{text}".encode("utf-8", "surrogatepass")
    return fingerprint + hashlib.blake2b(keyed, digest_size=32).digest()


class AnalysisCache(TenantVersionedCache[bytes]):
    def __init__(self, *, max_entries: int, max_age_s: float, max_bytes: int | None = None):
        super().__init__(max_entries=max_entries, max_age_s=max_age_s, max_bytes=max_bytes, weigh=entry_bytes)

    def bind(self, tenant_id: str, user_id: str, version: int | None, fingerprint: bytes) -> BoundAnalysisCache | None:
        """The cache as seen by one recall of ``user_id`` of ``tenant_id`` at ``version`` with the
        analyzers of ``fingerprint``; None (no caching) when the version is unknown or the cache
        is off."""
        if version is None or not self.enabled:
            return None
        return BoundAnalysisCache(self, tenant_id, user_id, version, fingerprint)


@dataclass(frozen=True)
class BoundAnalysisCache:
    """:class:`AnalysisCache` for one user of a tenant, write version and analyzer fingerprint."""

    cache: AnalysisCache
    tenant_id: str
    user_id: str
    version: int
    fingerprint: bytes

    def get(self, text: str) -> Analysis | None:
        encoded = self.cache.lookup(self.tenant_id, self.version, text_key(self.fingerprint, self.user_id, text))
        return None if encoded is None else decode(encoded)

    def put(self, text: str, analysis: Sequence[dict[str, Positions]]) -> None:
        key = text_key(self.fingerprint, self.user_id, text)
        self.cache.store(self.tenant_id, self.version, key, encode(analysis))
