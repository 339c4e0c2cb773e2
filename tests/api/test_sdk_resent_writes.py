"""A write the server did but whose answer the SDK lost (a 503 sent after the write was stored,
e.g. the write-version bump failing after the index write; a dropped connection) is not done twice:
creates carry an id made by the SDK, so the resend is told 409 and reads back its own write; a
turn carries a turn id, answered with the stored turn; other writes are not resent at all.

The app is real: each request reaches it, and only the answer of the first is replaced."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from tenure_client import AsyncTenure, Conflict, ConnectionFailed, ServiceUnavailable, Tenure

from tests.api.conftest import Team, belief_body


class LosesFirstAnswer(httpx.BaseTransport):
    """Hands every request to the app; the first one's answer is replaced by ``lost`` (a 503 or a
    dropped connection), as when the write landed but its answer never came back."""

    def __init__(self, app_client: TestClient, lost: str = "503"):
        self.app_client = app_client
        self.lost = lost
        self.sent: list[tuple[str, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.sent.append((f"{request.method} {request.url.path}", request.content))
        answer = self.app_client.send(request)
        answer.read()
        if len(self.sent) > 1:
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)
        if self.lost == "dropped":
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        return httpx.Response(503, json={"error": {"code": "store_unavailable", "message": "lost"}})


def _sdk(transport: httpx.BaseTransport, key: str) -> Tenure:
    return Tenure("http://testserver", key, transport=transport, max_retry_wait_s=0.01)


def _named(sdk: Tenure, name: str) -> list[str]:
    return [b.id or "" for b in sdk.beliefs.iter(scope=["project:pay"]) if b.canonical_name == name]


def test_a_create_whose_503_came_after_the_write_is_stored_once(client: TestClient, team: Team) -> None:
    transport = LosesFirstAnswer(client)
    name = f"resent_create_{uuid.uuid4().hex[:8]}"
    with _sdk(transport, team.keys["alice"]) as alice:
        created = alice.beliefs.create(**belief_body(name, "project:pay"))
        assert _named(alice, name) == [created.id]
    bodies = [json.loads(body) for route, body in transport.sent if route == "POST /v1/beliefs"]
    assert len(bodies) == 2 and bodies[0]["id"] == bodies[1]["id"] == created.id


def test_a_create_resent_after_a_dropped_connection_returns_its_own_write(client: TestClient, team: Team) -> None:
    transport = LosesFirstAnswer(client, lost="dropped")
    name = f"dropped_create_{uuid.uuid4().hex[:8]}"
    with _sdk(transport, team.keys["alice"]) as alice:
        created = alice.beliefs.create(**belief_body(name, "project:pay"))
        assert created.canonical_name == name and _named(alice, name) == [created.id]


def test_a_resent_create_meeting_another_write_with_its_id_is_still_a_conflict(client: TestClient, team: Team) -> None:
    taken = f"b-taken-{uuid.uuid4().hex}"
    with Tenure("http://testserver", team.keys["alice"], http_client=client) as alice:
        alice.beliefs.create(id=taken, **belief_body(f"first_{uuid.uuid4().hex[:8]}", "project:pay"))
    with _sdk(LosesFirstAnswer(client, lost="dropped"), team.keys["alice"]) as alice, pytest.raises(Conflict):
        alice.beliefs.create(id=taken, **belief_body(f"other_{uuid.uuid4().hex[:8]}", "project:pay"))


def test_a_resent_create_with_its_own_id_and_untrimmed_text_returns_its_own_write(
    client: TestClient, team: Team
) -> None:
    """The server stores a statement trimmed; the resend of a create with an id the caller chose
    still recognises its own earlier write (and is not told it conflicts with itself)."""
    own = f"b-own-{uuid.uuid4().hex}"
    body = {**belief_body(f"untrimmed_{uuid.uuid4().hex[:8]}", "project:pay"), "content": "  Trimmed.\r\n"}
    with _sdk(LosesFirstAnswer(client, lost="dropped"), team.keys["alice"]) as alice:
        created = alice.beliefs.create(id=own, **body)
    assert (created.id, created.content) == (own, "Trimmed.")


def test_the_async_client_reads_back_its_own_create_too(app: FastAPI, client: TestClient, team: Team) -> None:
    name = f"async_resent_{uuid.uuid4().hex[:8]}"
    attempts: list[str] = []

    async def scenario() -> str | None:
        inner = httpx.ASGITransport(app=app)

        async def handle(request: httpx.Request) -> httpx.Response:
            attempts.append(request.method)
            answer = await inner.handle_async_request(request)
            await answer.aread()
            if len(attempts) == 1:
                return httpx.Response(503, json={"error": {"code": "store_unavailable", "message": "lost"}})
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

        transport = httpx.MockTransport(handle)
        key = team.keys["alice"]
        async with AsyncTenure("http://testserver", key, transport=transport, max_retry_wait_s=0.01) as a:
            return (await a.beliefs.create(**belief_body(name, "project:pay"))).id

    created_id = asyncio.run(scenario())
    assert attempts == ["POST", "POST", "GET"]
    with Tenure("http://testserver", team.keys["alice"], http_client=client) as alice:
        assert _named(alice, name) == [created_id]


def test_an_import_whose_503_came_after_the_write_is_stored_once(client: TestClient, team: Team) -> None:
    names = [f"resent_import_{n}_{uuid.uuid4().hex[:8]}" for n in range(3)]
    with _sdk(LosesFirstAnswer(client), team.keys["alice"]) as alice:
        result = alice.beliefs.import_([belief_body(name, "project:pay") for name in names])
        assert result.failed == {} and len(result.imported) == 3
        assert sorted(sum((_named(alice, name) for name in names), [])) == sorted(result.imported)


def test_a_turn_whose_503_came_after_it_was_recorded_is_recorded_once(client: TestClient, team: Team) -> None:
    transport = LosesFirstAnswer(client)
    with _sdk(transport, team.keys["alice"]) as alice:
        turn = alice.post_turn(model="gpt-4o", scope=["domain:code"], user_message="hi", assistant_message="hello")
    turn_ids = [json.loads(body).get("turn_id") for _, body in transport.sent]
    assert turn_ids == [turn.turn_id, turn.turn_id]


def test_a_supersede_answered_503_is_not_resent(client: TestClient, team: Team) -> None:
    name = f"not_resent_{uuid.uuid4().hex[:8]}"
    with Tenure("http://testserver", team.keys["alice"], http_client=client) as alice:
        belief_id = alice.beliefs.create(**belief_body(name, "project:pay")).id or ""
    transport = LosesFirstAnswer(client)
    with _sdk(transport, team.keys["alice"]) as alice, pytest.raises(ServiceUnavailable):
        alice.beliefs.supersede(belief_id, content="A second version.")
    assert [route for route, _ in transport.sent] == [f"POST /v1/beliefs/{belief_id}/supersede"]


def test_an_erase_whose_connection_dropped_is_not_resent(client: TestClient, team: Team) -> None:
    """Resent, it would answer 404 and the caller would lose the erasure receipt."""
    with Tenure("http://testserver", team.keys["carol"], http_client=client) as admin:
        belief_id = admin.beliefs.create(**belief_body(f"erased_{uuid.uuid4().hex[:8]}", "project:pay")).id or ""
    transport = LosesFirstAnswer(client, lost="dropped")
    with _sdk(transport, team.keys["carol"]) as admin, pytest.raises(ConnectionFailed):
        admin.beliefs.erase(belief_id)
    assert [route for route, _ in transport.sent] == [f"DELETE /v1/beliefs/{belief_id}"]
