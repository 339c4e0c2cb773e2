"""Recall by the tenant's own vocabulary (service/recall/vocabulary.py): the one-edit rule, Lucene's
fuzzy weights and expansion order, the vocabulary read from OpenSearch's own analysis of one
tenant only, and its cache (write versions in Redis, LRU bounds)."""

from __future__ import annotations

import uuid

import pytest

from service.config import Settings
from service.recall.vocabulary import (
    VOCABULARY_FIELDS,
    FieldVocabulary,
    VocabularyCache,
    VocabularyMatcher,
    edits_within_one,
    fuzzy_factor,
)
from service.storage import calls
from service.storage.beliefs import BeliefStore
from service.storage.vocabulary import VocabularyStore
from tests.conftest import principal, recall_builder
from tests.factories import make_belief, put_all


@pytest.mark.parametrize(
    ("a", "b", "edits"),
    [
        ("kafka", "kafka", 0),
        ("kafka", "kafkas", 1),  # insertion
        ("kafkas", "kafka", 1),  # deletion
        ("kafka", "kafke", 1),  # substitution
        ("postgres", "postrges", 1),  # adjacent transposition counts as one edit
        ("kafka", "kafkass", None),
        ("redis", "rdeiss", None),
        ("", "a", 1),
        ("ab", "", None),
    ],
)
def test_one_edit_rule(a: str, b: str, edits: int | None) -> None:
    assert edits_within_one(a, b) == edits


def test_fuzzy_factor_is_lucenes_float32_boost() -> None:
    # Java: 1.0f - (float) 1 / (float) min(len): the float32 values, not the decimal ones
    assert fuzzy_factor(0, 5, 6) == 1.0
    assert fuzzy_factor(1, 5, 6) == 0.800000011920929
    assert fuzzy_factor(1, 7, 6) == 0.8333333134651184
    assert fuzzy_factor(1, 3, 4) == 0.6666666269302368  # 1 - 1/3: a float32 tie, to even


def test_fuzzy_keeps_the_prefix_guard_and_the_length_rule() -> None:
    vocab = FieldVocabulary.build(["mongo", "kafka", "kafkas", "kafkab", "redis", "ts", "tsx", "k8s"], fuzzy=True)
    assert dict(vocab.fuzzy("kafka")) == {"kafka": 1.0, "kafkas": 0.800000011920929, "kafkab": 0.800000011920929}
    assert vocab.fuzzy("mango") == ()  # one edit, but in the guarded prefix
    assert vocab.fuzzy("akfka") == ()  # a transposition across the prefix is not allowed either
    assert vocab.fuzzy("tsx") == (("tsx", 1.0),)  # under 4 characters: exact only
    assert vocab.fuzzy("ts") == (("ts", 1.0),)
    assert vocab.fuzzy("k8ss") == (("k8s", 0.6666666269302368),)  # a 4-character word reaches a 3-character term
    assert vocab.exact("kafkas") == (("kafkas", 1.0),)
    assert vocab.exact("kafkaz") == ()


def test_at_most_twenty_expansions_in_lucenes_order() -> None:
    # 26 terms one substitution from "abcdef" (last letter) and one insertion: Lucene keeps the 20
    # best boosts, ties to the smaller term in UTF-8 order
    terms = [f"abcde{chr(c)}" for c in range(ord("a"), ord("z") + 1)] + ["abcdefg"]
    reached = FieldVocabulary.build(terms, fuzzy=True).fuzzy("abcdef")
    assert len(reached) == 20
    assert reached[0] == ("abcdef", 1.0)
    assert [t for t, _ in reached[1:]] == sorted(t for t in terms if t != "abcdef")[:19]


def test_vocabulary_is_the_index_analysis_of_one_tenant(store: BeliefStore) -> None:
    mine, theirs = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    put_all(
        store,
        make_belief(mine, "ann", "redis_cache", aliases=["RedisCache", "sticky sessions", "セッションストア"]),
        make_belief(theirs, "bob", "kafka_setup", aliases=["kafkab"]),
    )
    reader = VocabularyStore(store.client, store.alias)
    terms = calls.run(store.client, reader.tenant_terms(principal(mine, "zed"), VOCABULARY_FIELDS))
    assert terms.documents == 1  # another user's belief of the tenant counts; another tenant's never
    # whole units with OpenSearch's word forms (not a copy of the analyzer: what the index holds)
    assert {"redis cache", "rediscache"} <= terms.fields["canonical_name"]
    assert {"sticky sessions", "rediscache"} <= terms.fields["aliases"]
    assert "sticky" not in terms.fields["aliases"]
    assert any("セッション" in t for t in terms.fields["aliases.cjk"])
    assert not any("kafka" in t for field in terms.fields.values() for t in field)


def test_cache_follows_the_tenant_write_version(store: BeliefStore, settings: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    me = principal(tenant, "ann")
    matcher = VocabularyMatcher.for_store(store, settings.recall)
    builder = recall_builder(store, settings, "vocabulary")
    builder.matcher = matcher
    assert builder.build(me, ["domain:code"], "kafkas setup").relevant == []  # cold and empty
    put_all(store, make_belief(tenant, "ann", "event_bus", aliases=["kafka"]))
    # the write bumped the version: the next recall rebuilds and finds the new alias, fuzzily
    assert [e.belief.canonical_name for e in builder.build(me, ["domain:code"], "kafkas setup").relevant] == [
        "event_bus"
    ]
    builds = matcher.cache.stats.builds
    builder.build(me, ["domain:code"], "kafkaa")
    assert matcher.cache.stats.builds == builds  # unchanged version: served from the cache
    assert matcher.cache.stats.hits >= 1


def test_lru_is_bounded_by_tenants_and_memory(store: BeliefStore) -> None:
    reader = VocabularyStore(store.client, store.alias)
    tenants = [f"t-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for tenant in tenants:
        put_all(store, make_belief(tenant, "ann", "event_bus", aliases=["kafka", "message queue"]))
    cache = VocabularyCache(reader, store.versions, max_tenants=2)
    for tenant in tenants:
        built = cache.get(principal(tenant, "ann"))
        assert built.build_ms > 0 and built.approx_bytes > 0
    assert len(cache) == 2 and cache.stats.evictions == 1
    tiny = VocabularyCache(reader, store.versions, max_bytes=10)
    assert "kafka" in tiny.get(principal(tenants[0], "ann")).field("aliases").terms  # still answers
    assert len(tiny) == 0 and tiny.cached_bytes == 0  # but keeps nothing over the budget


def test_without_a_version_source_nothing_is_cached(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    put_all(store, make_belief(tenant, "ann", "event_bus", aliases=["kafka"]))
    cache = VocabularyCache(VocabularyStore(store.client, store.alias), None)
    cache.get(principal(tenant, "ann"))
    cache.get(principal(tenant, "ann"))
    assert cache.stats.builds == 2 and len(cache) == 0
