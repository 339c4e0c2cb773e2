"""Relevance matching from the tenant's own vocabulary (issue 16, item 1).

The Lucene query (:func:`service.storage.queries.relevance_clauses`) expands every query word of 4+
characters into at most 20 indexed terms one edit away, drawn from the whole shard, i.e. from
every tenant routed to it: other tenants' terms can crowd a tenant's own out of the 20, and each
expansion costs a Levenshtein automaton per word and field. Here the same semantics are computed
from the caller's tenant alone, and OpenSearch receives an exact weighted term query:

1. the tenant's vocabulary: the terms OpenSearch's index analysis produced for its names and
   aliases (whole units, per searched field), with prefix-guarded deletion keys for the fuzzy
   fields; kept in an LRU of active tenants, valid for one tenant write version (Redis);
2. the query text analysed by the very search analyzers of the Lucene query (one term-vector
   round trip, :class:`service.storage.vocabulary.VocabularyStore`);
3. for each query word of 4+ characters, the vocabulary terms with the same first two characters
   and at most one edit (insertion, deletion, substitution, adjacent transposition) after them,
   each weighted like Lucene's ``FuzzyQuery`` (1 for the word itself, ``1 - 1/min(len)`` in float32
   for one edit), the best 20 kept in Lucene's order; shorter words and 2-3 word shingles match
   only terms the vocabulary holds;
4. clauses nested exactly like the match queries they replace (same boosts 14/14/5, same
   ``_name``s, shingles starting at one word as alternatives), so OpenSearch adds up the same
   floats and returns the same scores; the threshold and the access filters are unchanged.

A cold tenant is built on its first recall (measured: :attr:`TenantVocabulary.build_ms`), so it
answers correctly from the first request.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from service.config import RecallDefaults
from service.domain.principal import Principal
from service.domain.text import has_hangul, has_unspaced_script
from service.errors import StoreUnavailable
from service.storage import calls, queries
from service.storage.beliefs import BeliefStore
from service.storage.calls import Reads
from service.storage.queries import TermWeights, WeightedClause
from service.storage.vocabulary import AnalysisRequest, Positions, TenantTerms, VocabularyStore
from service.write_versions import Changes, TenantWriteVersions

log = logging.getLogger(__name__)

# The Lucene query's fuzziness, restated as numbers: AUTO:4,10000 is one edit from 4 code points.
MIN_FUZZY_LENGTH = 4
# A cached vocabulary unused this long leaves memory (checked on every recall, oldest first).
MAX_IDLE_S = 600.0
# Terms shorter than this can never be one edit from a word of MIN_FUZZY_LENGTH.
_MIN_FUZZY_TERM = MIN_FUZZY_LENGTH - 1

WORD_FIELDS = ("canonical_name", "aliases")
CJK_LATIN_FIELDS = ("canonical_name.cjk_latin", "aliases.cjk_latin")
FUZZY_FIELDS = WORD_FIELDS + CJK_LATIN_FIELDS
SPACED_PHRASE_FIELDS = ("canonical_name.phrase", "aliases.shingle")
CJK_EXACT_FIELDS = ("canonical_name.cjk", "aliases.cjk", "canonical_name.cjk_shingle", "aliases.cjk_shingle")
# Korean text also runs the `.ko` clauses (queries.unspaced_clauses): exact words and shingles
KO_FIELDS = ("canonical_name.ko", "aliases.ko", "canonical_name.ko_shingle", "aliases.ko_shingle")
VOCABULARY_FIELDS = FUZZY_FIELDS + SPACED_PHRASE_FIELDS + CJK_EXACT_FIELDS + KO_FIELDS
# Which field of the artificial query document carries which analysis (the analyzer is what
# counts: a per-field analyzer replaces the field's own).
_ALIAS_SHINGLES_VIA = "canonical_name"
_HEAD_WORDS_VIA = "aliases"


# ----------------------------------------------------------------------------- float32


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def _f32_ulp_neighbours(x: float) -> tuple[float, float]:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    below = struct.unpack("<f", struct.pack("<I", bits - 1))[0] if bits > 0 else x
    above = struct.unpack("<f", struct.pack("<I", bits + 1))[0]
    return float(below), float(above)


def _f32_of(q: Fraction) -> float:
    """The float32 nearest to ``q`` (ties to even), as Java's ``(float) a / (float) b`` gives."""
    guess = _f32(float(q))
    below, above = _f32_ulp_neighbours(guess)

    def key(v: float) -> tuple[Fraction, int]:
        even = struct.unpack("<I", struct.pack("<f", v))[0] & 1
        return abs(Fraction(v) - q), even

    return min((below, guess, above), key=key)


def fuzzy_factor(edits: int, term_length: int, word_length: int) -> float:
    """Lucene ``FuzzyTermsEnum``'s term boost: ``1.0f - (float) ed / (float) min(len)`` in float32."""
    if edits == 0:
        return 1.0
    ratio = _f32_of(Fraction(edits, min(term_length, word_length)))
    return _f32(1.0 - ratio)  # exact in double, one rounding to float32 like Java's float subtraction


# ------------------------------------------------------------------------ one edit


def edits_within_one(a: str, b: str) -> int | None:
    """0 or 1 if ``a`` and ``b`` are at most one insertion, deletion, substitution or adjacent
    transposition apart (Damerau-Levenshtein as Lucene's automata count it), else None."""
    if a == b:
        return 0
    la, lb = len(a), len(b)
    if abs(la - lb) > 1:
        return None
    i = 0
    shorter = min(la, lb)
    while i < shorter and a[i] == b[i]:
        i += 1
    if la == lb:
        if a[i + 1 :] == b[i + 1 :]:
            return 1
        if i + 1 < la and a[i] == b[i + 1] and a[i + 1] == b[i] and a[i + 2 :] == b[i + 2 :]:
            return 1
        return None
    longer, short = (a, b) if la > lb else (b, a)
    return 1 if longer[i + 1 :] == short[i:] else None


def _deletion_keys(term: str) -> set[str]:
    """The term and every one-character deletion after the guarded prefix: two words one edit
    apart (with the same prefix) always share at least one key."""
    keys = {term}
    for i in range(queries.PREFIX_LENGTH, len(term)):
        keys.add(term[:i] + term[i + 1 :])
    return keys


# ---------------------------------------------------------------------- vocabulary


@dataclass(frozen=True)
class FieldVocabulary:
    terms: frozenset[str]
    deletions: dict[str, tuple[str, ...]] = field(default_factory=dict)  # fuzzy fields only
    fuzzy_matched: bool = False  # a field the query matches with one edit of fuzz (has deletion keys)
    size: int = -1  # estimated bytes (computed once, then kept up to date by ``updated``)

    def __post_init__(self) -> None:
        if self.size < 0:
            size = sum(_term_bytes(t) for t in self.terms)
            size += sum(_key_bytes(k) + 8 * len(v) for k, v in self.deletions.items())
            object.__setattr__(self, "size", size)

    @classmethod
    def build(cls, terms: Iterable[str], *, fuzzy: bool) -> FieldVocabulary:
        frozen = frozenset(terms)
        if not fuzzy:
            return cls(frozen)
        index: dict[str, list[str]] = {}
        for term in frozen:
            if len(term) >= _MIN_FUZZY_TERM:
                for key in _deletion_keys(term):
                    index.setdefault(key, []).append(term)
        return cls(frozen, {k: tuple(v) for k, v in index.items()}, fuzzy_matched=True)

    def updated(self, added: frozenset[str], removed: frozenset[str]) -> FieldVocabulary:
        """This vocabulary with ``added`` terms in and ``removed`` terms out (``added`` new to it,
        ``removed`` all in it): a new object, so readers of the old one on other threads are
        undisturbed; only the deletion keys of those terms are touched."""
        terms = (self.terms - removed) | added
        size = self.size + sum(_term_bytes(t) for t in added) - sum(_term_bytes(t) for t in removed)
        if not self.fuzzy_matched:
            return FieldVocabulary(terms, size=size)
        index = dict(self.deletions)
        for term in removed:
            for key in _deletion_keys(term) if len(term) >= _MIN_FUZZY_TERM else ():
                left = tuple(t for t in index.get(key, ()) if t != term)
                size -= 8
                if left:
                    index[key] = left
                elif index.pop(key, None) is not None:
                    size -= _key_bytes(key)
        for term in added:
            for key in _deletion_keys(term) if len(term) >= _MIN_FUZZY_TERM else ():
                held = index.get(key, ())
                size += 8 + (0 if held else _key_bytes(key))
                index[key] = (*held, term)
        return FieldVocabulary(terms, index, fuzzy_matched=True, size=size)

    def exact(self, token: str) -> TermWeights:
        return ((token, 1.0),) if token in self.terms else ()

    def fuzzy(self, token: str) -> TermWeights:
        """What ``FuzzyQuery(token, AUTO:4, prefix 2, max 20 expansions)`` rewrites to, over this
        vocabulary alone."""
        n = len(token)
        if n < MIN_FUZZY_LENGTH:
            return self.exact(token)
        prefix = token[: queries.PREFIX_LENGTH]
        found: dict[str, float] = {}
        for key in _deletion_keys(token):
            for term in self.deletions.get(key, ()):
                if term in found or term[: queries.PREFIX_LENGTH] != prefix:
                    continue
                edits = edits_within_one(term[queries.PREFIX_LENGTH :], token[queries.PREFIX_LENGTH :])
                if edits is not None:
                    found[term] = fuzzy_factor(edits, len(term), n)
        # Lucene's TopTermsRewrite keeps the best boosts, ties to the smaller term (UTF-8 order)
        ranked = sorted(found.items(), key=lambda tw: (-tw[1], tw[0].encode()))
        return tuple(ranked[: queries.MAX_FUZZY_EXPANSIONS])

    def approx_bytes(self) -> int:
        return self.size


def _term_bytes(term: str) -> int:
    return 49 + len(term.encode())


def _key_bytes(key: str) -> int:
    return 89 + len(key.encode())


def _document_bytes(terms: DocumentTerms) -> int:
    """A document's term sets (pointers to strings held anyway, a set per field)."""
    return 120 + sum(216 + 8 * len(held) for held in terms.values())


# field -> terms, for one document
DocumentTerms = Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class TenantVocabulary:
    """A tenant's vocabulary at one write version: per searched field the terms and their
    deletion keys, and per document its terms (so a later write re-reads only its documents:
    :meth:`updated`). ``counts``: per field, how many documents hold each term."""

    tenant_id: str
    version: int
    fields: dict[str, FieldVocabulary]
    documents: int
    build_ms: float
    approx_bytes: int
    by_document: Mapping[str, DocumentTerms] = field(default_factory=dict)
    counts: Mapping[str, Counter[str]] = field(default_factory=dict)
    document_bytes: int = 0

    @classmethod
    def build(cls, store: VocabularyStore, principal: Principal, version: int) -> Reads[TenantVocabulary]:
        started = time.perf_counter()
        read = yield from store.tenant_terms(principal, VOCABULARY_FIELDS)
        counts = {name: Counter[str]() for name in read.fields}
        for document in read.by_document.values():
            for name, held in document.items():
                counts[name].update(held)
        # Sub-fields with the same index analyzer hold the same terms (canonical_name and its
        # phrase sub-field; often the .cjk ones too): built and counted once, shared.
        shared: dict[tuple[frozenset[str], bool], FieldVocabulary] = {}
        fields: dict[str, FieldVocabulary] = {}
        for name, terms in read.fields.items():
            key = (frozenset(terms), name in FUZZY_FIELDS)
            if key not in shared:
                shared[key] = FieldVocabulary.build(key[0], fuzzy=key[1])
            fields[name] = shared[key]
        document_bytes = sum(_document_bytes(terms) for terms in read.by_document.values())
        return cls(
            principal.tenant_id,
            version,
            fields,
            len(read.by_document),
            (time.perf_counter() - started) * 1000,
            _fields_bytes(fields) + document_bytes,
            dict(read.by_document),
            counts,
            document_bytes,
        )

    def updated(self, version: int, read: TenantTerms, started: float) -> TenantVocabulary:
        """This vocabulary after a write: the documents in ``read`` replace their old terms, the
        ones in ``read.missing`` are gone. Only terms whose document count crosses zero change
        a field, and a field (or sub-fields sharing one) without such a term is kept as is."""
        by_document = dict(self.by_document)
        document_bytes = self.document_bytes
        counts = {name: Counter(held) for name, held in self.counts.items()}
        before: dict[str, set[str]] = {name: set() for name in counts}
        after: dict[str, set[str]] = {name: set() for name in counts}
        for doc_id in [*read.by_document, *read.missing]:
            old_terms = by_document.pop(doc_id, None)
            if old_terms is not None:
                document_bytes -= _document_bytes(old_terms)
                for name, held in old_terms.items():
                    counts[name].subtract(held)
                    before[name].update(held)
            new_terms = read.by_document.get(doc_id)
            if new_terms is not None:
                document_bytes += _document_bytes(new_terms)
                by_document[doc_id] = new_terms
                for name, held in new_terms.items():
                    counts[name].update(held)
                    after[name].update(held)
        fields: dict[str, FieldVocabulary] = {}
        redone: dict[tuple[int, frozenset[str], frozenset[str]], FieldVocabulary] = {}
        for name, old in self.fields.items():
            tally = counts.get(name, Counter[str]())
            added = frozenset(t for t in after.get(name, ()) if t not in old.terms and tally[t] > 0)
            removed = frozenset(t for t in before.get(name, ()) if tally[t] <= 0)
            for term in removed:
                del tally[term]
            if not added and not removed:
                fields[name] = old
                continue
            key = (id(old), added, removed)  # sub-fields that shared one vocabulary still share
            if key not in redone:
                redone[key] = old.updated(added, removed)
            fields[name] = redone[key]
        return replace(
            self,
            version=version,
            fields=fields,
            documents=len(by_document),
            build_ms=(time.perf_counter() - started) * 1000,
            approx_bytes=_fields_bytes(fields) + document_bytes,
            by_document=by_document,
            counts=counts,
            document_bytes=document_bytes,
        )

    def field(self, name: str) -> FieldVocabulary:
        return self.fields.get(name) or FieldVocabulary(frozenset())


def _fields_bytes(fields: Mapping[str, FieldVocabulary]) -> int:
    """Each field vocabulary once (sub-fields may share one)."""
    return sum(f.size for f in {id(f): f for f in fields.values()}.values())


@dataclass
class CacheStats:
    hits: int = 0
    builds: int = 0
    build_ms_total: float = 0.0
    build_ms_max: float = 0.0
    evictions: int = 0
    updates: int = 0  # vocabularies brought forward by re-reading only the written documents
    update_ms_total: float = 0.0


def _continues(entry: TenantVocabulary, changes: Changes | None, version: int | None) -> bool:
    """Whether ``changes`` lead exactly from ``entry``'s version to ``version`` and name every
    document written in between."""
    return (
        changes is not None
        and changes.doc_ids is not None
        and changes.since == entry.version
        and changes.until == version
    )


class VocabularyCache:
    """The vocabularies of the most recently active tenants, bounded in count and in (estimated)
    memory. An entry is used only while the tenant's write version is the one it was built at;
    without a version source (``versions=None``) nothing is kept and every recall builds afresh."""

    def __init__(
        self,
        store: VocabularyStore,
        versions: TenantWriteVersions | None,
        *,
        max_tenants: int = 1000,
        max_bytes: int = 256 * 1024 * 1024,
    ):
        self.store = store
        self.versions = versions
        self.max_tenants = max_tenants
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, TenantVocabulary] = OrderedDict()
        self._used: dict[str, float] = {}  # monotonic time of each entry's last use
        self._bytes = 0

    def get(self, principal: Principal, version: int | None = None) -> TenantVocabulary:
        """``version``: the tenant's write version if the caller already read it (the API reads
        it with the rate limit, in the same Redis round trip); else it is read here."""
        if version is None:
            version = self._version(principal.tenant_id)
        return calls.run(self.store.client, self.lookup(principal, version, self.changes(principal.tenant_id, version)))

    def changes(self, tenant_id: str, version: int | None) -> Changes | None:
        """What was written since the tenant's cached vocabulary, when it is behind ``version``
        (one Redis read, only then); None: nothing to bring forward."""
        since = self.behind(tenant_id, version)
        if since is None or version is None or self.versions is None:
            return None
        return self.versions.changes(tenant_id, since, version)

    async def achanges(self, tenant_id: str, version: int | None) -> Changes | None:
        """:meth:`changes` through the event loop's Redis client."""
        since = self.behind(tenant_id, version)
        if since is None or version is None or self.versions is None:
            return None
        return await self.versions.achanges(tenant_id, since, version)

    def behind(self, tenant_id: str, version: int | None) -> int | None:
        """The version of the tenant's cached vocabulary when it is older than ``version`` (the
        caller then reads the change log from there: :meth:`TenantWriteVersions.changes`)."""
        if version is None:
            return None
        with self._lock:
            entry = self._entries.get(tenant_id)
        return entry.version if entry is not None and entry.version < version else None

    def lookup(
        self, principal: Principal, version: int | None, changes: Changes | None = None
    ) -> Reads[TenantVocabulary]:
        """The tenant's vocabulary at ``version`` (read by the caller): cached; or the cached one
        brought forward by re-reading only the documents ``changes`` names (a write since); or
        built. ``None`` (the version is unknown): built for this request and not kept."""
        entry: TenantVocabulary | None = None
        if version is not None:
            with self._lock:
                self._drop_idle()
                entry = self._entries.get(principal.tenant_id)
                if entry is not None and entry.version == version:
                    self._entries.move_to_end(principal.tenant_id)
                    self._used[principal.tenant_id] = time.monotonic()
                    self.stats.hits += 1
                    return entry
        if entry is not None and _continues(entry, changes, version):
            assert changes is not None and changes.doc_ids is not None and version is not None
            updated = yield from self._update(principal, entry, changes.doc_ids, version)
            return updated
        built = yield from TenantVocabulary.build(self.store, principal, version or 0)
        with self._lock:
            self.stats.builds += 1
            self.stats.build_ms_total += built.build_ms
            self.stats.build_ms_max = max(self.stats.build_ms_max, built.build_ms)
            if version is not None:
                self._put(built)
        log.debug("vocabulary of %s: %d documents, %.1f ms", principal.tenant_id, built.documents, built.build_ms)
        return built

    def _update(
        self, principal: Principal, entry: TenantVocabulary, doc_ids: frozenset[str], version: int
    ) -> Reads[TenantVocabulary]:
        started = time.perf_counter()
        # only the tenant's own documents (the log is the tenant's; this is the second wall)
        mine = sorted(d for d in doc_ids if d.startswith(f"{principal.tenant_id}:"))
        read = yield from self.store.document_terms(principal, mine, VOCABULARY_FIELDS)
        updated = entry.updated(version, read, started)
        with self._lock:
            self.stats.updates += 1
            self.stats.update_ms_total += updated.build_ms
            current = self._entries.get(principal.tenant_id)
            if current is None or current.version < version:
                self._put(updated)
        return updated

    def _version(self, tenant_id: str) -> int | None:
        if self.versions is None:
            return None
        try:
            return self.versions.current(tenant_id)
        except StoreUnavailable:
            log.warning("tenant write version unreadable; building the vocabulary without caching it")
            return None

    def _drop_idle(self) -> None:
        """Drop the least recently used entry once it has been idle for MAX_IDLE_S: an erased
        alias stays in an idle tenant's stale entry no longer than that (or until its next recall,
        which sees the new version)."""
        if self._entries:
            tenant, oldest = next(iter(self._entries.items()))
            if time.monotonic() - self._used.get(tenant, 0.0) > MAX_IDLE_S:
                self._entries.pop(tenant)
                self._used.pop(tenant, None)
                self._bytes -= oldest.approx_bytes
                self.stats.evictions += 1

    def _put(self, entry: TenantVocabulary) -> None:
        old = self._entries.pop(entry.tenant_id, None)
        if old is not None:
            self._bytes -= old.approx_bytes
        if entry.approx_bytes > self.max_bytes:
            return  # larger than the whole budget: used for this request only
        self._entries[entry.tenant_id] = entry
        self._used[entry.tenant_id] = time.monotonic()
        self._bytes += entry.approx_bytes
        while len(self._entries) > self.max_tenants or self._bytes > self.max_bytes:
            tenant, evicted = self._entries.popitem(last=False)
            self._used.pop(tenant, None)
            self._bytes -= evicted.approx_bytes
            self.stats.evictions += 1

    def entries(self) -> list[TenantVocabulary]:
        """The cached vocabularies, least recently used first (for measurements)."""
        with self._lock:
            return list(self._entries.values())

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


# -------------------------------------------------------------------------- matcher


@dataclass(frozen=True)
class _Plan:
    """Which analyses one query text needs, and how they become clauses."""

    requests: list[AnalysisRequest]
    unspaced: bool
    has_tail: bool


class VocabularyMatcher:
    """The relevance clauses of one recall, computed from the caller's tenant vocabulary."""

    def __init__(self, store: VocabularyStore, cache: VocabularyCache):
        self.store = store
        self.cache = cache

    @classmethod
    def for_store(cls, beliefs: BeliefStore, defaults: RecallDefaults) -> VocabularyMatcher:
        """A matcher over ``beliefs``' index whose cache follows the store's write versions (a
        store without them gets a matcher that builds on every recall)."""
        reader = VocabularyStore(beliefs.client, beliefs.alias)
        cache = VocabularyCache(
            reader,
            beliefs.versions,
            max_tenants=defaults.vocabulary_cache_tenants,
            max_bytes=defaults.vocabulary_cache_mb * 1024 * 1024,
        )
        return cls(reader, cache)

    def clauses(self, principal: Principal, text: str, *, version: int | None = None) -> list[dict[str, Any]]:
        """Exact weighted term clauses equivalent to ``queries.relevance_clauses(text)`` for this
        tenant. Empty when nothing in the tenant's vocabulary can match. ``version``: the tenant's
        write version when the caller has it (no Redis read here then)."""
        return self.clauses_many(principal, [text], version=version)[0]

    def clauses_reads(
        self, principal: Principal, text: str, *, version: int | None, changes: Changes | None = None
    ) -> Reads[list[dict[str, Any]]]:
        """:meth:`clauses` as requests (recall's own path, sync or async); ``version`` None: the
        vocabulary is built for this recall and not cached; ``changes``: what was written since
        the cached vocabulary (:meth:`VocabularyCache.changes`), to bring it forward."""
        many = yield from self._clauses_reads(principal, [text], version, changes)
        return many[0]

    def clauses_many(
        self, principal: Principal, texts: Sequence[str], *, version: int | None = None
    ) -> list[list[dict[str, Any]]]:
        """Several texts of one tenant in one analysis round trip (the differential test)."""
        if version is None:
            version = self.current_version(principal.tenant_id)
        changes = self.cache.changes(principal.tenant_id, version)
        return calls.run(self.store.client, self._clauses_reads(principal, texts, version, changes))

    def current_version(self, tenant_id: str) -> int | None:
        """The tenant's write version read from Redis (None: unknown, nothing is cached), for a
        caller that did not read it with the rate limit."""
        return self.cache._version(tenant_id)

    def _clauses_reads(
        self, principal: Principal, texts: Sequence[str], version: int | None, changes: Changes | None
    ) -> Reads[list[list[dict[str, Any]]]]:
        vocabulary = yield from self.cache.lookup(principal, version, changes)
        analyzers = yield from self.store.search_analyzers_reads()
        plans = [self._plan(text, analyzers) for text in texts]
        analyses = yield from self.store.analyze(principal, [r for p in plans for r in p.requests])
        out: list[list[dict[str, Any]]] = []
        at = 0
        for plan in plans:
            mine = analyses[at : at + len(plan.requests)]
            at += len(plan.requests)
            out.append(self._render(plan, mine, vocabulary))
        return out

    def _plan(self, text: str, analyzers: dict[str, str]) -> _Plan:
        both = {"canonical_name": text, "aliases": text}
        if has_unspaced_script(text):
            wanted = CJK_LATIN_FIELDS + CJK_EXACT_FIELDS + (KO_FIELDS if has_hangul(text) else ())
            # a field the index does not have yet (before `tenure reindex beliefs`) matches nothing
            cjk = {f: analyzers[f] for f in wanted if f in analyzers}
            return _Plan([AnalysisRequest(both, cjk)], unspaced=True, has_tail=False)
        words = queries.distinct_words(text).split()
        head, tail = words[: queries.MAX_FUZZY_WORDS], words[queries.MAX_FUZZY_WORDS :]
        # One artificial document for the three analyses (each extra document costs the engine a
        # parse and an in-memory index): the full text in canonical_name for the phrase sub-field
        # and, under aliases.shingle's own search analyzer, for the alias shingles; the fuzzy words
        # in aliases under the word clauses' analyzer.
        requests = [
            AnalysisRequest(
                {"canonical_name": text, "aliases": " ".join(head)},
                {
                    "canonical_name.phrase": analyzers["canonical_name.phrase"],
                    _ALIAS_SHINGLES_VIA: analyzers["aliases.shingle"],
                    _HEAD_WORDS_VIA: queries.WORD_ANALYZER,
                },
            )
        ]
        if tail:
            requests.append(AnalysisRequest({"aliases": " ".join(tail)}, {_HEAD_WORDS_VIA: queries.WORD_ANALYZER}))
        return _Plan(requests, unspaced=False, has_tail=bool(tail))

    def _render(
        self, plan: _Plan, analyses: list[dict[str, Positions]], vocabulary: TenantVocabulary
    ) -> list[dict[str, Any]]:
        if plan.unspaced:
            return self._render_unspaced(analyses[0], vocabulary)
        analysed = analyses[0]
        phrases = {
            "canonical_name.phrase": analysed.get("canonical_name.phrase", ()),
            "aliases.shingle": analysed.get(_ALIAS_SHINGLES_VIA, ()),
        }
        head = analysed.get(_HEAD_WORDS_VIA, ())
        tail = analyses[1].get(_HEAD_WORDS_VIA, ()) if plan.has_tail else ()

        def words(name: str, boost: float) -> list[WeightedClause]:
            vocab = vocabulary.field(name)
            return [
                _expansions(name, name, boost, head, vocab.fuzzy),
                _expansions(name, name, boost, tail, vocab.exact),
            ]

        def shingles(name: str, boost: float) -> WeightedClause:
            return _alternatives(name, name, boost, phrases.get(name, ()), vocabulary.field(name))

        planned = [
            *words("canonical_name", queries.CANONICAL_BOOST),
            shingles("canonical_name.phrase", queries.CANONICAL_PHRASE_BOOST),
            *words("aliases", queries.ALIAS_WORD_BOOST),
            shingles("aliases.shingle", queries.ALIAS_PHRASE_BOOST),
        ]
        return queries.weighted_term_clauses(planned)

    def _render_unspaced(self, analysis: dict[str, Positions], vocabulary: TenantVocabulary) -> list[dict[str, Any]]:
        planned: list[WeightedClause] = []
        for name, word_boost, shingle_boost in (
            ("canonical_name", queries.CANONICAL_BOOST, queries.CANONICAL_PHRASE_BOOST),
            ("aliases", queries.ALIAS_WORD_BOOST, queries.ALIAS_PHRASE_BOOST),
        ):
            latin, exact, shingle = f"{name}.cjk_latin", f"{name}.cjk", f"{name}.cjk_shingle"
            planned += [
                _expansions(latin, latin, word_boost, analysis.get(latin, ()), vocabulary.field(latin).fuzzy),
                _expansions(exact, exact, word_boost, analysis.get(exact, ()), vocabulary.field(exact).exact),
                _alternatives(shingle, shingle, shingle_boost, analysis.get(shingle, ()), vocabulary.field(shingle)),
            ]
            ko, ko_shingle = f"{name}.ko", f"{name}.ko_shingle"
            if ko in analysis or ko_shingle in analysis:  # Korean text (queries.unspaced_clauses)
                planned += [
                    _expansions(ko, ko, word_boost, analysis.get(ko, ()), vocabulary.field(ko).exact),
                    _alternatives(
                        ko_shingle,
                        ko_shingle,
                        shingle_boost,
                        analysis.get(ko_shingle, ()),
                        vocabulary.field(ko_shingle),
                    ),
                ]
        return queries.weighted_term_clauses(planned)


def _expansions(name: str, field_name: str, boost: float, positions: Positions, expand: Any) -> WeightedClause:
    """One term per position (word analyzers stack nothing), each expanded to the terms it reaches."""
    return WeightedClause(
        name=name,
        field=field_name,
        boost=boost,
        positions=tuple(expand(token) for group in positions for token in group),
        alternatives=False,
    )


def _alternatives(
    name: str, field_name: str, boost: float, positions: Positions, vocab: FieldVocabulary
) -> WeightedClause:
    """Shingles: the tokens at one position are alternatives (Lucene's SynonymQuery scores the
    position once), and only whole units of the vocabulary can match."""
    return WeightedClause(
        name=name,
        field=field_name,
        boost=boost,
        positions=tuple(tuple((t, 1.0) for t in group if t in vocab.terms) for group in positions),
        alternatives=True,
    )
