"""The message's analysis sent while the caller's rate limit is charged (``POST /v1/recall``,
issue 16): the recall takes that answer instead of a second ``_mtermvectors``, answers exactly as
without it, and nothing is sent ahead for a credential not verified in this process, a message
whose analysis is cached, a budget, or a credential the limiter is refusing.

Real OpenSearch and Redis; the OpenSearch requests are counted by the pass-through wrapper of
``test_repeat_recall`` (OpenSearch answers every one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opensearchpy import AsyncOpenSearch
from prometheus_client import REGISTRY

from service.api.state import Services
from service.errors import NotFound, TenureError
from service.storage import calls
from service.storage.calls import Call
from tests.api.conftest import Team, belief_body, ok
from tests.api.test_repeat_recall import RequestLog, requests_log  # noqa: F401 - the fixture

SCOPES = ["domain:code", "project:pay"]
MESSAGE = "how should the ledger_sync job retry after a timeout?"


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("tenure_recall_analysis_ahead_total", {"outcome": outcome}) or 0.0


def _counts() -> tuple[float, float]:
    return _count("sent"), _count("used")


def _recall(client: TestClient, team: Team, user: str, query: str, status: int = 200, **extra: Any) -> Any:
    response = client.post("/v1/recall", json={"scopes": SCOPES, "query": query, **extra}, headers=team.h(user))
    answer = ok(response, status)
    if status == 200:
        answer.pop("receipt_id")  # one per recall
    return answer


def _seed(client: TestClient, team: Team) -> None:
    for name in ("ledger_sync", "retry_policy", "session_cache"):
        body = belief_body(name, "project:pay", id=f"b-{name.replace('_', '-')}")
        ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    _recall(client, team, "alice", "warm up: the mapping is read, alice's key verified")


def _analyses(log: RequestLog) -> int:
    return sum("_mtermvectors" in url for url in log.recall_requests())


def test_a_recall_takes_the_analysis_sent_during_the_charge(
    client: TestClient,
    services: Services,
    team: Team,
    other_team: Team,
    requests_log: RequestLog,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _seed(client, team)
    _seed(client, other_team)
    messages = [MESSAGE, "retry policy for the session cache", "ledger sync retries and retry policies"]
    with_ahead = []
    for message in messages:
        sent, used = _counts()
        requests_log.sent.clear()
        with_ahead.append(_recall(client, team, "alice", message))
        assert _counts() == (sent + 1, used + 1), message
        assert _analyses(requests_log) == 1, requests_log.sent  # the one sent ahead, not a second
    monkeypatch.setattr(services.recall.builder.defaults, "analysis_ahead", False)
    without = []
    for message in messages:
        sent, used = _counts()
        without.append(_recall(client, other_team, "alice", message))  # the same beliefs and ids
        assert _counts() == (sent, used)
    assert with_ahead == without
    assert [item["id"] for item in with_ahead[0]["tiers"]["relevant"]] == ["b-ledger-sync"]


def test_nothing_is_sent_ahead_when_the_recall_could_not_use_it(client: TestClient, team: Team) -> None:
    _seed(client, team)
    _recall(client, team, "alice", MESSAGE)
    before = _counts()
    _recall(client, team, "alice", MESSAGE)  # a repeat: its analysis is cached
    _recall(client, team, "alice", "ledger sync with a budget", budget={"max_beliefs": 5})
    _recall(client, team, "alice", "")  # nothing to analyse
    _recall(client, team, "bob", "bob's first request verifies his key on a worker thread")
    assert _counts() == before
    _recall(client, team, "bob", "bob's key is now verified in this process")
    assert _counts() == (before[0] + 1, before[1] + 1)


def test_a_refused_credential_sends_nothing_ahead(
    client: TestClient, services: Services, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(client, team)
    monkeypatch.setattr(services.limiter, "per_s", 0.01)
    monkeypatch.setattr(services.limiter, "burst", 1)
    _recall(client, team, "bob", "bob's key verified, his bucket at one token")  # takes the token
    sent, used = _counts()
    refused = _recall(client, team, "bob", "refused, sent ahead before the charge said so", status=429)
    assert refused["error"]["code"] == "rate_limited"
    assert _counts() == (sent + 1, used)
    assert services.limiter.refusing(services.guard.cached(team.keys["bob"], "testclient").identity)  # type: ignore[union-attr]
    for _ in range(3):
        _recall(client, team, "bob", "refused again: nothing ahead while refused", status=429)
    assert _counts() == (sent + 1, used)
    # another credential of the tenant is not refused
    _recall(client, team, "alice", "alice's bucket is her own")
    assert _counts() == (sent + 2, used + 1)


def test_a_revoked_key_gets_its_401_and_nothing_of_what_was_sent(client: TestClient, team: Team) -> None:
    _seed(client, team)
    key_id = team.keys["alice"].split("_")[1]
    ok(client.delete(f"/v1/admin/keys/{key_id}", headers=team.h("carol")))
    sent, used = _counts()
    refused = client.post("/v1/recall", json={"scopes": SCOPES, "query": MESSAGE}, headers=team.h("alice"))
    assert refused.status_code == 401 and "ledger" not in refused.text
    assert _counts()[1] == used and _counts()[0] in (sent, sent + 1)


# ------------------------------------------------------------------ calls.arun with an Ahead


def _analysis_call(index: str) -> Call:
    doc = {
        "doc": {"canonical_name": "ledger sync"},
        "fields": ["canonical_name"],
        "positions": True,
        "field_statistics": False,  # the answer depends on the text alone
        "routing": "t-ahead",
    }
    return Call("mtermvectors", {"index": index, "body": {"docs": [doc]}}, "analyse the recall query")


def _read(call: Call) -> Generator[Call, Any, Any]:
    try:
        return (yield call)
    except TenureError as exc:
        return exc


def _run(opensearch_url: str, reads: Any, ahead_call: Call | None) -> tuple[Any, bool | None]:
    async def main() -> tuple[Any, bool | None]:
        client = AsyncOpenSearch(hosts=[opensearch_url], max_retries=0)
        try:
            ahead = calls.Ahead(client, ahead_call) if ahead_call is not None else None
            value = await calls.arun(client, reads, ahead)
            await asyncio.sleep(0.3)  # an unused ahead's answer arrives and is dropped
            return value, (ahead.used if ahead is not None else None)
        finally:
            await client.close()

    return asyncio.run(main())


def test_arun_answers_an_equal_call_from_the_ahead_and_sends_any_other(
    opensearch_url: str, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    call = _analysis_call(store.alias)
    plain, _ = _run(opensearch_url, _read(call), None)
    taken, used = _run(opensearch_url, _read(call), call)
    assert used is True and taken == plain and plain["docs"][0]["term_vectors"]
    other = _analysis_call("tenure-no-such-index")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        sent, used = _run(opensearch_url, _read(call), other)  # the read never asks for it
    assert used is False and sent == plain
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_failure_sent_ahead_reaches_the_read_as_its_own_would(opensearch_url: str) -> None:
    missing = Call("search", {"index": "tenure-no-such-index", "body": {"size": 1}}, "search", on_missing="no index")
    plain, _ = _run(opensearch_url, _read(missing), None)
    taken, used = _run(opensearch_url, _read(missing), missing)
    assert used is True
    assert isinstance(plain, NotFound) and isinstance(taken, NotFound) and taken.message == plain.message
