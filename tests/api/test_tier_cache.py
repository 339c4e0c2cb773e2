"""The filter-tier cache (persona, pinned facts, open questions) through POST /v1/recall.

Real OpenSearch and Redis. Every assertion compares what recall answers with what it must answer;
the cache's hit counter only shows that the cached path was the one taken.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.domain.belief import Belief
from service.recall.tier_cache import TierCache, refresh_filter_tiers
from service.storage.beliefs import BeliefStore, FilterTiers, RelevantTier
from tests.api.conftest import RequestLog, Team, belief_body, ok

SCOPES = ["domain:code", "project:pay"]


def _recall(client: TestClient, team: Team, user: str, scopes: list[str] = SCOPES) -> dict[str, Any]:
    return ok(client.post("/v1/recall", json={"scopes": scopes, "query": "hello there"}, headers=team.h(user)))


def _pinned(answer: dict[str, Any]) -> list[str]:
    return [item["id"] for item in answer["tiers"]["pinned"]]


def _questions(answer: dict[str, Any]) -> list[str]:
    return [item["id"] for item in answer["tiers"]["questions"]]


def _add(client: TestClient, team: Team, user: str, belief_id: str, scope: str, **extra: Any) -> None:
    body = belief_body(f"thing_{belief_id.replace('-', '_')}", scope, id=belief_id, **extra)
    ok(client.post("/v1/beliefs", json=body, headers=team.h(user)), 201)


def _cache(services: Services) -> TierCache:
    cache = services.recall.builder.tier_cache
    assert cache is not None and cache.enabled
    return cache


def test_a_repeated_recall_is_served_from_the_cache_with_the_same_answer(
    client: TestClient, services: Services, team: Team
) -> None:
    _add(client, team, "alice", "b-pin", "domain:code", pinned=True)
    _add(client, team, "alice", "b-style", "user:universal", content="Prefers short answers.")
    first = _recall(client, team, "alice")
    hits = _cache(services).hits
    second = _recall(client, team, "alice")
    assert _cache(services).hits == hits + 2  # her persona, the scope list's pinned facts and questions
    assert _pinned(first) == _pinned(second) == ["b-pin"]
    assert first["persona"] == second["persona"] and "short answers" in first["persona"]
    assert first["injection"] == second["injection"]


def test_a_colleagues_write_invalidates(client: TestClient, team: Team) -> None:
    assert _pinned(_recall(client, team, "alice")) == []
    _add(client, team, "bob", "b-shared", "project:pay", pinned=True)
    assert _pinned(_recall(client, team, "alice")) == ["b-shared"]
    ok(client.post("/v1/beliefs/b-shared/unpin", headers=team.h("bob")))
    assert _pinned(_recall(client, team, "alice")) == []


def test_a_write_in_another_scope_invalidates(client: TestClient, team: Team) -> None:
    """A write the cached scopes cannot see still bumps the tenant's version: the cache never
    decides what a write could have changed."""
    _add(client, team, "alice", "b-q", "domain:code", type="open_question", pinned=True)
    assert _questions(_recall(client, team, "alice")) == ["b-q"]
    _add(client, team, "alice", "b-elsewhere", "domain:writing", pinned=True)
    assert _questions(_recall(client, team, "alice")) == ["b-q"]
    ok(client.post("/v1/beliefs/b-q/resolve", json={}, headers=team.h("alice")))
    assert _questions(_recall(client, team, "alice")) == []


def test_a_write_through_the_store_invalidates(
    client: TestClient, services: Services, team: Team, store: BeliefStore
) -> None:
    """Writes by another process (a worker's lifecycle, here the tests' own store) bump the same
    version in Redis."""
    assert _pinned(_recall(client, team, "alice")) == []
    record = belief_body("from_a_worker", "domain:code", id="b-worker", pinned=True, owner_id="alice")
    store.put(Belief.from_record(record, tenant_id=team.tenant))
    assert _pinned(_recall(client, team, "alice")) == ["b-worker"]


def test_a_users_persona_is_one_entry_for_all_their_scope_lists(
    client: TestClient, services: Services, team: Team
) -> None:
    """A session in a new project reuses the user's persona (one hit) and searches its own pinned
    facts; her new universal preference reaches every scope list at once (the tenant's version)."""
    _add(client, team, "alice", "b-style", "user:universal", content="Prefers short answers.")
    _add(client, team, "alice", "b-pin", "domain:writing", pinned=True)
    first = _recall(client, team, "alice")
    hits = _cache(services).hits
    other = _recall(client, team, "alice", ["domain:writing"])
    assert _cache(services).hits == hits + 1  # the persona only
    assert other["persona"] == first["persona"] and "short answers" in other["persona"]
    assert _pinned(other) == ["b-pin"] and _pinned(first) == []
    assert _recall(client, team, "bob", ["domain:writing"])["persona"] is None  # her persona is hers
    _add(client, team, "alice", "b-tone", "user:universal", content="Writes in British English.")
    for scopes in (SCOPES, ["domain:writing"]):
        persona = _recall(client, team, "alice", scopes)["persona"]
        assert "short answers" in persona and "British English" in persona


def test_two_tenants_and_two_users_never_share_entries(client: TestClient, team: Team, other_team: Team) -> None:
    """Same user ids, same scopes, same message in two tenants; two users of one tenant; one user
    with two scope lists: each answer is its own, cached or not."""
    _add(client, team, "alice", "b-a", "domain:code", pinned=True)
    _add(client, other_team, "alice", "b-b", "domain:code", pinned=True)
    _add(client, team, "bob", "b-bob", "domain:code", pinned=True)
    for _ in range(2):  # the second round is served from the cache
        assert _pinned(_recall(client, team, "alice")) == ["b-a"]
        assert _pinned(_recall(client, other_team, "alice")) == ["b-b"]
        assert _pinned(_recall(client, team, "bob")) == ["b-bob"]
        assert _pinned(_recall(client, team, "alice", ["domain:writing"])) == []


def test_after_a_write_a_refresh_gives_the_next_recall_the_new_answer_from_the_cache(
    client: TestClient, services: Services, team: Team
) -> None:
    """What the API's listener does on a write's notice (service/recall/vocabulary_warmer.py):
    the filter tiers of the tenant's recent callers are searched again at the new version, and
    their next recall is served from the cache with what it would have searched itself."""
    cache = _cache(services)
    assert _pinned(_recall(client, team, "alice")) == []
    _add(client, team, "bob", "b-new", "project:pay", pinned=True)
    assert refresh_filter_tiers(cache, services.store, team.tenant, within_s=60) == 2  # alice's two entries
    assert refresh_filter_tiers(cache, services.store, team.tenant, within_s=60) == 0  # already current
    hits = cache.hits
    assert _pinned(_recall(client, team, "alice")) == ["b-new"]
    assert cache.hits == hits + 2
    ok(client.post("/v1/beliefs/b-new/unpin", headers=team.h("bob")))
    assert refresh_filter_tiers(cache, services.store, team.tenant, within_s=60) == 2
    assert _pinned(_recall(client, team, "alice")) == [] and cache.hits == hits + 4


def test_a_refresh_searches_only_the_tenants_recent_callers(
    client: TestClient, services: Services, team: Team, other_team: Team, requests_log: RequestLog
) -> None:
    cache = _cache(services)
    _add(client, team, "alice", "b-a", "domain:code", pinned=True)
    _add(client, other_team, "alice", "b-b", "domain:code", pinned=True)
    assert _pinned(_recall(client, team, "alice")) == ["b-a"]
    assert _pinned(_recall(client, team, "bob")) == []
    assert _pinned(_recall(client, other_team, "alice")) == ["b-b"]
    _add(client, team, "bob", "b-bob", "project:pay", pinned=True)
    assert refresh_filter_tiers(cache, services.store, team.tenant, within_s=0) == 0  # none that recent
    requests_log.sent.clear()
    assert refresh_filter_tiers(cache, services.store, team.tenant, within_s=60) == 4  # alice's and bob's
    assert [url.rsplit("/", 1)[-1] for url in requests_log.recall_requests()] == ["_msearch"]  # in one request
    hits = cache.hits
    assert sorted(_pinned(_recall(client, team, "alice"))) == ["b-a", "b-bob"]
    assert _pinned(_recall(client, team, "bob")) == ["b-bob"]
    assert _pinned(_recall(client, other_team, "alice")) == ["b-b"]  # the other tenant: its own, as before
    assert cache.hits == hits + 6  # two entries each; the other tenant's were still current


def test_without_a_write_version_nothing_is_cached(services: Services, team: Team) -> None:
    """The tiers of a build that has no write version (Redis unreachable for the rate limit)
    are computed, never looked up or stored."""
    cache = _cache(services)
    size, hits = len(cache), cache.hits
    from tests.conftest import principal

    services.recall.build(principal(team.tenant, "alice"), SCOPES, "hello", write_version=None)
    assert (len(cache), cache.hits) == (size, hits)


def _tiers(marker: str) -> FilterTiers:
    return FilterTiers(persona=(), pinned=(), questions=(), quarantined=(marker,))


def test_the_cache_is_bounded_by_entries_and_age() -> None:
    cache = TierCache(max_entries=2, max_age_s=0.2)
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    bound = cache.bind(tenant, 1)
    assert bound is not None
    for key in (b"a", b"b", b"c"):
        bound.put(key, _tiers(key.decode()))
    assert len(cache) == 2 and bound.get(b"a", "filters") is None and bound.get(b"c", "filters") == _tiers("c")
    time.sleep(0.25)
    assert bound.get(b"c", "filters") is None  # too old, even at the same version


def test_a_new_version_drops_the_tenants_older_entries() -> None:
    cache = TierCache(max_entries=100, max_age_s=60)
    old, new, other = cache.bind("t1", 1), cache.bind("t1", 2), cache.bind("t2", 1)
    assert old is not None and new is not None and other is not None
    old.put(b"k", _tiers("old"))
    other.put(b"k", _tiers("other"))
    assert new.get(b"k", "filters") is None
    assert len(cache) == 1 and other.get(b"k", "filters") == _tiers("other")  # another tenant's stay
    old.put(b"k", _tiers("late"))  # a recall that read v1 before the write finishes after it
    assert new.get(b"k", "filters") is None and old.get(b"k", "filters") is None and len(cache) == 1


def test_an_unknown_version_or_a_disabled_cache_binds_nothing() -> None:
    assert TierCache(max_entries=10, max_age_s=60).bind("t", None) is None
    assert TierCache(max_entries=0, max_age_s=60).bind("t", 1) is None
    assert TierCache(max_entries=10, max_age_s=60, max_bytes=0, message_max_bytes=0).bind("t", 1) is None


def test_either_budget_at_zero_turns_off_its_own_entries_only() -> None:
    only_messages = TierCache(max_entries=10, max_age_s=60, max_bytes=0).bind("t", 1)
    only_filters = TierCache(max_entries=10, max_age_s=60, message_max_bytes=0).bind("t", 1)
    assert only_messages is not None and only_filters is not None
    relevant = RelevantTier(hits=(), quarantined=("b-1",))
    for bound in (only_messages, only_filters):
        bound.put(b"persona", _tiers("persona"))
        bound.put(b"message", relevant)
    assert only_messages.get(b"persona", "filters") is None and only_messages.get(b"message", "relevant") == relevant
    assert only_filters.get(b"persona", "filters") == _tiers("persona")
    assert only_filters.get(b"message", "relevant") is None


def test_the_cache_is_bounded_by_estimated_bytes() -> None:
    """Entries holding beliefs cost their estimated bytes; the oldest go first once the bound is
    reached, and an entry larger than the whole bound is never kept."""
    from service.recall.tier_cache import estimated_bytes
    from tests.factories import make_belief

    tenant = f"t-{uuid.uuid4().hex[:6]}"
    persona = tuple(make_belief(tenant, "u", f"style_{i}", content="x" * 2000) for i in range(3))
    heavy = FilterTiers(persona=persona, pinned=(), questions=(), quarantined=())
    size = estimated_bytes(heavy)
    assert size > 3 * 2000 and estimated_bytes(_tiers("a")) < size
    cache = TierCache(max_entries=100, max_age_s=60, max_bytes=2 * size)
    bound = cache.bind(tenant, 1)
    assert bound is not None
    for key in (b"a", b"b", b"c"):
        bound.put(key, heavy)
    assert len(cache) == 2 and cache.estimated_bytes == 2 * size
    assert bound.get(b"a", "filters") is None and bound.get(b"c", "filters") == heavy
    bound.put(b"c", heavy)  # stored again: replaced, not counted twice
    assert len(cache) == 2 and cache.estimated_bytes == 2 * size
    small = TierCache(max_entries=100, max_age_s=60, max_bytes=size - 1)
    small_bound = small.bind(tenant, 1)
    assert small_bound is not None
    small_bound.put(b"a", heavy)
    assert len(small) == 0 and small.estimated_bytes == 0
    assert cache.bind(tenant, 2) is not None and cache.bind(tenant, 2).get(b"c", "filters") is None  # type: ignore[union-attr]
    assert cache.estimated_bytes == 0  # a newer version dropped the tenant's entries and their bytes


def test_per_message_entries_have_their_own_budget() -> None:
    """Relevant-tier entries (one per message) fill their own bound and never push a filter-tier
    entry out; a recall that binds a newer version drops the tenant's entries from both caches,
    even if it looks up only its filter tiers (an ``explain`` recall: an erased belief's text
    does not stay in the per-message entries)."""
    from tests.factories import make_belief

    tenant = f"t-{uuid.uuid4().hex[:6]}"
    relevant = RelevantTier(hits=(), quarantined=(make_belief(tenant, "u", "ledger_sync").id,))
    cache = TierCache(max_entries=100, max_age_s=60, max_bytes=10_000, message_max_bytes=3_000)
    bound = cache.bind(tenant, 1)
    assert bound is not None
    bound.put(b"persona", _tiers("persona"))
    for n in range(50):  # far more messages than either bound holds
        bound.put(f"message-{n}".encode(), relevant)
    assert bound.get(b"persona", "filters") == _tiers("persona")
    assert bound.get(b"message-49", "relevant") == relevant and bound.get(b"message-0", "relevant") is None
    assert len(cache) == 1 and 1 <= len(cache.messages) < 50 and cache.messages.estimated_bytes <= 3_000
    assert cache.counts().lookups == {"filters": (1, 0)}
    assert cache.messages.counts().lookups == {"relevant": (1, 1)}
    newer = cache.bind(tenant, 2)
    assert newer is not None and newer.get(b"persona", "filters") is None
    assert len(cache.messages) == 0 and cache.messages.estimated_bytes == 0


def test_a_change_retried_after_its_version_bump_was_lost_is_not_answered_from_the_cache(
    client: TestClient, services: Services, team: Team, other_team: Team
) -> None:
    """A change whose process died (or whose Redis call failed) between its write and the bump of
    the tenant's write version leaves every cache at the old version. The client's retry was
    refused as already done (409 'already retracted') without a bump, so the retracted belief
    stayed in the pinned tier until some other write of the tenant."""
    versions = services.store.versions
    assert versions is not None
    for each in (team, other_team):
        _add(client, each, "alice", "b-lost", "domain:code", pinned=True)
        assert _pinned(_recall(client, each, "alice")) == ["b-lost"]
    before = services.redis.get(versions.key(team.tenant))
    assert before is not None
    ok(client.post("/v1/beliefs/b-lost/retract", json={}, headers=team.h("alice")))
    services.redis.set(versions.key(team.tenant), before)  # the bump lost, as if the process died there
    assert _pinned(_recall(client, team, "alice")) == ["b-lost"]  # what a lost bump leaves
    retried = client.post("/v1/beliefs/b-lost/retract", json={}, headers=team.h("alice"))
    assert retried.status_code == 409, retried.text
    assert _pinned(_recall(client, team, "alice")) == []
    assert _pinned(_recall(client, other_team, "alice")) == ["b-lost"]  # the other tenant's is its own
