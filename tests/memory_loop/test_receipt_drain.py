"""The real Celery worker moves pending injection receipts from the Redis outbox into the audit
index (the beat sends ``audit.drain_receipts`` every second in a deployment)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.api.state import Services
from service.config import Settings
from service.domain.principal import Principal, Role
from service.extraction.queue import TaskQueue
from service.storage.audit import AuditEvent, AuditQuery
from tests.api.conftest import Team, ok
from tests.memory_loop.conftest import WorkerProcess, wait_until


def test_the_worker_drains_pending_receipts_into_the_audit_index(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services, loop_settings: Settings
) -> None:
    body = {"scopes": ["domain:code"], "query": "which eviction policy?", "session_id": "drain-1"}
    receipt_id = ok(api.post("/v1/recall", json=body, headers=crew.h("alice")))["receipt_id"]
    assert loop_services.receipts.pending() >= 1
    admin = Principal(tenant_id=crew.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))

    def indexed() -> list[str]:
        loop_services.audit.refresh()
        events, _ = loop_services.audit.search(admin, AuditQuery(session_id="drain-1"), size=10, after=None)
        return [e.event_id for e in events]

    queue = TaskQueue(loop_settings)
    try:
        queue.drain_receipts()
        assert wait_until(lambda: indexed() == [receipt_id], timeout=30)
    finally:
        queue.close()
    assert loop_services.receipts.pending() == 0


def _receipt(team: Team, session_id: str) -> AuditEvent:
    return AuditEvent(
        tenant_id=team.tenant, action="recall", actor_id="alice", actor_kind="user", session_id=session_id
    )


def test_a_receipt_the_audit_index_refuses_for_good_is_set_aside_not_blocking_the_rest(
    crew: Team, loop_services: Services
) -> None:
    """A receipt OpenSearch rejects for what it is (here a session id over Lucene's 32 kB term
    limit: a 400 on that bulk item, replayed it would be rejected for ever) goes to the outbox's
    unreadable stream with the reason; the receipts around it are recorded, the outbox empties."""
    receipts = loop_services.receipts
    receipts.drain()  # whatever earlier tests left
    before = receipts.outbox.redis.xlen(receipts.dead_key)
    good = [_receipt(crew, f"ok-{i}") for i in range(2)]
    refused = _receipt(crew, "x" * 40_000)
    for event in (good[0], refused, good[1]):
        assert receipts.outbox.put(event)
    assert receipts.drain() == 3
    assert receipts.pending() == 0
    loop_services.audit.refresh()
    admin = Principal(tenant_id=crew.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    for event in good:
        found, _ = loop_services.audit.search(admin, AuditQuery(event_id=event.event_id), size=1, after=None)
        assert [e.event_id for e in found] == [event.event_id]
    [(_, fields)] = receipts.outbox.redis.xrange(receipts.dead_key)[before:]
    assert refused.event_id.encode() in fields[b"e"]
    assert b"illegal_argument_exception" in fields[b"reason"]
