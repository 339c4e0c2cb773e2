"""A repeated message (agent loops, client retries) through POST /v1/recall: no OpenSearch round
trip, and the same answer as an uncached recall (issue 16).

Real OpenSearch and Redis. Requests are counted by a pass-through wrapper around the app's
OpenSearch transports (OpenSearch answers every one); every assertion on an answer compares it
with what recall must answer.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from evals.cases import paper_case_set
from evals.runner import load_corpus
from service.api.state import Services
from service.config import Settings
from service.domain.belief import Belief
from service.recall.analysis_cache import AnalysisCache
from service.recall.context import ContextBuilder, RecallBudget, RecallResult
from service.recall.tier_cache import TierCache
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.vocabulary import NameMapping
from service.telemetry import metrics
from tests.api.conftest import RequestLog, Team, belief_body, ok
from tests.conftest import principal

SCOPES = ["domain:code", "project:pay"]
MESSAGE = "how should the ledger_sync job retry after a timeout?"
CASES = paper_case_set()


def _recall(client: TestClient, team: Team, user: str, query: str = MESSAGE, **extra: Any) -> dict[str, Any]:
    body = {"scopes": SCOPES, "query": query, **extra}
    answer: dict[str, Any] = ok(client.post("/v1/recall", json=body, headers=team.h(user)))
    answer.pop("receipt_id", None)  # one per recall
    return answer


def _relevant(answer: dict[str, Any]) -> list[str]:
    return [item["id"] for item in answer["tiers"]["relevant"]]


def _add(client: TestClient, team: Team, user: str, name: str, scope: str = "project:pay") -> str:
    belief_id = f"b-{name.replace('_', '-')}"
    ok(client.post("/v1/beliefs", json=belief_body(name, scope, id=belief_id), headers=team.h(user)), 201)
    return belief_id


def _analyses(services: Services) -> AnalysisCache:
    matcher = services.recall.builder.matcher
    assert matcher is not None and matcher.analyses is not None and matcher.analyses.enabled
    return matcher.analyses


# ------------------------------------------------------------------------------ (a) repeats


def test_a_repeated_recall_sends_nothing_to_opensearch(
    client: TestClient, team: Team, requests_log: RequestLog
) -> None:
    belief_id = _add(client, team, "alice", "ledger_sync")
    first = _recall(client, team, "alice")
    assert _relevant(first) == [belief_id]
    assert requests_log.recall_requests() != []
    requests_log.sent.clear()
    for _ in range(3):
        assert _recall(client, team, "alice") == first
    assert requests_log.recall_requests() == []


def test_a_repeated_relation_hit_reads_its_participants_from_the_cache(
    client: TestClient, team: Team, requests_log: RequestLog
) -> None:
    """A relation hit brings in the beliefs it links (a read by id): repeated, that read is cached
    too, so nothing is sent."""
    relation = {
        **belief_body("payments_api_uses_session_cache", "project:pay", id="b-uses"),
        "type": "relation",
        "aliases": ["payments sessions"],
        "participants": ["b-payments-api", "b-session-cache"],
    }
    _add(client, team, "alice", "payments_api")
    _add(client, team, "alice", "session_cache")
    ok(client.post("/v1/beliefs", json=relation, headers=team.h("alice")), 201)
    query = "how do payments sessions work?"
    first = _recall(client, team, "alice", query)
    assert {"b-uses", "b-payments-api", "b-session-cache"} <= set(_relevant(first))
    requests_log.sent.clear()
    assert _recall(client, team, "alice", query) == first
    assert requests_log.recall_requests() == []


def test_with_the_caches_off_a_repeat_costs_its_round_trips(
    client: TestClient, services: Services, team: Team, requests_log: RequestLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figure the caches remove: the tiers on every repeat, and the analysis when the node
    analyses (without the in-process analysis, service/storage/local_analysis.py)."""
    belief_id = _add(client, team, "alice", "ledger_sync")
    cached = _recall(client, team, "alice")
    tiers = services.recall.builder.tier_cache
    assert tiers is not None
    monkeypatch.setattr(tiers, "max_entries", 0)
    monkeypatch.setattr(tiers.messages, "max_entries", 0)  # the per-message entries' own bounds
    monkeypatch.setattr(_analyses(services), "max_entries", 0)
    requests_log.sent.clear()
    assert _recall(client, team, "alice") == cached and _relevant(cached) == [belief_id]
    sent = requests_log.recall_requests()
    assert len(sent) == 1 and "_msearch" in sent[0], sent
    monkeypatch.setattr(services.store.vocabulary, "local", None)
    requests_log.sent.clear()
    assert _recall(client, team, "alice") == cached
    sent = requests_log.recall_requests()
    assert len(sent) == 2 and "_mtermvectors" in sent[0] and "_msearch" in sent[1], sent


# ---------------------------------------------------------------- (b) identical on and off


def _builders(store: BeliefStore, settings: Settings) -> tuple[ContextBuilder, ContextBuilder]:
    """Recall with every cache of the API (analysis, tiers) and without the two."""
    cached = ContextBuilder(
        store,
        settings.recall,
        VocabularyMatcher.for_store(store, settings.recall),
        TierCache(max_entries=10_000, max_age_s=600),
    )
    off = settings.recall.model_copy(update={"analysis_cache_entries": 0})
    return cached, ContextBuilder(store, settings.recall, VocabularyMatcher.for_store(store, off))


def test_cached_and_uncached_recalls_are_identical_over_the_papers_cases(
    store: BeliefStore, settings: Settings
) -> None:
    tenant = f"paper-repeat-{uuid.uuid4().hex[:8]}"
    load_corpus(store, tenant, CASES)
    assert store.versions is not None
    version = store.versions.current(tenant)
    cached, plain = _builders(store, settings)
    for case in CASES.static:
        who = CASES.principal(tenant, case.user_id)
        budget = RecallBudget(**case.budget) if case.budget else None

        def build(builder: ContextBuilder, **options: Any) -> RecallResult:
            return builder.build(who, case.scope, case.query, budget, write_version=version, **options)  # noqa: B023

        expected = build(plain)
        assert build(cached) == expected, case.case_id  # computed, and kept
        assert build(cached) == expected, case.case_id  # from the caches
        assert build(cached, explain=True) == build(plain, explain=True), case.case_id
    assert cached.tier_cache is not None and cached.tier_cache.hits >= len(CASES.static)
    assert cached.matcher is not None and cached.matcher.analyses is not None
    assert cached.matcher.analyses.hits >= len(CASES.static)


def test_the_lucene_querys_relevant_tier_is_never_cached(store: BeliefStore, settings: Settings, tenant: str) -> None:
    """Without vocabulary matching the fuzzy expansions draw on every tenant of the shard: another
    tenant's write could change the answer, so only the filter tiers are kept."""
    store.put(Belief.from_record(belief_body("ledger_sync", owner_id="alice"), tenant_id=tenant))
    cache = TierCache(max_entries=100, max_age_s=600)
    lucene = ContextBuilder(store, settings.recall, None, cache)
    who = principal(tenant, "alice")
    answers = [lucene.build(who, SCOPES, MESSAGE, write_version=7) for _ in range(2)]
    assert answers[0] == answers[1] and len(answers[0].relevant_ids) == 1
    assert len(cache) == 2 and cache.hits == 2  # the filter tiers only (the persona, the scoped tiers)


# --------------------------------------------------------------------- (c) writes and erase


def test_a_write_and_an_erase_by_the_tenant_invalidate(client: TestClient, team: Team) -> None:
    assert _relevant(_recall(client, team, "alice")) == []
    assert _relevant(_recall(client, team, "alice")) == []  # cached: nothing
    belief_id = _add(client, team, "bob", "ledger_sync")
    assert _relevant(_recall(client, team, "alice")) == [belief_id]
    assert _relevant(_recall(client, team, "alice")) == [belief_id]  # cached: the belief
    ok(client.delete(f"/v1/beliefs/{belief_id}", headers=team.h("carol")))
    assert _relevant(_recall(client, team, "alice")) == []


def test_a_write_drops_the_tenants_analyses(client: TestClient, services: Services, team: Team) -> None:
    """A message's words do not outlive the tenant's next write in the cache."""
    _recall(client, team, "alice")
    misses = _analyses(services).misses
    _recall(client, team, "alice")
    assert _analyses(services).misses == misses  # held
    _add(client, team, "bob", "something_else")
    _recall(client, team, "alice")
    assert _analyses(services).misses == misses + 1  # dropped with the tenant's new version


# ------------------------------------------------------------------ (d) tenants and users


def test_tenants_and_users_with_the_same_message_share_nothing(
    client: TestClient, team: Team, other_team: Team, requests_log: RequestLog
) -> None:
    mine = _add(client, team, "alice", "ledger_sync", scope="domain:code")  # alice's own
    theirs = _add(client, other_team, "alice", "ledger_sync", scope="project:pay")
    analyses = metrics.QUERY_ANALYSIS.labels(where="process")
    for round_ in range(2):  # the second round is served from the caches
        requests_log.sent.clear()
        analysed = analyses._value.get()
        assert _relevant(_recall(client, team, "alice")) == [mine]
        assert _relevant(_recall(client, team, "bob")) == []  # never alice's personal belief
        assert _relevant(_recall(client, other_team, "alice")) == [theirs]
        assert _relevant(_recall(client, other_team, "bob")) == [theirs]
        sent = requests_log.recall_requests()
        if round_ == 0:
            # one analysis (in the API process) and one search per user: nothing shared across
            # tenants or colleagues
            assert analyses._value.get() - analysed == 4
            assert sum("_mtermvectors" in url for url in sent) == 0, sent
            assert sum("_msearch" in url for url in sent) == 4, sent
        else:
            assert analyses._value.get() == analysed
            assert sent == []


# ---------------------------------------------------------------------------- (e) explain


def test_explain_bypasses_the_relevant_cache(client: TestClient, team: Team, requests_log: RequestLog) -> None:
    belief_id = _add(client, team, "alice", "ledger_sync")
    first = _recall(client, team, "alice", explain=True)
    assert _relevant(first) == [belief_id] and first["tiers"]["relevant"][0]["clauses"]
    for _ in range(2):
        requests_log.sent.clear()
        assert _recall(client, team, "alice", explain=True) == first
        # the filter tiers are cached: the relevant tier alone, as a plain search (never cached),
        # and explain's near misses
        assert [url.rsplit("/", 1)[-1] for url in requests_log.recall_requests()] == ["_search", "_search"]


# --------------------------------------------------------------- (f) analyzer fingerprint


def test_another_analyzer_fingerprint_never_reuses_an_analysis() -> None:
    cache = AnalysisCache(max_entries=100, max_age_s=60)
    before = NameMapping({"aliases": "a"}, {}, has_units=True, indices=("beliefs-v1",))
    reindexed = NameMapping({"aliases": "a"}, {}, has_units=True, indices=("beliefs-v2",))
    changed = NameMapping({"aliases": "b"}, {}, has_units=True, indices=("beliefs-v1",))
    assert len({before.fingerprint, reindexed.fingerprint, changed.fingerprint}) == 3
    analysis = ({"aliases": (("ledger",),)},)
    bound = cache.bind("t1", "alice", 1, before.fingerprint)
    assert bound is not None
    bound.put("ledger", analysis)
    assert bound.get("ledger") == analysis
    for other in (reindexed, changed):
        moved = cache.bind("t1", "alice", 1, other.fingerprint)
        assert moved is not None and moved.get("ledger") is None
    other_tenant = cache.bind("t2", "alice", 1, before.fingerprint)
    assert other_tenant is not None and other_tenant.get("ledger") is None
    colleague = cache.bind("t1", "bob", 1, before.fingerprint)
    assert colleague is not None and colleague.get("ledger") is None
    assert cache.bind("t1", "alice", None, before.fingerprint) is None
    assert AnalysisCache(max_entries=0, max_age_s=60).bind("t1", "alice", 1, before.fingerprint) is None


def test_a_new_mapping_analyses_again(store: BeliefStore, settings: Settings, tenant: str) -> None:
    """The matcher keys its analyses by the mapping it read: once the alias names another index,
    the message is sent for analysis again (and renders the same clauses, the analyzers being
    the same here)."""
    store.put(Belief.from_record(belief_body("ledger_sync", owner_id="alice"), tenant_id=tenant))
    matcher = VocabularyMatcher.for_store(store, settings.recall)
    assert matcher.analyses is not None
    who = principal(tenant, "alice")
    first = matcher.clauses(who, MESSAGE, version=1)
    assert first  # the message names the tenant's belief
    assert matcher.clauses(who, MESSAGE, version=1) == first
    assert (matcher.analyses.hits, matcher.analyses.misses) == (1, 1)
    mapping = store.vocabulary.mapping()
    moved = NameMapping(mapping.search_analyzers, mapping.index_analyzers, mapping.has_units, ("beliefs-next",))
    store.vocabulary._mapping = moved
    try:
        assert matcher.clauses(who, MESSAGE, version=1) == first
        assert (matcher.analyses.hits, matcher.analyses.misses) == (1, 2)
    finally:
        store.vocabulary._mapping = mapping
