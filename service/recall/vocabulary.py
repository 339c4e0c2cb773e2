"""Relevance matching from the tenant's own vocabulary (issue 16, item 1).

The Lucene query (:func:`service.storage.queries.relevance_clauses`) expands every query word of 4+
characters into at most 20 indexed terms one edit away, drawn from the whole shard, i.e. from
every tenant routed to it: other tenants' terms can crowd a tenant's own out of the 20, and each
expansion costs a Levenshtein automaton per word and field. Here the same semantics are computed
from the caller's tenant alone, and OpenSearch receives an exact weighted term query:

1. the tenant's vocabulary: the terms OpenSearch's index analysis produced for its names and
   aliases (whole units, per searched field), with prefix-guarded deletion keys for the fuzzy
   fields; kept in an LRU of active tenants, valid for one tenant write version (Redis), and
   shared between processes through Redis (:mod:`service.recall.shared_vocabulary`);
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

import functools
import logging
import struct
import sys
import threading
import time
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate, pairwise
from operator import itemgetter
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from service.config import RecallDefaults
from service.domain.principal import Principal
from service.domain.text import has_hangul, has_unspaced_script
from service.errors import StoreUnavailable
from service.lru import BoundedLru, LruBound
from service.recall.analysis_cache import Analysis, AnalysisCache, BoundAnalysisCache
from service.recall.shared_vocabulary import SharedVocabularies
from service.storage import calls, queries
from service.storage.beliefs import BeliefStore
from service.storage.calls import Reads
from service.storage.local_analysis import Positions
from service.storage.queries import TermWeights, WeightedClause
from service.storage.vocabulary import AnalysisRequest, VocabularyStore
from service.telemetry import metrics
from service.telemetry.cache_metrics import ALL_PARTS, CacheCounts
from service.write_versions import TenantWriteVersions

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


@functools.lru_cache(maxsize=4096)
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


# ---------------------------------------------------------------------- vocabulary


def _order(term: str) -> tuple[str, int, str]:
    """The order terms are kept in: by the guarded prefix, then length, then the term, so the
    one-edit candidates of a word (same prefix, length within one) are one contiguous range."""
    return term[: queries.PREFIX_LENGTH], len(term), term


_PREFIX = itemgetter(slice(None, queries.PREFIX_LENGTH))  # term[:PREFIX_LENGTH], called from C

# A term's place in :func:`_order` up to its last key, as one integer (:func:`_order_key`): the two
# guarded characters' code points (plus one, so that a missing second character sorts first, as
# the shorter string does) and the length, in 21 bits each. Integers compare as the (prefix,
# length) pairs do, so a vocabulary's keys are sorted and C's ``bisect`` finds a word's run of
# terms instead of a binary search in Python. A length beyond 21 bits is clamped: those terms
# share a key, and the search of the run after the bisection compares their real lengths.
_POINT_BITS = 21
_MAX_KEYED_LENGTH = (1 << _POINT_BITS) - 1
if queries.PREFIX_LENGTH != 2:  # pragma: no cover - the keys spell out two characters
    raise RuntimeError("order keys are written for a two-character prefix guard")


def _order_key(prefix: str, length: int) -> int:
    """The key of the terms with this guarded prefix (a term's first two characters, or the whole
    term if shorter) and length."""
    first = ord(prefix[0]) + 1 if prefix else 0
    second = ord(prefix[1]) + 1 if len(prefix) > 1 else 0
    return (first << (2 * _POINT_BITS)) | (second << _POINT_BITS) | min(length, _MAX_KEYED_LENGTH)


def _order_keys(joined: str, offsets: array[int]) -> array[int]:
    """Every term's :func:`_order_key` (``joined`` cut by ``offsets``), from the code points."""
    cuts = _cuts(offsets)
    starts, lengths = cuts[:-1], np.diff(cuts)
    # surrogatepass: a lone surrogate a stored alias may hold is one code point, as in the str
    points = np.append(np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32), 0).astype(np.int64)
    first = np.where(lengths > 0, points[starts] + 1, 0)
    second = np.where(lengths > 1, points[np.minimum(starts + 1, len(points) - 1)] + 1, 0)
    keys = (first << (2 * _POINT_BITS)) | (second << _POINT_BITS) | np.minimum(lengths, _MAX_KEYED_LENGTH)
    return array("q", keys.astype(np.int64).tobytes())


# The pre-filter (a Bloom filter per field vocabulary): bits per key, two probes per lookup (the
# low and the high half of the key). Ten bits let ~3% of absent keys through to the search,
# for ~1.25 bytes per key.
_FILTER_BITS_PER_KEY = 10
_LOW32 = 0xFFFFFFFF


# Spreads a term length over all 64 bits of a range key (the golden-ratio constant, odd), and
# the spread of each length up to _SPREAD_LENGTHS, looked up on the hot path (cheaper than the
# multiplication, and than the (prefix, length) tuple hash these keys replaced).
_LENGTH_SPREAD = 0x9E3779B97F4A7C15
_LOW64 = (1 << 64) - 1
_SPREAD_LENGTHS = 1024
_SPREADS = tuple((length * _LENGTH_SPREAD) & _LOW64 for length in range(_SPREAD_LENGTHS))
_NO_POINT = 0x110000  # above every code point


def _range_key(prefix: str, length: int) -> int:
    """The pre-filter key of the terms with this guarded prefix and length (a one-edit range):
    the prefix's string hash with the length spread over its 64 bits. Only bits 0-63 are read,
    so Python's unbounded ints agree with :func:`_pre_filter`'s uint64 arithmetic."""
    spread = _SPREADS[length] if length < _SPREAD_LENGTHS else length * _LENGTH_SPREAD
    return hash(prefix) ^ spread


def _pre_filter(joined: str, offsets: array[int], ranges: bool) -> bytes:
    """The pre-filter of a vocabulary's terms (``joined`` cut by ``offsets``, in :func:`_order`),
    with their one-edit ranges if ``ranges``. Vectorised where it can be: a restored vocabulary
    computes it on a recall's path (the first recall of a tenant after a write), and a bit loop in
    Python cost ~0.35 us per key. Only the terms' own hashes need a str per term."""
    bounds = offsets.tolist()
    keys = np.array([hash(joined[a:b]) for a, b in pairwise(bounds)], np.int64).view(np.uint64)
    if ranges and len(bounds) > 1:
        keys = np.concatenate((keys, _range_keys(joined, offsets)))
    return _filter_of(keys)


def _cuts(offsets: array[int]) -> npt.NDArray[np.int64]:
    """The offsets as a numpy array (no copy of the array's buffer until the widening)."""
    return np.frombuffer(offsets, np.dtype(f"u{offsets.itemsize}")).astype(np.int64)


def _range_keys(joined: str, offsets: array[int]) -> npt.NDArray[np.uint64]:
    """Each distinct (prefix, length) range's :func:`_range_key`, from the terms' code points:
    in :func:`_order` the terms of one prefix, and of one range, are contiguous runs, so only the
    first term of each prefix is sliced and hashed in Python."""
    guard = queries.PREFIX_LENGTH
    cuts = _cuts(offsets)
    starts, lengths = cuts[:-1], np.diff(cuts)
    # surrogatepass: a lone surrogate a stored alias may hold is one code point, as in the str
    points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
    new_prefix = np.zeros(len(starts), np.bool_)
    new_prefix[0] = True
    for k in range(guard):
        # the k-th character, or a value no code point has for a term shorter than k + 1
        present = lengths > k
        point = np.full(len(starts), _NO_POINT, np.uint32)
        point[present] = points[starts[present] + k]
        new_prefix[1:] |= point[1:] != point[:-1]
    firsts = np.flatnonzero(new_prefix)
    heads = zip(starts[firsts].tolist(), lengths[firsts].tolist(), strict=True)
    hashed = [hash(joined[a : a + min(n, guard)]) for a, n in heads]
    prefixes = np.repeat(np.array(hashed, np.int64), np.diff(np.append(firsts, len(starts)))).view(np.uint64)
    spread = lengths.astype(np.uint64) * np.uint64(_LENGTH_SPREAD)  # wraps mod 2**64, as _SPREADS
    new_range = new_prefix.copy()
    new_range[1:] |= lengths[1:] != lengths[:-1]
    return (prefixes ^ spread)[new_range]


def _filter_bytes(keys: int) -> int:
    """The size of the pre-filter of this many keys (at least 8 bytes)."""
    return max(8, -(-keys * _FILTER_BITS_PER_KEY // 8))


def _filter_of(keys: npt.NDArray[np.uint64]) -> bytes:
    """Bit ``k mod bits`` set for the low and the high 32 bits ``k`` of every key, bit ``i`` being
    bit ``i & 7`` of byte ``i >> 3`` (what :meth:`FieldVocabulary.may_hold` tests)."""
    bits = np.uint64(_filter_bytes(len(keys)) * 8)
    held = np.zeros(int(bits), np.bool_)
    held[(keys & np.uint64(_LOW32)) % bits] = True
    held[(keys >> np.uint64(32)) % bits] = True
    return np.packbits(held, bitorder="little").tobytes()


@dataclass(frozen=True, eq=False)
class FieldVocabulary:
    """One field's terms (sub-fields with the same terms share one), compact: the terms in
    :func:`_order`, joined into one string, with their start offsets. Exact membership and the
    one-edit candidates of a word are searches: C's ``bisect`` over the terms' order keys
    (``order_keys``: prefix and length in one integer, 8 bytes a term) to the run of terms with the
    word's prefix and length, then a binary search of that run; no per-term Python object is kept.

    In front of the searches, a Bloom filter (``pre_filter``) over the hashes of the terms and,
    with ``ranges``, of each (prefix, length) a term has: most shingles and words of a message are
    no unit, and are rejected by a few bit tests instead of a binary search. It never rejects a
    term it holds (a filter only has false positives, which the search then answers), so results
    are those of the searches alone. Python's string hash is per interpreter: the filter is valid
    only in the process that computed it, so it never travels (:meth:`TenantVocabulary.encode`).
    It is computed on first use: a vocabulary built or restored for one recall pays only for the
    field groups that recall's message reaches (an English message never reaches the Korean
    ones), and a worker that builds one for the API (:mod:`service.recall.prebuild`) for none."""

    joined: str = ""
    offsets: array[int] = field(default_factory=lambda: array("I", [0]))
    ranges: bool = False

    @functools.cached_property
    def order_keys(self) -> array[int]:
        """Each term's :func:`_order_key`, in the terms' order (so sorted), computed on first use
        like the pre-filter (8 bytes per term, counted by :meth:`approx_bytes`)."""
        return _order_keys(self.joined, self.offsets)

    @functools.cached_property
    def pre_filter(self) -> bytes:
        """The Bloom filter (see the class docstring), computed on first use and then held (a
        plain attribute from then on: ``cached_property`` stores it in the instance)."""
        return _pre_filter(self.joined, self.offsets, self.ranges)

    @classmethod
    def build(cls, terms: Iterable[str], *, ranges: bool = False) -> FieldVocabulary:
        """``ranges``: also file each term's (prefix, length) in the pre-filter, so :meth:`fuzzy`
        can skip a word with no term in its one-edit range (the fuzzy fields)."""
        # _order by three stable sorts with C-level keys: by term, then length, then prefix
        ordered = sorted(set(terms))
        ordered.sort(key=len)
        ordered.sort(key=_PREFIX)
        offsets = array("I", accumulate(map(len, ordered), initial=0))
        return cls("".join(ordered), offsets, ranges)

    @classmethod
    def restore(cls, joined: str, offsets: array[int], *, ranges: bool) -> FieldVocabulary:
        """The vocabulary another process built (``joined`` and ``offsets`` as it held them, in
        :func:`_order`). Its pre-filter is computed here on first use: its keys are this
        interpreter's string hashes. Raises ValueError if the offsets do not cut ``joined`` into
        terms. (Their order is the encoder's: checking it would double the restore's cost, and the
        encoded entry's integrity is zlib's checksum.)"""
        if offsets[0] != 0 or offsets[-1] != len(joined) or bool((np.diff(_cuts(offsets)) < 0).any()):
            raise ValueError("offsets do not cut the joined terms")
        return cls(joined, offsets, ranges)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def term(self, i: int) -> str:
        return self.joined[self.offsets[i] : self.offsets[i + 1]]

    @property
    def terms(self) -> frozenset[str]:
        """Every term (for tests and measurements; the hot path never materialises them)."""
        return frozenset(self.term(i) for i in range(len(self)))

    def may_hold(self, key: int) -> bool:
        """False if no term (or, with ``ranges``, no one-edit range) has this pre-filter key;
        True means only "perhaps"."""
        held = self.pre_filter
        bits = len(held) << 3
        low = (key & _LOW32) % bits
        if not held[low >> 3] >> (low & 7) & 1:
            return False
        high = ((key >> 32) & _LOW32) % bits
        return bool(held[high >> 3] >> (high & 7) & 1)

    def _may_hold_range(self, prefix: str, n: int) -> bool:
        """Whether a term with this prefix and a length within one of ``n`` may be held: the
        three :func:`_range_key` tests of :meth:`may_hold`, inlined (one call per fuzzy word),
        the prefix hashed once."""
        held, hashed = self.pre_filter, hash(prefix)
        bits = len(held) << 3
        for length in (n - 1, n, n + 1):
            key = hashed ^ (_SPREADS[length] if length < _SPREAD_LENGTHS else length * _LENGTH_SPREAD)
            low = (key & _LOW32) % bits
            if held[low >> 3] >> (low & 7) & 1:
                high = ((key >> 32) & _LOW32) % bits
                if held[high >> 3] >> (high & 7) & 1:
                    return True
        return False

    def _first_at_or_after(self, prefix: str, length: int, term: str = "") -> int:
        """The index of the first term not before ``(prefix, length, term)`` in :func:`_order`:
        the run of its (prefix, length) key found by C's ``bisect`` over :attr:`order_keys`, then
        a binary search of the run by length and term. The run is usually a few terms, but a
        tenant may store thousands of one prefix and length (dates, versions, hostile names): a
        step over them one by one would cost every lookup that much."""
        keys = self.order_keys
        key = _order_key(prefix, length)
        lo = bisect_left(keys, key)
        hi = bisect_left(keys, key + 1, lo)
        joined, offsets = self.joined, self.offsets
        while lo < hi:
            mid = (lo + hi) >> 1
            start = offsets[mid]
            size = offsets[mid + 1] - start
            # within a run the lengths are equal (unequal only past the key's clamp): the term decides
            if size < length or (size == length and joined[start : start + size] < term):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def __contains__(self, token: object) -> bool:
        if not isinstance(token, str) or not self.may_hold(hash(token)):
            return False
        return self._holds(token)

    def _holds(self, token: str) -> bool:
        """The search alone (behind the pre-filter)."""
        i = self._first_at_or_after(token[: queries.PREFIX_LENGTH], len(token), token)
        return i < len(self) and self.term(i) == token

    def held_at(self, positions: Positions) -> tuple[TermWeights, ...]:
        """Per position, the tokens this vocabulary holds (weight 1): ``tuple(tuple((t, 1.0) for
        t in group if t in self) for group in positions)`` in one loop, the pre-filter's two bit
        tests inlined. A long message tests hundreds of shingles, nearly all rejected by the
        filter: a method call per token cost more than the test itself."""
        held, bits = self.pre_filter, len(self.pre_filter) << 3
        out: list[TermWeights] = []
        for group in positions:
            found: list[tuple[str, float]] = []
            for token in group:
                key = hash(token)
                low = (key & _LOW32) % bits
                if not held[low >> 3] >> (low & 7) & 1:
                    continue
                high = ((key >> 32) & _LOW32) % bits
                if held[high >> 3] >> (high & 7) & 1 and self._holds(token):
                    found.append((token, 1.0))
            out.append(tuple(found))
        return tuple(out)

    def exact(self, token: str) -> TermWeights:
        return ((token, 1.0),) if token in self else ()

    def fuzzy(self, token: str) -> TermWeights:
        """What ``FuzzyQuery(token, AUTO:4, prefix 2, max 20 expansions)`` rewrites to, over this
        vocabulary alone."""
        n = len(token)
        if n < MIN_FUZZY_LENGTH:
            return self.exact(token)
        guard = queries.PREFIX_LENGTH
        prefix = token[:guard]
        if self.ranges and not self._may_hold_range(prefix, n):
            return ()
        rest = token[guard:]
        found: dict[str, float] = {}
        # the terms with the same prefix and one character shorter to one longer: a contiguous
        # range (all of them longer than the guard, as n - 1 is)
        joined, offsets = self.joined, self.offsets
        last = len(offsets) - 1
        i = self._first_at_or_after(prefix, n - 1)
        while i < last:
            start, end = offsets[i], offsets[i + 1]
            size = end - start
            if size > n + 1 or size < guard or joined[start : start + guard] != prefix:
                break
            term = joined[start:end]
            edits = edits_within_one(term[guard:], rest)
            if edits is not None:
                found[term] = fuzzy_factor(edits, len(term), n)
            i += 1
        # Lucene's TopTermsRewrite keeps the best boosts, ties to the smaller term (UTF-8 order)
        ranked = sorted(found.items(), key=lambda tw: (-tw[1], tw[0].encode("utf-8", "surrogatepass")))
        return tuple(ranked[: queries.MAX_FUZZY_EXPANSIONS])

    def approx_bytes(self) -> int:
        """Its size with the pre-filter, computed or not (not computed here): the filter's bytes
        for as many keys as it can have (each term, and with ``ranges`` at most one range each)."""
        keys = len(self) * (2 if self.ranges else 1)
        order_keys = 64 + 8 * len(self)
        return sys.getsizeof(self.joined) + sys.getsizeof(self.offsets) + _filter_bytes(keys) + order_keys + 33 + 64


_EMPTY = FieldVocabulary()


@dataclass(frozen=True)
class TenantVocabulary:
    """A tenant's vocabulary at one write version: per searched field its terms (fields whose
    terms are the same share one :class:`FieldVocabulary`)."""

    tenant_id: str
    version: int
    fields: dict[str, FieldVocabulary]
    documents: int
    build_ms: float
    approx_bytes: int
    legacy_documents: int = 0  # documents without stored units (read from term vectors)
    fingerprint: bytes = b""  # the index mapping's (NameMapping.fingerprint) it was built from

    @classmethod
    def build(cls, store: VocabularyStore, principal: Principal, version: int) -> Reads[TenantVocabulary]:
        started = time.perf_counter()
        mapping = yield from store.mapping_reads()
        read = yield from store.tenant_units(principal)
        # groups with the same terms share one structure, with ranges if any of them is fuzzy
        fuzzy: dict[frozenset[str], bool] = {}
        named: list[tuple[list[str], frozenset[str]]] = []
        for group, names in mapping.groups(VOCABULARY_FIELDS).items():
            terms = frozenset(read.groups.get(group, ()))
            fuzzy[terms] = fuzzy.get(terms, False) or any(name in FUZZY_FIELDS for name in names)
            named.append((names, terms))
        shared = {terms: FieldVocabulary.build(terms, ranges=ranges) for terms, ranges in fuzzy.items()}
        fields = {name: shared[terms] for names, terms in named for name in names}
        return cls(
            principal.tenant_id,
            version,
            fields,
            read.documents,
            (time.perf_counter() - started) * 1000,
            _fields_bytes(fields),
            read.legacy,
            mapping.fingerprint,
        )

    def field(self, name: str) -> FieldVocabulary:
        return self.fields.get(name) or _EMPTY

    def encode(self) -> bytes:
        """This vocabulary for another process (:meth:`decode`): a header naming the tenant,
        version and mapping it belongs to, then each distinct field vocabulary's offsets and
        terms, compressed. The pre-filters are left out (rebuilt on decode)."""
        groups = list({id(f): f for f in self.fields.values()}.values())
        index = {id(f): i for i, f in enumerate(groups)}
        # surrogatepass: any str round-trips, even a lone surrogate a stored alias may hold
        texts = [g.joined.encode("utf-8", "surrogatepass") for g in groups]
        header = {
            "tenant": self.tenant_id,
            "version": self.version,
            "fingerprint": self.fingerprint.hex(),
            "documents": self.documents,
            "legacy": self.legacy_documents,
            "fields": {name: index[id(f)] for name, f in self.fields.items()},
            "groups": [[g.ranges, len(g.offsets), len(text)] for g, text in zip(groups, texts, strict=True)],
        }
        head = orjson.dumps(header)
        body = b"".join(_offsets_bytes(g.offsets) + text for g, text in zip(groups, texts, strict=True))
        return _ENCODING + zlib.compress(len(head).to_bytes(4, "little") + head + body, 1)

    @classmethod
    def decode(cls, encoded: bytes, *, tenant_id: str, version: int, fingerprint: bytes) -> TenantVocabulary:
        """The vocabulary :meth:`encode` wrote, if it is ``tenant_id``'s at ``version`` under the
        mapping with ``fingerprint``; ValueError otherwise (another tenant's, version's or
        mapping's entry, another format, or damaged)."""
        started = time.perf_counter()
        try:
            fields, header = cls._decoded_fields(encoded, tenant_id=tenant_id, version=version, fingerprint=fingerprint)
            documents, legacy = int(header["documents"]), int(header["legacy"])
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"malformed encoded vocabulary: {exc!r}") from exc
        took_ms = (time.perf_counter() - started) * 1000
        return cls(tenant_id, version, fields, documents, took_ms, _fields_bytes(fields), legacy, fingerprint)

    @staticmethod
    def is_encoded_for(encoded: bytes, *, tenant_id: str, version: int, fingerprint: bytes) -> bool:
        """Whether ``encoded`` is ``tenant_id``'s vocabulary at ``version`` under the mapping with
        ``fingerprint`` (its header alone: no field is restored)."""
        try:
            _, _, header = _opened(encoded)
        except ValueError:
            return False
        return _stamp(header) == (tenant_id, version, fingerprint.hex())

    @staticmethod
    def _decoded_fields(
        encoded: bytes, *, tenant_id: str, version: int, fingerprint: bytes
    ) -> tuple[dict[str, FieldVocabulary], dict[str, Any]]:
        raw, size, header = _opened(encoded)
        if _stamp(header) != (tenant_id, version, fingerprint.hex()):
            raise ValueError("an entry of another tenant, version or index mapping")
        groups: list[FieldVocabulary] = []
        at = 4 + size
        for ranges, n_offsets, n_bytes in header["groups"]:
            offsets = array("I")
            offsets.frombytes(raw[at : at + n_offsets * 4])
            if sys.byteorder != "little":
                offsets.byteswap()
            at += n_offsets * 4
            joined = raw[at : at + n_bytes].decode("utf-8", "surrogatepass")
            at += n_bytes
            if len(offsets) != n_offsets:
                raise ValueError("truncated encoded vocabulary")
            groups.append(FieldVocabulary.restore(joined, offsets, ranges=bool(ranges)))
        if at != len(raw):
            raise ValueError("trailing bytes after the encoded vocabulary")
        return {str(name): groups[i] for name, i in header["fields"].items()}, header


# The format of TenantVocabulary.encode: a new layout gets a new tag (an old entry is then
# rejected and rebuilt). Offsets are 4-byte little-endian unsigned ints.
_ENCODING = b"tenure-vocabulary/1\n"
if array("I").itemsize != 4:  # pragma: no cover - every platform CPython supports here
    raise ImportError("the vocabulary needs 4-byte array('I') offsets")


def _opened(encoded: bytes) -> tuple[bytes, int, dict[str, Any]]:
    """An encoded vocabulary decompressed: the raw bytes, its header's size and the header."""
    if not encoded.startswith(_ENCODING):
        raise ValueError("not an encoded vocabulary of this format")
    try:
        raw = zlib.decompress(encoded[len(_ENCODING) :])
        size = int.from_bytes(raw[:4], "little")
        header = orjson.loads(raw[4 : 4 + size])
    except (zlib.error, orjson.JSONDecodeError) as exc:
        raise ValueError(f"unreadable encoded vocabulary: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError("an encoded vocabulary's header is an object")
    return raw, size, header


def _stamp(header: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Whose entry it is: (tenant, write version, mapping fingerprint in hex)."""
    return header.get("tenant"), header.get("version"), header.get("fingerprint")


def _offsets_bytes(offsets: array[int]) -> bytes:
    if sys.byteorder == "little":
        return offsets.tobytes()
    swapped = array("I", offsets)  # pragma: no cover - big-endian hosts
    swapped.byteswap()  # pragma: no cover
    return swapped.tobytes()  # pragma: no cover


def _fields_bytes(fields: Mapping[str, FieldVocabulary]) -> int:
    """Each field vocabulary once (sub-fields may share one), plus the entry itself."""
    return 400 + 100 * len(fields) + sum(f.approx_bytes() for f in {id(f): f for f in fields.values()}.values())


# What VocabularyCache.refresh did: restored (the shared entry at the announced version is held
# now), not_held (the tenant is not active in this process), current (this version or a newer one
# is held), missing (no entry at that version in Redis: the next recall restores or builds).
RefreshOutcome = Literal["restored", "not_held", "current", "missing"]
# The user named on a refresh's reads (the vocabulary read is the tenant's whole, as a prebuild's;
# a refresh reads only the index mapping, usually from this process's memory).
REFRESH_USER = "system:vocabulary-refresh"


@dataclass
class CacheStats:
    hits: int = 0
    builds: int = 0
    shared_loads: int = 0  # taken from another process's build (SharedVocabularies)
    build_ms_total: float = 0.0
    build_ms_max: float = 0.0
    evictions: int = 0


@dataclass(eq=False, slots=True)
class _Held:
    """A cached vocabulary and the monotonic time of its last use (the idle drop reads it)."""

    vocabulary: TenantVocabulary
    used: float


class VocabularyCache:
    """The vocabularies of the most recently active tenants, bounded in count and in (estimated)
    memory. An entry is used only while the tenant's write version is the one it was built at (a
    write means a rebuild: one search); without a version source (``versions=None``) nothing
    is kept and every recall builds afresh."""

    def __init__(
        self,
        store: VocabularyStore,
        versions: TenantWriteVersions | None,
        *,
        max_tenants: int = 1000,
        max_bytes: int = 256 * 1024 * 1024,
        shared: SharedVocabularies | None = None,
    ):
        self.store = store
        self.versions = versions
        # other processes' builds (Redis); only with a version source, as entries are per version
        self.shared = shared if versions is not None else None
        self.stats = CacheStats()
        self._lock = threading.Lock()
        # tenant -> vocabulary, weighed by its approx_bytes; an eviction counts in the stats
        self._entries: BoundedLru[str, _Held] = BoundedLru(max_tenants, max_weight=max_bytes, on_evict=self._evicted)

    max_tenants = LruBound[int]("max_entries")

    @property
    def max_bytes(self) -> int:
        limit = self._entries.max_weight
        return 0 if limit is None else limit  # never None here: the LRU is built with max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._entries.max_weight = value

    def get(self, principal: Principal, version: int | None = None) -> TenantVocabulary:
        """``version``: the tenant's write version if the caller already read it (the API reads
        it with the rate limit, in the same Redis round trip); else it is read here."""
        if version is None:
            version = self._version(principal.tenant_id)
        return calls.run(self.store.client, self.lookup(principal, version))

    def lookup(self, principal: Principal, version: int | None) -> Reads[TenantVocabulary]:
        """The tenant's vocabulary at ``version`` (read by the caller): cached in this process,
        else as another process built it (``shared``), else built here (and shared). ``None``
        (the version is unknown): built for this request and not kept."""
        if version is not None:
            with self._lock:
                self._drop_idle()
                held = self._entries.peek(principal.tenant_id)  # another version keeps its place
                if held is not None and held.vocabulary.version == version:
                    self._entries.get(principal.tenant_id)  # now the most recently used
                    held.used = time.monotonic()
                    self.stats.hits += 1
                    return held.vocabulary
            loaded = yield from self._load_shared(principal, version)
            if loaded is not None:
                self._keep(loaded, version)
                return loaded
        built = yield from TenantVocabulary.build(self.store, principal, version or 0)
        with self._lock:
            self.stats.builds += 1
            self.stats.build_ms_total += built.build_ms
            self.stats.build_ms_max = max(self.stats.build_ms_max, built.build_ms)
        if version is not None:
            self._keep(built, version)
            if self.shared is not None:
                self.shared.store(built.tenant_id, version, built.encode())
        log.debug("vocabulary of %s: %d documents, %.1f ms", principal.tenant_id, built.documents, built.build_ms)
        return built

    def refresh(self, tenant_id: str, version: int) -> RefreshOutcome:
        """Restore the tenant's vocabulary at ``version`` from the shared entry, before any recall
        asks for it, if this process holds an older version (the tenant is active here): its
        next recall then finds it ready, pre-filters included, instead of restoring it on the
        request (:mod:`service.recall.vocabulary_warmer`). Never builds (a tenant whose entry is
        not there, or no longer at ``version``, is restored or built by its next recall as
        before), and keeps the tenant's last use, so an idle tenant that keeps writing still
        leaves the cache. Only the pre-filters the older version had computed are computed: the
        field groups this process's recalls of the tenant reached."""
        with self._lock:
            held = self._entries.peek(tenant_id)
        if held is None or time.monotonic() - held.used > MAX_IDLE_S:
            return "not_held"  # an idle tenant is left to leave the cache (_drop_idle)
        if held.vocabulary.version >= version:
            return "current"
        principal = Principal(tenant_id=tenant_id, user_id=REFRESH_USER)
        loaded = calls.run(self.store.client, self._load_shared(principal, version))
        if loaded is None:
            return "missing"
        for name, old in held.vocabulary.fields.items():
            if "pre_filter" in vars(old):  # computed (functools.cached_property keeps it there)
                loaded.field(name).pre_filter  # noqa: B018 - computed now, off the request path
        self._keep(loaded, version, used=held.used)
        return "restored"

    def _keep(self, vocabulary: TenantVocabulary, version: int, *, used: float | None = None) -> None:
        """Hold ``vocabulary`` (unless a newer version is held); ``used``: its last use, now
        unless given."""
        held = _Held(vocabulary, time.monotonic() if used is None else used)
        with self._lock:
            current = self._entries.peek(vocabulary.tenant_id)
            if current is None or current.vocabulary.version <= version:
                # larger than the whole budget: dropped, and used for this request only
                self._entries.put(vocabulary.tenant_id, held, vocabulary.approx_bytes, keep_place=used is not None)

    def _load_shared(self, principal: Principal, version: int) -> Reads[TenantVocabulary | None]:
        """The tenant's vocabulary as another process built it at this very version, if stored."""
        if self.shared is None:
            return None
        encoded = self.shared.load(principal.tenant_id)
        if encoded is None:
            return None
        mapping = yield from self.store.mapping_reads()
        try:
            loaded = TenantVocabulary.decode(
                encoded, tenant_id=principal.tenant_id, version=version, fingerprint=mapping.fingerprint
            )
        except ValueError as exc:
            log.debug("shared vocabulary of %s not used: %s", principal.tenant_id, exc)
            metrics.SHARED_VOCABULARY.labels("rejected").inc()
            return None
        metrics.SHARED_VOCABULARY.labels("loaded").inc()
        with self._lock:
            self.stats.shared_loads += 1
        return loaded

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
        oldest = self._entries.peek_oldest()
        if oldest is None:
            return
        tenant, held = oldest
        if time.monotonic() - held.used > MAX_IDLE_S:
            self._entries.pop(tenant)
            self.stats.evictions += 1

    def _evicted(self, _tenant: str, _held: _Held) -> None:
        self.stats.evictions += 1  # the LRU pushed a tenant out (within lookup, under the lock)

    def counts(self) -> CacheCounts:
        """Lookups (a miss: restored from another process's build, or built here), evictions
        (idle drops included), tenants held and their estimated bytes (service/telemetry/cache_metrics.py)."""
        with self._lock:
            stats, held = self.stats, self._entries
            missed = stats.builds + stats.shared_loads
            return CacheCounts({ALL_PARTS: (stats.hits, missed)}, stats.evictions, len(held), held.weight)

    def entries(self) -> list[TenantVocabulary]:
        """The cached vocabularies, least recently used first (for measurements)."""
        return [held.vocabulary for held in self._entries.values()]

    @property
    def cached_bytes(self) -> int:
        return self._entries.weight

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
    """The relevance clauses of one recall, computed from the caller's tenant vocabulary.
    ``analyses``: each message's analysis kept per tenant, text and analyzers until the tenant
    writes (:mod:`service.recall.analysis_cache`), so a repeated message is not analysed again."""

    def __init__(self, store: VocabularyStore, cache: VocabularyCache, analyses: AnalysisCache | None = None):
        self.store = store
        self.cache = cache
        self.analyses = analyses

    @classmethod
    def for_store(cls, beliefs: BeliefStore, defaults: RecallDefaults) -> VocabularyMatcher:
        """A matcher over ``beliefs``' index whose cache follows the store's write versions (a
        store without them gets a matcher that builds on every recall)."""
        reader = beliefs.vocabulary
        versions = beliefs.versions
        shared = None
        if versions is not None and defaults.vocabulary_shared_ttl_s > 0:
            shared = SharedVocabularies(versions.client, versions.namespace, ttl_s=defaults.vocabulary_shared_ttl_s)
        cache = VocabularyCache(
            reader,
            versions,
            max_tenants=defaults.vocabulary_cache_tenants,
            max_bytes=defaults.vocabulary_cache_mb * 1024 * 1024,
            shared=shared,
        )
        analyses = AnalysisCache(
            max_entries=defaults.analysis_cache_entries,
            max_age_s=defaults.analysis_cache_max_age_s,
            max_bytes=defaults.analysis_cache_mb * 1024 * 1024,
        )
        return cls(reader, cache, analyses)

    def clauses(self, principal: Principal, text: str, *, version: int | None = None) -> list[dict[str, Any]]:
        """Exact weighted term clauses equivalent to ``queries.relevance_clauses(text)`` for this
        tenant. Empty when nothing in the tenant's vocabulary can match. ``version``: the tenant's
        write version when the caller has it (no Redis read here then)."""
        return self.clauses_many(principal, [text], version=version)[0]

    def clauses_reads(self, principal: Principal, text: str, *, version: int | None) -> Reads[list[dict[str, Any]]]:
        """:meth:`clauses` as requests (recall's own path, sync or async); ``version`` None: the
        vocabulary is built for this recall and not cached."""
        many = yield from self._clauses_reads(principal, [text], version)
        return many[0]

    def clauses_many(
        self, principal: Principal, texts: Sequence[str], *, version: int | None = None
    ) -> list[list[dict[str, Any]]]:
        """Several texts of one tenant in one analysis round trip (the differential test)."""
        if version is None:
            version = self.current_version(principal.tenant_id)
        return calls.run(self.store.client, self._clauses_reads(principal, texts, version))

    def current_version(self, tenant_id: str) -> int | None:
        """The tenant's write version read from Redis (None: unknown, nothing is cached), for a
        caller that did not read it with the rate limit."""
        return self.cache._version(tenant_id)

    def _clauses_reads(
        self, principal: Principal, texts: Sequence[str], version: int | None
    ) -> Reads[list[list[dict[str, Any]]]]:
        vocabulary = yield from self.cache.lookup(principal, version)
        mapping = yield from self.store.mapping_reads()
        plans = [self._plan(text, mapping.search_analyzers) for text in texts]
        memo = None
        if self.analyses is not None:
            memo = self.analyses.bind(principal.tenant_id, principal.user_id, version, mapping.fingerprint)
        analyses = yield from self._analyses(principal, texts, plans, memo)
        return [self._render(plan, analysis, vocabulary) for plan, analysis in zip(plans, analyses, strict=True)]

    def _analyses(
        self,
        principal: Principal,
        texts: Sequence[str],
        plans: Sequence[_Plan],
        memo: BoundAnalysisCache | None,
    ) -> Reads[list[Analysis]]:
        """Each text's analysis (one answer per request of its plan): from the cache when it holds
        the text's, the others in one round trip (none when every text was cached)."""
        found: list[Analysis | None] = [memo.get(text) if memo is not None else None for text in texts]
        missing = [i for i, analysis in enumerate(found) if analysis is None]
        answers = yield from self.store.analyze(principal, [r for i in missing for r in plans[i].requests])
        at = 0
        for i in missing:
            analysis = tuple(answers[at : at + len(plans[i].requests)])
            at += len(plans[i].requests)
            found[i] = analysis
            if memo is not None:
                memo.put(texts[i], analysis)
        return [analysis for analysis in found if analysis is not None]

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
        self, plan: _Plan, analyses: Sequence[dict[str, Positions]], vocabulary: TenantVocabulary
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
        positions=vocab.held_at(positions),
        alternatives=True,
    )
