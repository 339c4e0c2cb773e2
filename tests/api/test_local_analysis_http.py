"""POST /v1/recall analyses the message in the API process (issue 16,
``service/storage/local_analysis.py``): no ``_mtermvectors`` round trip, and the same answer as
the node's analysis gives. Real OpenSearch and Redis; requests counted by the pass-through
wrapper of ``tests/api/conftest.py``."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.recall.context import ContextBuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from tests.api.conftest import RequestLog, Team, belief_body, ok
from tests.conftest import principal

SCOPES = ["domain:code"]


def _node_analysed(services: Services, team: Team, user: str, message: str) -> list[tuple[str, float | None]]:
    """What the recall answers with the node analysing the message (a store without the JVM)."""
    settings = services.settings
    store = BeliefStore(services.opensearch, settings.opensearch_namespace, services.store.versions)
    assert store.vocabulary.local is None
    builder = ContextBuilder(store, settings.recall, VocabularyMatcher.for_store(store, settings.recall))
    me = principal(team.tenant, user, projects=("pay",), teams=("core",))
    return [(e.belief.id, e.score) for e in builder.build(me, SCOPES, message).relevant]


def test_a_recall_sends_no_analysis_round_trip(
    client: TestClient, team: Team, services: Services, requests_log: RequestLog
) -> None:
    """After the process checked its analysis against the node (one ``_mtermvectors`` of probe
    texts, the first time it sees the index's settings), recalls send none."""
    assert services.store.vocabulary.local is not None
    ok(client.post("/v1/recall", json={"scopes": SCOPES, "query": "a first recall"}, headers=team.h("bob")))
    for name, aliases in [
        ("kafka_consumer_groups", ["kafka", "consumer lag"]),
        ("postgres_tuning", ["postgres", "work_mem"]),
        ("サーバー設定", ["サーバー設定", "server config"]),
    ]:
        ok(client.post("/v1/beliefs", json=belief_body(name, aliases=aliases), headers=team.h("alice")), 201)
    for message in [
        f"how do we size kafkas groups for consumer lag? {uuid.uuid4().hex[:6]}",
        "what postgress tunning applies to Work_Mem here",
        "サーバー設定を変更したいです",
    ]:
        requests_log.sent.clear()
        answer: dict[str, Any] = ok(
            client.post("/v1/recall", json={"scopes": SCOPES, "query": message}, headers=team.h("alice"))
        )
        assert not any("_mtermvectors" in url for _, url in requests_log.sent), requests_log.sent
        relevant = [(item["id"], item["score"]) for item in answer["tiers"]["relevant"]]
        assert relevant, (message, answer["tiers"], answer.get("injected_ids"))
        assert relevant == _node_analysed(services, team, "alice", message)


def test_a_query_with_an_unpaired_surrogate_is_a_422(client: TestClient, team: Team) -> None:
    """A JSON ``\\ud800`` escape in the query decodes to a lone surrogate, which neither the JVM
    nor the node's JSON can take: the request is refused with a clear error, never a 500."""
    body = '{"scopes": ["domain:code"], "query": "kafka and kaf\\ud800ka tuning?"}'
    headers = {**team.h("alice"), "content-type": "application/json"}
    refused = client.post("/v1/recall", content=body, headers=headers)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "validation_error"
