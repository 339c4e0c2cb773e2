"""The real Celery worker moves pending injection receipts from the Redis outbox into the audit
index (the beat sends ``audit.drain_receipts`` every second in a deployment)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.api.state import Services
from service.config import Settings
from service.domain.principal import Principal, Role
from service.extraction.queue import TaskQueue
from service.storage.audit import AuditQuery
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
