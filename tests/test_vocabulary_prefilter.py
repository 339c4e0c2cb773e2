"""The pre-filter in front of the compact vocabulary's searches (service/recall/vocabulary.py,
``FieldVocabulary.may_hold``): it may let an absent term through (the search answers), but it must
never reject a term the vocabulary holds, or a one-edit range one of its terms lies in, in any
script. Checked against the rule spelled out over every term, and against the units OpenSearch's
own analysis stores for names in several scripts."""

from __future__ import annotations

import random
import uuid
from itertools import pairwise
from typing import Any

import pytest

from service.recall import vocabulary as vocabulary_module
from service.recall.vocabulary import (
    KO_FIELDS,
    VOCABULARY_FIELDS,
    FieldVocabulary,
    VocabularyCache,
    VocabularyMatcher,
    _order,
    _order_key,
    _pre_filter,
    _range_key,
)
from service.storage import calls
from service.storage.beliefs import BeliefStore
from tests.conftest import principal
from tests.factories import make_belief, put_all
from tests.test_vocabulary import _brute_force_fuzzy

# Latin, accented Latin, Cyrillic, Greek, kana, kanji, hangul, digits and the space of multi-word units
ALPHABET = "abeséüßжλ日本セッ레디 7"
NAMED = [
    "redis cache",
    "rediscache",
    "sticky sessions",
    "größenlimit",
    "überwachung",
    "uberwachung",
    "セッションストア",
    "セッション ストア",
    "決済プロバイダ",
    "数据库选型",
    "테스트 방침",
    "레디스",
    "a",
    "k8s",
    "x",
]


def _terms(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 9))) for _ in range(n)] + NAMED


def test_the_filter_never_rejects_a_held_term_or_range() -> None:
    rng = random.Random(1616)
    for size in (0, 1, 7, 300, 5000):  # filters of every size, from the 64-bit minimum up
        terms = _terms(rng, size)
        vocab = FieldVocabulary.build(terms, ranges=True)
        for term in terms:
            assert vocab.may_hold(hash(term)), term
            assert vocab.may_hold(_range_key(term[:2], len(term))), term
            assert term in vocab


def test_filtered_lookups_equal_the_rule_over_every_term() -> None:
    rng = random.Random(16)
    terms = _terms(rng, 3000)
    held = set(terms)
    probes = terms[:500] + _terms(rng, 3000)
    probes += [t + c for t in NAMED for c in "sx"] + [t[:-1] for t in NAMED] + [t[1:] for t in NAMED]
    for ranges in (True, False):
        vocab = FieldVocabulary.build(terms, ranges=ranges)
        # the order the searches rely on
        assert [vocab.term(i) for i in range(len(vocab))] == sorted(held, key=_order)
        for token in probes:
            assert (token in vocab) == (token in held), token
            assert vocab.exact(token) == (((token, 1.0),) if token in held else ()), token
            assert vocab.fuzzy(token) == _brute_force_fuzzy(terms, token), token
        # the shingles' batched lookup (groups of stacked tokens, as the analysis answers them)
        groups = tuple(tuple(probes[i : i + rng.randint(1, 3)]) for i in range(0, len(probes), 3))
        assert vocab.held_at(groups) == tuple(tuple((t, 1.0) for t in g if t in held) for g in groups)


# terms one character long, a NUL (below every other character), lone surrogates and characters
# beyond the BMP: the corners of the order keys' encoding
CORNERS = [
    "a",
    "b",
    "ab",
    "a\x00",
    "\x00",
    "\x00a",
    "\ud800x",
    "x\udfff",
    "😀",
    "😀😀",
    "a😀",
    "日",
    "日本",
    "\U0010ffff",
]


def test_the_order_keys_sort_as_the_terms_do() -> None:
    rng = random.Random(2024)
    terms = _terms(rng, 2000) + CORNERS
    vocab = FieldVocabulary.build(terms)
    keys = list(vocab.order_keys)
    ordered = [vocab.term(i) for i in range(len(vocab))]
    assert keys == [_order_key(t[:2], len(t)) for t in ordered]
    # a key ranks terms as their (prefix, length) does: equal for equal pairs, ordered otherwise
    ranked = [((t[:2], len(t)), key) for t, key in zip(ordered, keys, strict=True)]
    for (pair, key), (next_pair, next_key) in pairwise(ranked):
        assert (pair < next_pair) == (key < next_key) and (pair == next_pair) == (key == next_key), (pair, next_pair)
    assert FieldVocabulary.build([]).order_keys.tolist() == []


@pytest.mark.parametrize("clamp", [1, 3, 5])
def test_lookups_hold_when_long_terms_share_a_clamped_key(monkeypatch: pytest.MonkeyPatch, clamp: int) -> None:
    """Lengths past the key's 21 bits share one key; the steps after the bisection compare real
    lengths, so such terms are still found (shown with a clamp of a few characters)."""
    monkeypatch.setattr(vocabulary_module, "_MAX_KEYED_LENGTH", clamp)
    rng = random.Random(clamp)
    terms = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 9))) for _ in range(600)] + CORNERS
    held = set(terms)
    vocab = FieldVocabulary.build(terms, ranges=True)
    probes = terms + ["".join(rng.choice("abcd") for _ in range(rng.randint(1, 10))) for _ in range(600)]
    for token in probes:
        assert (token in vocab) == (token in held), token
        assert vocab.fuzzy(token) == _brute_force_fuzzy(terms, token), token


class _CountingStr(str):
    """A vocabulary's joined terms that count the slices a lookup takes of them."""

    slices = 0

    def __getitem__(self, key: Any) -> str:
        type(self).slices += 1
        return str.__getitem__(self, key)


def test_a_long_run_of_one_prefix_and_length_is_searched_not_stepped() -> None:
    """Thousands of terms of one prefix and length (dates, versions, or a tenant's hostile names)
    are one run of equal keys: a lookup bisects it (a few slices), it does not step through it."""
    run = [f"ab{i:06d}" for i in range(5000)]
    terms = run + ["abc", "abcdefgh", "zz000001", "b"]
    built = FieldVocabulary.build(terms, ranges=True)
    vocab = FieldVocabulary(_CountingStr(built.joined), built.offsets, built.ranges)
    vocab.pre_filter, vocab.order_keys  # noqa: B018 - computed before the counting (they slice every term)
    held = set(terms)
    rng = random.Random(5)
    probes = rng.sample(run, 200) + [f"ab{i:06d}x"[:-1] + "y" for i in range(200)] + ["ab999999", "ab000000"]
    for token in probes:
        _CountingStr.slices = 0
        assert (token in vocab) == (token in held), token
        assert _CountingStr.slices <= 16, (token, _CountingStr.slices)  # log2(5000) + the match
    for token in rng.sample(run, 20) + ["ab12345", "ab1234567", "abx00001"]:
        assert vocab.fuzzy(token) == _brute_force_fuzzy(terms, token), token


def test_the_filter_rejects_most_absent_terms() -> None:
    # what it is for: an absent shingle mostly costs bit tests, not a search
    rng = random.Random(7)
    vocab = FieldVocabulary.build(_terms(rng, 5000), ranges=True)
    absent = [f"zz{i} qq{i}" for i in range(5000)]
    passed = sum(vocab.may_hold(hash(a)) for a in absent)
    assert passed < 0.06 * len(absent)


def test_ranges_of_very_long_terms_pass_the_filter() -> None:
    """Range keys spread lengths from a table up to 1,024 and by multiplication beyond: a word at
    either side of that boundary still reaches the terms one edit from it."""
    terms = ["ab" + "c" * n for n in range(1018, 1026)]
    vocab = FieldVocabulary.build(terms, ranges=True)
    for term in terms:
        assert vocab.may_hold(_range_key(term[:2], len(term))), len(term)
        assert (term, 1.0) in vocab.fuzzy(term), len(term)
        assert vocab.fuzzy(term + "d"), len(term)  # one insertion away: a range one longer


def test_the_vectorised_filter_sets_exactly_the_bits_of_the_rule() -> None:
    """``_pre_filter`` (numpy) against the rule in plain Python: each term's key and each distinct
    (prefix, length) range key set bits ``k mod bits`` of their low and high 32 bits, bit ``i``
    being bit ``i & 7`` of byte ``i >> 3``, in a filter of 10 bits per key (at least 8 bytes)."""
    rng = random.Random(77)
    # astral and lone-surrogate code points: the range keys read the terms' UTF-32 code points
    odd = ["\U0001f600", "\U0001f600ab", "\U0001f600a", "\ud83dxy", "\ud83dx", "z\udfff"]
    for size in (0, 1, 5, 64, 3000):  # the terms of _terms: nine scripts, a space, 1 to 9 characters
        ordered = sorted(set(_terms(rng, size) + odd), key=_order)
        for ranges in (False, True):
            keys = [hash(term) for term in ordered]
            if ranges:
                keys += list(dict.fromkeys(_range_key(term[:2], len(term)) for term in ordered))
            bits = max(8, -(-len(keys) * 10 // 8)) * 8
            expected = bytearray(bits // 8)
            for key in keys:
                for half in (key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF):
                    expected[(half % bits) >> 3] |= 1 << ((half % bits) & 7)
            vocabulary = FieldVocabulary.build(ordered, ranges=ranges)
            assert _pre_filter(vocabulary.joined, vocabulary.offsets, ranges) == bytes(expected), (size, ranges)


def test_memory_counts_the_filter() -> None:
    terms = _terms(random.Random(3), 2000)
    plain = FieldVocabulary.build(terms)
    ranged = FieldVocabulary.build(terms, ranges=True)
    assert len(ranged.pre_filter) > len(plain.pre_filter) >= len(set(terms)) * 10 // 8
    assert ranged.approx_bytes() > len(ranged.joined) + len(ranged.pre_filter) + ranged.order_keys.itemsize * len(
        ranged
    )


def test_the_filter_is_computed_on_first_use_only_and_is_the_same_filter() -> None:
    terms = _terms(random.Random(4), 500)
    for ranges in (False, True):
        built = FieldVocabulary.build(terms, ranges=ranges)
        restored = FieldVocabulary.restore(built.joined, built.offsets, ranges=ranges)
        for vocabulary in (built, restored):
            lazy = {"pre_filter", "order_keys"}
            assert not lazy & vocabulary.__dict__.keys()  # nothing computed by building or restoring
            estimated = vocabulary.approx_bytes()
            assert not lazy & vocabulary.__dict__.keys()  # ... nor by weighing it
            keys_bytes = vocabulary.order_keys.itemsize * len(vocabulary.order_keys)
            assert estimated >= len(vocabulary.joined) + len(vocabulary.pre_filter) + keys_bytes
        assert restored.pre_filter == built.pre_filter == _pre_filter(built.joined, built.offsets, ranges)
        assert restored.pre_filter is restored.pre_filter  # held once computed
        assert restored.order_keys == built.order_keys and restored.order_keys is restored.order_keys


def test_an_english_message_computes_no_korean_filter(store: BeliefStore) -> None:
    """A vocabulary restored for an English recall pays for the groups that recall reaches only."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    # a snake_case name: the word fields hold its joined form too (rediscache), the Korean ones not,
    # so the Korean fields get a vocabulary of their own
    put_all(store, make_belief(tenant, "ann", "redis_cache", aliases=["RedisCache", "sticky sessions"]))
    me = principal(tenant, "ann")
    assert store.versions is not None
    version = store.versions.current(tenant)
    cache = VocabularyCache(store.vocabulary, store.versions)
    vocabulary = cache.get(me, version)
    assert not any("pre_filter" in f.__dict__ for f in vocabulary.fields.values())
    matcher = VocabularyMatcher(store.vocabulary, cache)
    assert matcher.clauses(me, "how do sticky sessions work with redis caches?", version=version)
    assert cache.get(me, version) is vocabulary and cache.stats.builds == 1
    computed = {name for name, f in vocabulary.fields.items() if "pre_filter" in f.__dict__}
    assert {"aliases", "canonical_name"} <= computed
    others = {id(f) for name, f in vocabulary.fields.items() if name not in KO_FIELDS}
    korean_only = [f for name, f in vocabulary.fields.items() if name in KO_FIELDS and id(f) not in others]
    assert korean_only, "the Korean fields must have a vocabulary of their own, or this proves nothing"
    assert not any("pre_filter" in f.__dict__ for f in korean_only)


def test_every_unit_opensearch_stores_passes_the_filter(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    put_all(
        store,
        make_belief(tenant, "ann", "redis_cache", aliases=["RedisCache", "sticky sessions", "セッションストア"]),
        make_belief(tenant, "ann", "payment_provider", aliases=["決済プロバイダ", "数据库选型", "PSP"]),
        make_belief(tenant, "bob", "size_limit", aliases=["größenlimit", "Überwachung", "테스트 방침", "레디스 캐시"]),
        make_belief(tenant, "bob", "react_js", aliases=["react.js", "k8s", "C++ build"]),
    )
    me = principal(tenant, "zed")
    units = calls.run(store.client, store.vocabulary.tenant_units(me))
    vocabulary = VocabularyCache(store.vocabulary, None).get(me)
    groups = store.vocabulary.mapping().groups(VOCABULARY_FIELDS)
    assert {"aliases", "aliases.cjk", "aliases.ko"} <= set(groups)
    checked = 0
    for group, names in groups.items():
        for name in names:
            vocab = vocabulary.field(name)
            for term in units.groups.get(group, ()):
                assert vocab.may_hold(hash(term)) and term in vocab, (name, term)
                if vocab.ranges:
                    assert vocab.may_hold(_range_key(term[:2], len(term))), (name, term)
                    assert term in dict(vocab.fuzzy(term)) or len(term) < 4, (name, term)
                checked += 1
    assert checked > 40
