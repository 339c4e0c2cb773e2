"""Injection receipts through the Redis outbox: recorded in the stream, moved to the audit index
exactly once (replays after a crash create nothing twice), never lost when Redis is down or the
drainer is behind, and always visible to an admin's audit read."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from deploy.devstack import free_port
from service.api.routes import recall as recall_route
from service.api.state import Services
from service.domain.principal import Principal, Role
from service.errors import StoreUnavailable
from service.outbox import RedisOutbox
from service.recall.audit_trail import AuditTrail
from service.recall.receipts import ReceiptOutbox
from service.storage.audit import AuditEvent, AuditQuery
from tests.api.conftest import Team, belief_body, ok


def _recall(client: TestClient, team: Team, session: str) -> str:
    body = {"scopes": ["domain:code"], "query": "how are our kafka topics named?", "session_id": session}
    receipt_id: str = ok(client.post("/v1/recall", json=body, headers=team.h("alice")))["receipt_id"]
    return receipt_id


def _indexed(services: Services, team: Team, session: str) -> list[AuditEvent]:
    services.audit.refresh()
    admin = Principal(tenant_id=team.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    events, _ = services.audit.search(admin, AuditQuery(session_id=session, action="recall"), size=50, after=None)
    return events


@pytest.fixture
def session_id() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def _written_directly(reason: str) -> float:
    return REGISTRY.get_sample_value("tenure_receipts_written_directly_total", {"reason": reason}) or 0.0


def _event(tenant: str, session: str) -> AuditEvent:
    return AuditEvent(tenant_id=tenant, action="recall", actor_id="alice", actor_kind="api_key", session_id=session)


def test_a_recall_receipt_waits_in_the_outbox_until_drained(
    client: TestClient, team: Team, services: Services, session_id: str
) -> None:
    ok(client.post("/v1/beliefs", json=belief_body("kafka_topics"), headers=team.h("alice")), 201)
    receipt_id = _recall(client, team, session_id)
    assert _indexed(services, team, session_id) == []  # acknowledged by Redis, not yet indexed
    assert services.receipts.drain() >= 1
    assert [e.event_id for e in _indexed(services, team, session_id)] == [receipt_id]


def test_an_admin_read_sees_every_event_recorded_before_it_without_waiting_for_a_refresh(
    team: Team, services: Services, session_id: str
) -> None:
    """The audit index refreshes only every 30 s (its template): an admin's read refreshes it
    first, so a receipt the beat drained (no refresh) and an event written directly (a belief
    write's, no refresh) are both in the next page."""
    drained, direct = _event(team.tenant, session_id), _event(team.tenant, session_id)
    services.receipts.record(drained)
    assert services.receipts.drain() >= 1  # the beat's drain
    services.audit.append(direct)
    admin = Principal(tenant_id=team.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    page, _ = AuditTrail(services.audit, services.receipts).search(
        admin, AuditQuery(session_id=session_id), size=10, after=None
    )
    assert sorted(e.event_id for e in page) == sorted([drained.event_id, direct.event_id])


def test_an_audit_read_drains_first_so_admins_see_every_acknowledged_receipt(
    client: TestClient, team: Team, session_id: str
) -> None:
    receipt_id = _recall(client, team, session_id)
    params: dict[str, Any] = {"session_id": session_id, "action": "recall"}
    items = ok(client.get("/v1/admin/audit", params=params, headers=team.h("carol")))["items"]
    assert [e["event_id"] for e in items] == [receipt_id]


def _spied_receipts(monkeypatch: pytest.MonkeyPatch, services: Services, steps: list[str]) -> None:
    """Log when the recall's receipt append starts and when it is recorded, and when the route
    shapes its answer (the receipts object is the one the recall service holds)."""
    record, body = services.receipts.arecord, recall_route.recall_body

    async def arecord(event: AuditEvent) -> None:
        steps.append("receipt sent")
        await record(event)
        steps.append("receipt recorded")

    def shaped(*args: Any, **kwargs: Any) -> dict[str, Any]:
        steps.append("answer shaped")
        return body(*args, **kwargs)

    monkeypatch.setattr(services.receipts, "arecord", arecord)
    monkeypatch.setattr(recall_route, "recall_body", shaped)


def test_the_answer_is_shaped_while_its_receipt_is_on_its_way_and_sent_only_once_recorded(
    monkeypatch: pytest.MonkeyPatch, client: TestClient, team: Team, services: Services, session_id: str
) -> None:
    ok(client.post("/v1/beliefs", json=belief_body("kafka_topics"), headers=team.h("alice")), 201)
    steps: list[str] = []
    _spied_receipts(monkeypatch, services, steps)
    receipt_id = _recall(client, team, session_id)
    # the append went out before the block and the body were made, and the reply waited for it
    assert steps == ["receipt sent", "answer shaped", "receipt recorded"]
    params: dict[str, Any] = {"session_id": session_id, "action": "recall"}
    items = ok(client.get("/v1/admin/audit", params=params, headers=team.h("carol")))["items"]
    assert [e["event_id"] for e in items] == [receipt_id]


def test_a_recall_whose_receipt_cannot_be_recorded_answers_an_error_not_the_recall(
    monkeypatch: pytest.MonkeyPatch, client: TestClient, team: Team, services: Services, session_id: str
) -> None:
    ok(client.post("/v1/beliefs", json=belief_body("kafka_topics"), headers=team.h("alice")), 201)
    steps: list[str] = []

    async def lost(event: AuditEvent) -> None:
        steps.append("receipt sent")
        await asyncio.sleep(0.05)  # fails after the answer was shaped
        raise StoreUnavailable("neither the outbox nor the audit index took the receipt")

    _spied_receipts(monkeypatch, services, steps)
    monkeypatch.setattr(services.receipts, "arecord", lost)
    body = {"scopes": ["domain:code"], "query": "how are our kafka topics named?", "session_id": session_id}
    response = client.post("/v1/recall", json=body, headers=team.h("alice"))
    assert steps == ["receipt sent", "answer shaped"]
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "store_unavailable"
    assert "injection" not in response.text and "kafka" not in response.text


def test_a_drain_replayed_after_a_crash_records_nothing_twice(team: Team, services: Services, session_id: str) -> None:
    events = [_event(team.tenant, session_id) for _ in range(3)]
    for e in events:
        services.receipts.record(e)
    # the crash: a drainer bulk-wrote the batch, then died before deleting it from the stream
    services.audit.append_many(events[:2], refresh=True)
    services.receipts.drain(refresh=True)
    assert sorted(e.event_id for e in _indexed(services, team, session_id)) == sorted(e.event_id for e in events)
    assert services.receipts.drain() == 0


def test_with_redis_unreachable_the_receipt_is_written_directly(
    team: Team, services: Services, session_id: str
) -> None:
    dead: redis.Redis[bytes] = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    outbox = ReceiptOutbox(dead, services.audit, "unused-ns", max_pending=10)
    event = _event(team.tenant, session_id)
    before = _written_directly("redis_unreachable")
    outbox.record(event)
    assert [e.event_id for e in _indexed(services, team, session_id)] == [event.event_id]
    assert _written_directly("redis_unreachable") == before + 1


def test_when_the_drainer_is_behind_receipts_beyond_the_cap_are_written_directly(
    team: Team, services: Services, session_id: str
) -> None:
    ns = f"cap-{uuid.uuid4().hex[:6]}"
    outbox = ReceiptOutbox(services.redis, services.audit, ns, max_pending=2)
    events = [_event(team.tenant, session_id) for _ in range(3)]
    before = _written_directly("outbox_full")
    try:
        for e in events:
            outbox.record(e)
        assert outbox.pending() == 2
        assert _written_directly("outbox_full") == before + 1  # the operator's alert
        assert [e.event_id for e in _indexed(services, team, session_id)] == [events[2].event_id]
        outbox.drain(refresh=True)
        assert len(_indexed(services, team, session_id)) == 3
    finally:
        services.redis.delete(outbox.key)


def test_an_unreadable_entry_is_set_aside_not_dropped_and_does_not_block_the_rest(
    team: Team, services: Services, session_id: str
) -> None:
    ns = f"bad-{uuid.uuid4().hex[:6]}"
    outbox = ReceiptOutbox(services.redis, services.audit, ns, max_pending=10)
    try:
        services.redis.xadd(outbox.key, {"e": b"{not json"})
        outbox.record(_event(team.tenant, session_id))
        assert outbox.drain(refresh=True) == 1
        assert outbox.pending() == 0 and services.redis.xlen(outbox.dead_key) == 1
        assert len(_indexed(services, team, session_id)) == 1
    finally:
        services.redis.delete(outbox.key, outbox.dead_key)


def test_a_record_refused_for_good_is_set_aside_with_its_reason_not_dropped(
    team: Team, services: Services, session_id: str
) -> None:
    outbox = RedisOutbox(services.redis, f"aside-{uuid.uuid4().hex[:6]}", AuditEvent, max_pending=10)
    event = _event(team.tenant, session_id)
    try:
        outbox.set_aside(event, "mapper_parsing_exception")
        [(_, fields)] = services.redis.xrange(outbox.dead_key)
        assert AuditEvent.model_validate_json(fields[b"e"]).event_id == event.event_id
        assert fields[b"reason"] == b"mapper_parsing_exception" and outbox.pending() == 0
    finally:
        services.redis.delete(outbox.key, outbox.dead_key)
