"""``POST /v1/recall`` through the recall lane (service/api/recall_lane.py) answers exactly as the
FastAPI route does: the same recall for a valid request, and for everything a caller can get
wrong the same status and error body (the lane hands those to the route, or to the app's own
handlers). Each case is sent twice over the same app, the lane on and off. (The route label of a
recall the lane served, in the metrics and the access log: tests/memory_loop/test_observability.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api import recall_lane
from service.api.recall_lane import RecallLane
from service.api.routes.recall import recall as endpoint
from service.api.state import Services
from tests.api.conftest import Team, belief_body, ok, without_ids


def _lane(app: FastAPI) -> RecallLane:
    """The app's lane instance (Starlette builds the middleware stack on the first request)."""
    layer: Any = app.middleware_stack
    while layer is not None and not isinstance(layer, RecallLane):
        layer = getattr(layer, "app", None)
    assert isinstance(layer, RecallLane), "the recall lane is not in the app's middleware"
    return layer


@pytest.fixture
def lane(client: TestClient, app: FastAPI) -> Iterator[RecallLane]:
    client.get("/healthz")  # builds the stack
    found = _lane(app)
    yield found
    found.enabled = True


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per recall the lane served itself (the route's endpoint, called by the lane)."""
    calls: list[int] = []

    async def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await endpoint(*args, **kwargs)

    monkeypatch.setattr(recall_lane, "recall", counting)
    return calls


def _both(client: TestClient, lane: RecallLane, **request: Any) -> tuple[Any, Any]:
    answers = []
    for enabled in (True, False):
        lane.enabled = enabled
        response = client.post("/v1/recall", **request)
        body = response.json() if response.headers.get("content-type", "").startswith("application/json") else None
        answers.append((response.status_code, without_ids(body), response.headers.get("X-Request-ID", "")[:4]))
    return answers[0], answers[1]


def test_a_valid_recall_is_served_by_the_lane_with_the_routes_answer(
    client: TestClient, team: Team, other_team: Team, lane: RecallLane, served: list[int]
) -> None:
    ok(client.post("/v1/beliefs", json=belief_body("lane_ledger", "project:pay"), headers=team.h("alice")), 201)
    ok(client.post("/v1/beliefs", json=belief_body("lane_ledger", "project:pay"), headers=other_team.h("alice")), 201)
    body = {"scopes": ["project:pay"], "query": "how is the lane_ledger sized?", "explain": True}
    for caller in (team.h("alice"), team.h("bob"), other_team.h("alice")):
        on, off = _both(client, lane, json=body, headers=caller)
        assert on == off and on[0] == 200
        assert [h["id"] for h in on[1]["tiers"]["relevant"]], "the belief was recalled"
    assert len(served) == 3  # the lane served each "on" call itself

    # each tenant's recall holds its own belief only (the lane resolves the caller as the route does)
    mine = ok(client.post("/v1/recall", json=body, headers=team.h("alice")))
    theirs = ok(client.post("/v1/recall", json=body, headers=other_team.h("alice")))
    assert not set(mine["injected_ids"]) & set(theirs["injected_ids"])


def test_a_request_the_lane_declines_is_the_routes(
    client: TestClient, team: Team, lane: RecallLane, served: list[int]
) -> None:
    """Two Content-Type headers: FastAPI reads the first; the lane leaves such a request to it."""
    headers = [("Content-Type", "application/json"), ("Content-Type", "application/json"), *team.h("alice").items()]
    on, off = _both(client, lane, content=b'{"query": "x"}', headers=headers)
    assert on == off and on[0] == 200
    assert served == []


BAD_REQUESTS: dict[str, dict[str, Any]] = {
    "not JSON": {"content": b'{"query": ', "headers": {"Content-Type": "application/json"}},
    "not UTF-8": {"content": b'{"query": "\xff"}', "headers": {"Content-Type": "application/json"}},
    "empty body": {"content": b"", "headers": {"Content-Type": "application/json"}},
    "nested past the recursion limit": {
        "content": b'{"query": "x", "budget": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        "headers": {"Content-Type": "application/json"},
    },
    "a JSON list": {"json": ["query"]},
    "a wrong type": {"json": {"query": 5}},
    "an unknown field": {"json": {"query": "x", "bogus": 1}},
    "a bad scope": {"json": {"scopes": ["NOT A LABEL!"], "query": "x"}},
    "a bad budget": {"json": {"query": "x", "budget": {"max_beliefs": -1}}},
    "too long a query": {"json": {"query": "x" * 20_001}},
    "no content type": {"content": b'{"query": "x"}'},
    "text/plain": {"content": b'{"query": "x"}', "headers": {"Content-Type": "text/plain"}},
    "a blank session": {"json": {"query": "x"}, "headers": {"X-Tenure-Session": "  "}},
    "too long a session": {"json": {"query": "x"}, "headers": {"X-Tenure-Session": "s" * 201}},
    "no credentials": {"json": {"query": "x"}, "auth": None},
    "another scheme": {"json": {"query": "x"}, "auth": {"Authorization": "Basic dXNlcjpwYXNz"}},
    "an unknown key": {"json": {"query": "x"}, "auth": {"Authorization": "Bearer tnr_0000000000000000_nope"}},
    "a malformed token": {"json": {"query": "x"}, "auth": {"Authorization": "Bearer not-a-token"}},
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_requests_get_the_routes_own_answer(client: TestClient, team: Team, lane: RecallLane, case: str) -> None:
    spec = dict(BAD_REQUESTS[case])
    credentials = spec.pop("auth", team.h("alice"))
    headers = spec.pop("headers", {})
    if isinstance(headers, dict):
        headers = list(headers.items())
    headers += list((credentials or {}).items())
    on, off = _both(client, lane, headers=headers, **spec)
    assert on == off
    assert on[0] >= 400 and on[2] == "req-"


def test_a_session_id_reaches_the_receipt(
    client: TestClient, team: Team, services: Services, lane: RecallLane, served: list[int]
) -> None:
    answer = ok(
        client.post(
            "/v1/recall", json={"query": "session please"}, headers={**team.h("alice"), "X-Tenure-Session": "s-lane"}
        )
    )
    assert served == [1]
    services.audit.refresh()
    page = ok(client.get("/v1/admin/audit", params={"session_id": "s-lane"}, headers=team.h("carol")))
    receipt = next(e for e in page["items"] if e["event_id"] == answer["receipt_id"])
    assert receipt["session_id"] == "s-lane" and receipt["actor_id"] == "alice"


def test_a_failure_inside_recall_is_the_apps_500(
    app: FastAPI, client: TestClient, team: Team, services: Services, lane: RecallLane, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(services.recall, "arecall", broken)
    quiet = TestClient(app, raise_server_exceptions=False)  # the running app, seen as a caller sees it
    on, off = _both(quiet, lane, json={"query": "x"}, headers=team.h("alice"))
    assert on == off and on[0] == 500 and on[1]["error"]["code"] == "internal_error"
