"""Audit adapter for the memory loop: every belief change made by extraction, review resolution
and compaction is appended to the audit index (``service.storage.audit``), with deterministic
event ids so a retried task never records the same change twice."""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from service.domain.principal import Principal
from service.storage.audit import AuditEvent, AuditStore


class AuditSink(Protocol):
    def record(
        self,
        principal: Principal,
        action: str,
        *,
        key: str,
        belief_ids: list[str],
        session_id: str | None = None,
        scopes: list[str] | None = None,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None: ...


class StoreAudit:
    """Writes to the audit index; ``key`` makes the event id stable across retries."""

    def __init__(self, store: AuditStore, actor_kind: str = "memory_loop"):
        self.store = store
        self.actor_kind = actor_kind

    def record(
        self,
        principal: Principal,
        action: str,
        *,
        key: str,
        belief_ids: list[str],
        session_id: str | None = None,
        scopes: list[str] | None = None,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        digest = hashlib.sha256(f"{principal.tenant_id}|{action}|{key}".encode()).hexdigest()[:32]
        event = AuditEvent(
            event_id=f"ev-{digest}",
            tenant_id=principal.tenant_id,
            action=action,
            actor_id=principal.user_id,
            actor_kind=self.actor_kind,
            belief_ids=belief_ids,
            session_id=session_id,
            scopes=scopes or [],
            before=before,
            after=after,
            details=details,
        )
        try:
            self.store.append(event)
        except Exception as exc:  # the same event from an earlier attempt: already recorded
            if getattr(exc, "status_code", None) != 409:
                raise
