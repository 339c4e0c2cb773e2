"""Recall by the tenant's own vocabulary (service/recall/vocabulary.py): the one-edit rule, Lucene's
fuzzy weights and expansion order, the vocabulary read from OpenSearch's own analysis of one
tenant only, and its cache (write versions in Redis, LRU bounds)."""

from __future__ import annotations

import random
import uuid

import pytest

from service.config import Settings
from service.domain.principal import Principal
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
from service.storage.vocabulary import (
    UNIT_SEPARATOR,
    UNITS_FIELD,
    UNITS_MARKER,
    AnalysisRequest,
    TenantUnits,
    VocabularyStore,
)
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
    vocab = FieldVocabulary.build(["mongo", "kafka", "kafkas", "kafkab", "redis", "ts", "tsx", "k8s"])
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
    reached = FieldVocabulary.build(terms).fuzzy("abcdef")
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


def _brute_force_fuzzy(terms: list[str], token: str) -> tuple[tuple[str, float], ...]:
    """The rule spelled out over every term (the compact structure must agree with it)."""
    if len(token) < 4:
        return ((token, 1.0),) if token in terms else ()
    found = {}
    for term in set(terms):
        if term[:2] != token[:2]:
            continue
        edits = edits_within_one(term[2:], token[2:])
        if edits is not None:
            found[term] = fuzzy_factor(edits, len(term), len(token))
    ranked = sorted(found.items(), key=lambda tw: (-tw[1], tw[0].encode()))
    return tuple(ranked[:20])


def test_compact_vocabulary_matches_the_rule_over_every_term() -> None:
    rng = random.Random(16)
    alphabet = "abcdeé日本"
    terms = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    terms += ["redis cache", "rediscache", "sticky sessions", "セッション ストア", "레디스"]
    vocab = FieldVocabulary.build(terms)
    assert vocab.terms == frozenset(terms) and len(vocab) == len(set(terms))
    probes = terms[:400] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(2000)]
    for token in probes:
        assert vocab.fuzzy(token) == _brute_force_fuzzy(terms, token), token
        assert (token in vocab) == (token in set(terms))
        assert vocab.exact(token) == (((token, 1.0),) if token in set(terms) else ())
    assert FieldVocabulary.build([]).fuzzy("kafka") == () and "kafka" not in FieldVocabulary.build([])


def _stored_units(store: BeliefStore, tenant: str, belief_id: str) -> list[str]:
    found = store.client.search(
        index=store.alias,
        routing=tenant,
        body={"size": 1, "query": {"ids": {"values": [f"{tenant}:{belief_id}"]}}, "docvalue_fields": [UNITS_FIELD]},
    )
    hit = found["hits"]["hits"][0]
    assert UNITS_FIELD not in hit["_source"]  # never in the stored belief: the model's document only
    return sorted(hit.get("fields", {}).get(UNITS_FIELD, []))


def test_every_write_stores_the_index_analysis_of_the_names(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    first = make_belief(tenant, "ann", "redis_cache", aliases=["RedisCache", "sticky sessions", "セッションストア"])
    store.put(first, refresh="true")
    put_all(store, make_belief(tenant, "ann", "kafka_setup", aliases=["kafkab"]))
    groups = store.vocabulary.mapping().all_groups()
    ids = [f"{tenant}:{first.id}"]
    vectors = store.client.mtermvectors(
        index=store.alias, body={"ids": ids}, routing=tenant, fields=",".join(groups), positions=False
    )["docs"][0]["term_vectors"]
    # exactly what OpenSearch's index analysis of the stored document gives, per group
    from_index = sorted(f"{g}{UNIT_SEPARATOR}{t}" for g, v in vectors.items() for t in v["terms"])
    assert _stored_units(store, tenant, first.id) == sorted([UNITS_MARKER, *from_index])
    assert f"aliases{UNIT_SEPARATOR}sticky sessions" in from_index
    assert any(
        u.startswith(f"canonical_name{UNIT_SEPARATOR}") for u in _stored_units(store, tenant, "b-kafka-setup-ann")
    )
    # an optimistic replace (alias add/remove, supersede, redaction) re-analyses the new names
    _, seq_no, term = store.get_versioned(principal(tenant, "ann"), first.id)
    store.replace(
        first.model_copy(update={"aliases": ["memcached"]}), if_seq_no=seq_no, if_primary_term=term, refresh="true"
    )
    units = _stored_units(store, tenant, first.id)
    assert f"aliases{UNIT_SEPARATOR}memcached" in units
    assert not any("sticky" in u or "セッション" in u for u in units)  # the old names are gone


def _tenant_units(store: BeliefStore, me: Principal) -> TenantUnits:
    """The tenant's units read from doc values in one page, checked against the same read by the
    terms aggregation (the path of a tenant larger than a page): both must hold the same units."""
    from_doc_values = calls.run(store.client, store.vocabulary.tenant_units(me))
    aggregated = calls.run(store.client, store.vocabulary.tenant_units(me, doc_page=0))
    assert from_doc_values == aggregated
    return from_doc_values


def test_vocabulary_is_one_search_and_documents_without_units_still_count(store: BeliefStore) -> None:
    mine, theirs = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    put_all(
        store,
        make_belief(mine, "ann", "redis_cache", aliases=["sticky sessions"]),
        make_belief(theirs, "bob", "kafka_setup", aliases=["kafkab"]),
    )
    me = principal(mine, "zed")
    with_units = _tenant_units(store, me)
    assert with_units.documents == 1 and with_units.legacy == 0
    assert "sticky sessions" in with_units.groups["aliases"]
    assert not any("kafka" in t for terms in with_units.groups.values() for t in terms)  # never another tenant's
    # a document written before the units existed (or by other means): read from term vectors
    legacy = make_belief(mine, "ann", "event_bus", aliases=["rabbitmq"])
    store.client.index(
        index=store.alias, id=f"{mine}:{legacy.id}", routing=mine, body=legacy.to_document(), refresh="true"
    )
    mixed = _tenant_units(store, me)
    assert mixed.documents == 2 and mixed.legacy == 1
    assert {"sticky sessions", "rabbitmq"} <= mixed.groups["aliases"]
    assert {"redis cache", "event bus"} <= mixed.groups["canonical_name"]
    # and the same vocabulary as if every document had its units
    put_all(store, legacy)
    rewritten = _tenant_units(store, me)
    assert rewritten.legacy == 0 and rewritten.groups == mixed.groups
    cache = VocabularyCache(store.vocabulary, None)
    vocabulary = cache.get(me)
    assert "rabbitmq" in vocabulary.field("aliases") and "rabbitmq" in vocabulary.field("aliases.shingle")
    assert vocabulary.field("aliases").fuzzy("rabbitmqs") == (("rabbitmq", 0.875),)


def test_the_trimmed_analysis_answer_keeps_every_request_in_its_place(store: BeliefStore) -> None:
    """The analysis reads its ``_mtermvectors`` answer through ``filter_path``: a text that
    analyses to nothing must still answer ``{}`` in its own place, not shift the next one's."""
    vocab = VocabularyStore(store.client, store.alias)
    analyzers = calls.run(store.client, vocab.search_analyzers_reads())
    words = {"aliases": analyzers["aliases"]}
    texts = ["!!!", "kafka kafka setup", "  ", "Redis"]
    requests = [AnalysisRequest({"aliases": text}, words) for text in texts]
    requests.insert(2, AnalysisRequest({"aliases": "no field asked"}, {}))  # not sent at all
    answers = calls.run(store.client, vocab.analyze(principal("t-trim", "u1"), requests))
    assert answers == [
        {},
        {"aliases": (("kafka",), ("kafka",), ("setup",))},
        {},
        {},
        {"aliases": (("redis",),)},
    ]
