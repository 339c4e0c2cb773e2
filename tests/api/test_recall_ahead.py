"""A recall started beside its rate limit's round trip (service/api/recall_ahead.py) is used only
when that round trip confirms the caller and the tenant's write version, so the answers are
those of a recall started after it: the same for warm callers of two tenants, and after a write,
a revoked key or changed grants the early recall is discarded and the request answers as the
records are now. (A refused caller: tests/api/test_rate_limit.py.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.recall_ahead import RecallAhead
from service.api.state import Services
from service.domain.principal import Principal, Role
from service.telemetry import metrics
from tests.api.conftest import Team, belief_body, ok, recallable_name, without_ids


def _ahead(outcome: str) -> float:
    return float(metrics.RECALL_AHEAD.labels(outcome)._value.get())


class Outcomes:
    """The early recalls' outcomes since the last :meth:`since` call."""

    def __init__(self) -> None:
        self.used, self.discarded = _ahead("used"), _ahead("discarded")

    def since(self) -> tuple[float, float]:
        used, discarded = _ahead("used"), _ahead("discarded")
        delta = (used - self.used, discarded - self.discarded)
        self.used, self.discarded = used, discarded
        return delta


@pytest.fixture
def ahead_on(services: Services) -> Iterator[None]:
    assert services.settings.api.recall_ahead  # on by default
    yield
    services.settings.api.recall_ahead = True


def _recall(client: TestClient, headers: dict[str, str], query: str, scopes: list[str]) -> dict[str, Any]:
    body = ok(client.post("/v1/recall", json={"scopes": scopes, "query": query}, headers=headers))
    assert isinstance(body, dict)
    return body


def _names(answer: dict[str, Any]) -> set[str]:
    return {item["canonical_name"] for entries in answer["tiers"].values() for item in entries}


def test_a_warm_callers_recall_is_the_early_one_with_the_same_answer(
    client: TestClient, team: Team, other_team: Team, services: Services, ahead_on: None
) -> None:
    name = recallable_name("ahead_ledger")
    for tenant in (team, other_team):
        ok(client.post("/v1/beliefs", json=belief_body(name, "project:pay"), headers=tenant.h("alice")), 201)
    query = f"how is the {name.replace('_', ' ')} sized?"
    outcomes = Outcomes()
    for caller in (team.h("alice"), team.h("bob"), other_team.h("alice")):
        _recall(client, caller, "warm up", ["project:pay"])  # the key cached, the tenant's version seen
        outcomes.since()
        early = _recall(client, caller, query, ["project:pay"])
        assert outcomes.since() == (1, 0)
        services.settings.api.recall_ahead = False
        after = _recall(client, caller, query, ["project:pay"])
        services.settings.api.recall_ahead = True
        assert outcomes.since() == (0, 0)
        assert without_ids(early) == without_ids(after) and name in _names(early)


def _write_between_two_recalls(client: TestClient, writer: TestClient, team: Team) -> tuple[float, float]:
    """alice recalls, bob writes through ``writer``, alice recalls again and finds the belief (the
    early recalls' outcomes of that recall returned), and once more (the early one is used)."""
    name = recallable_name("ahead_written")
    query = f"what about {name.replace('_', ' ')}?"
    assert name not in _names(_recall(client, team.h("alice"), query, ["project:pay"]))
    ok(writer.post("/v1/beliefs", json=belief_body(name, "project:pay"), headers=team.h("bob")), 201)
    outcomes = Outcomes()
    assert name in _names(_recall(client, team.h("alice"), query, ["project:pay"]))
    after_write = outcomes.since()
    assert name in _names(_recall(client, team.h("alice"), query, ["project:pay"]))
    assert outcomes.since() == (1, 0)
    return after_write


def test_a_write_in_ansecond_discards_the_early_one(
    client: TestClient, second: TestClient, team: Team, ahead_on: None
) -> None:
    # started at the version before the write, discarded
    assert _write_between_two_recalls(client, second, team) == (0, 1)


def test_a_write_in_this_process_starts_no_early_recall_at_the_old_version(
    client: TestClient, team: Team, ahead_on: None
) -> None:
    # the write told the limiter the version it had read is old
    assert _write_between_two_recalls(client, client, team) == (0, 0)


def test_a_key_revoked_between_two_recalls_is_refused_without_the_early_recall(
    client: TestClient, team: Team, ahead_on: None
) -> None:
    name = recallable_name("ahead_revoked")
    ok(client.post("/v1/beliefs", json=belief_body(name, "project:pay"), headers=team.h("alice")), 201)
    query = f"and {name.replace('_', ' ')}?"
    assert name in _names(_recall(client, team.h("bob"), query, ["project:pay"]))
    key_id = team.keys["bob"].split("_")[1]
    ok(client.delete(f"/v1/admin/keys/{key_id}", headers=team.h("carol")))
    outcomes = Outcomes()
    refused = client.post("/v1/recall", json={"scopes": ["project:pay"], "query": query}, headers=team.h("bob"))
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthenticated"
    assert name not in refused.text
    assert outcomes.since() == (0, 1)


def test_grants_changed_between_two_recalls_answer_with_the_new_grants(
    client: TestClient, team: Team, ahead_on: None
) -> None:
    """alice loses project ``pay``: the early recall ran with her cached grants and is discarded;
    the answer is the one her new grants allow."""
    name = recallable_name("ahead_granted")
    ok(client.post("/v1/beliefs", json=belief_body(name, "project:pay"), headers=team.h("bob")), 201)
    query = f"the {name.replace('_', ' ')} again"
    assert name in _names(_recall(client, team.h("alice"), query, ["project:pay"]))
    path = f"/v1/admin/tenants/{team.tenant}/users/alice/grants"
    ok(client.patch(path, json={"remove_projects": ["pay"]}, headers=team.h("carol")))
    outcomes = Outcomes()
    answer = client.post("/v1/recall", json={"scopes": ["project:pay"], "query": query}, headers=team.h("alice"))
    assert name not in answer.text
    assert outcomes.since() == (0, 1)


class _Recall:
    """What ``RecallAhead`` asks of the recall service: ``abuild``, here answering (or failing)
    with what it was asked for, so the test sees which build a request was given."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def abuild(self, principal: Principal, scopes: list[str], query: str, **options: Any) -> Any:
        if self.fail:
            raise RuntimeError("the store went away")
        return (principal, scopes, query, options)


def _taken(recall: _Recall, started: tuple[Principal, int], taken: tuple[Principal, int | None]) -> Any:
    async def scenario() -> Any:
        ahead = RecallAhead(["project:pay"], "q", explain=False)
        ahead.start(recall, *started)  # type: ignore[arg-type]
        built = await ahead.take(*taken)
        await asyncio.sleep(0.01)  # a discarded build runs to its end
        return built

    return asyncio.run(scenario())


def test_the_early_recall_is_taken_only_for_the_same_principal_and_write_version() -> None:
    alice, bob = Principal(tenant_id="t1", user_id="alice"), Principal(tenant_id="t1", user_id="bob")
    elsewhere = Principal(tenant_id="t2", user_id="alice")
    admin = Principal(tenant_id="t1", user_id="alice", roles=frozenset({Role.ADMIN}))
    outcomes = Outcomes()
    assert _taken(_Recall(), (alice, 7), (alice, 7)) == (
        alice,
        ["project:pay"],
        "q",
        {"explain": False, "write_version": 7},
    )
    assert outcomes.since() == (1, 0)
    for other in ((alice, 8), (alice, None), (bob, 7), (elsewhere, 7), (admin, 7)):
        assert _taken(_Recall(), (alice, 7), other) is None
        assert outcomes.since() == (0, 1)


def test_a_discarded_early_recall_that_fails_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Its error is nobody's: not an 'exception was never retrieved', not the request's."""
    alice = Principal(tenant_id="t1", user_id="alice")
    with caplog.at_level(logging.DEBUG):
        assert _taken(_Recall(fail=True), (alice, 7), (alice, 8)) is None
    assert "never retrieved" not in caplog.text
    assert "discarded" in caplog.text
