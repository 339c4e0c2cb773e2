"""Every write is seen by the tenant's next recall through its vocabulary (issue 16).

Through ``POST /v1/recall`` with real OpenSearch and Redis: after the first recall built the
tenant's vocabulary, every write is followed by a recall that must see it (a new alias, fuzzily;
a removed alias gone; a retracted or superseded belief no longer injected). A write bumps the
tenant's write version, so the next recall rebuilds the vocabulary (one aggregation over the units
each write stored) and the cached one equals a fresh build from the index.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.domain.principal import Principal
from service.recall.vocabulary import VOCABULARY_FIELDS, TenantVocabulary, VocabularyCache, VocabularyMatcher
from service.storage import calls
from service.storage.calls import Reads
from service.storage.vocabulary import TenantTerms, VocabularyStore
from tests.api.conftest import Team, belief_body, ok

SCOPES = ["domain:code"]


def _names(client: TestClient, team: Team, query: str) -> list[str]:
    answer = ok(client.post("/v1/recall", json={"scopes": SCOPES, "query": query}, headers=team.h("alice")))
    return [item["canonical_name"] for item in answer["tiers"]["relevant"]]


def _matcher(services: Services) -> VocabularyMatcher:
    matcher = services.recall.builder.matcher
    assert matcher is not None
    return matcher


def _kept(services: Services, team: Team) -> TenantVocabulary:
    return next(v for v in _matcher(services).cache.entries() if v.tenant_id == team.tenant)


def _same_as_a_fresh_build(services: Services, team: Team) -> None:
    """The cached vocabulary equals one built from scratch from the index, term vectors included
    (what the vocabulary was read from before units were stored at write time)."""
    me = Principal(tenant_id=team.tenant, user_id="alice")
    kept = _kept(services, team)
    fresh = VocabularyCache(VocabularyStore(services.store.client, services.store.alias), None).get(me)
    assert kept.documents == fresh.documents and kept.legacy_documents == 0
    vectors = calls.run(services.store.client, fresh_terms(services, me))
    for name in VOCABULARY_FIELDS:
        assert kept.field(name).terms == fresh.field(name).terms == vectors.fields[name], name


def fresh_terms(services: Services, me: Principal) -> Reads[TenantTerms]:
    """The tenant's terms per searched field from term vectors (OpenSearch analysing every
    document again)."""
    return VocabularyStore(services.store.client, services.store.alias).tenant_terms(me, VOCABULARY_FIELDS)


def _post(client: TestClient, team: Team, path: str, body: dict[str, Any] | None = None, status: int = 200) -> Any:
    return ok(client.post(path, json=body, headers=team.h("alice")), status)


def test_writes_update_the_vocabulary_and_recall_follows_them(
    client: TestClient, services: Services, team: Team
) -> None:
    _post(client, team, "/v1/beliefs", belief_body("event_bus", "domain:code", id="b-bus", aliases=["kafka"]), 201)
    assert _names(client, team, "kafkas setup") == ["event_bus"]  # builds the tenant's vocabulary
    stats = _matcher(services).cache.stats
    builds = stats.builds

    # a new belief: its alias is found (one edit away) by the next recall
    _post(
        client, team, "/v1/beliefs", belief_body("cache_layer", "domain:code", id="b-cache", aliases=["memcached"]), 201
    )
    assert _names(client, team, "memcachd tuning") == ["cache_layer"]
    # an alias added to an existing belief
    _post(client, team, "/v1/beliefs/b-bus/aliases", {"aliases": ["rabbitmq"]})
    assert _names(client, team, "rabbitmqs queue") == ["event_bus"]
    _same_as_a_fresh_build(services, team)

    # an alias removed: its term leaves the vocabulary, and the word reaches nothing
    _post(client, team, "/v1/beliefs/b-bus/aliases/remove", {"aliases": ["rabbitmq"]})
    assert _names(client, team, "rabbitmqs queue") == []
    assert "rabbitmq" not in _kept(services, team).field("aliases").terms
    # retracted: never injected again (its names stay in the vocabulary, as in the index)
    _post(client, team, "/v1/beliefs/b-cache/retract", {"reason": "gone"})
    assert _names(client, team, "memcachd tuning") == []
    # superseded: the replacement's new alias is found, the old belief is not injected
    replaced = {"id": "b-bus-2", "content": "Events go through NATS now.", "aliases": ["nats"]}
    _post(client, team, "/v1/beliefs/b-bus/supersede", replaced, 201)
    assert _names(client, team, "natss streaming") == ["event_bus"]
    answer = ok(client.post("/v1/recall", json={"scopes": SCOPES, "query": "kafkas setup"}, headers=team.h("alice")))
    assert [i["id"] for i in answer["tiers"]["relevant"]] == ["b-bus-2"]  # the old name reaches the new one

    _same_as_a_fresh_build(services, team)
    assert stats.builds >= builds + 5  # every write was followed by a rebuild
