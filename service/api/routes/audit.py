"""GET /v1/admin/audit: the tenant's audit trail, admins only, newest first, cursor-paginated."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.api.deps import AdminPrincipal, AuditDep, ProvisioningDep
from service.domain.accounts import SLUG_RE
from service.domain.belief import ID_RE
from service.storage.audit import AuditEvent, AuditQuery

router = APIRouter(prefix="/v1/admin", tags=["audit"])


class AuditPage(BaseModel):
    items: list[AuditEvent]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null at the end")
    quarantined: int = Field(
        0,
        description="Stored events on this page that cannot be loaded: skipped (listed at "
        "/v1/admin/quarantine?kind=audit_event)",
    )


Short = Annotated[str | None, Query(min_length=1, max_length=200)]


@router.get(
    "/audit",
    response_model=AuditPage,
    summary="Query the audit trail (writes and injection receipts)",
)
def query_audit(
    admin: AdminPrincipal,
    audit: AuditDep,
    prov: ProvisioningDep,
    tenant_id: Annotated[
        str | None, Query(pattern=SLUG_RE.pattern, description="Defaults to the caller's tenant")
    ] = None,
    actor_id: Short = None,
    belief_id: Annotated[str | None, Query(pattern=ID_RE.pattern)] = None,
    session_id: Short = None,
    action: Short = None,
    request_id: Short = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> AuditPage:
    acting = prov.acting_admin(admin, tenant_id or admin.tenant_id)
    query = AuditQuery(
        actor_id=actor_id,
        belief_id=belief_id,
        session_id=session_id,
        action=action,
        request_id=request_id,
        since=since,
        until=until,
    )
    items, next_cursor = audit.search(acting, query, size=limit, after=cursor)
    return AuditPage(items=items, next_cursor=next_cursor, quarantined=len(items.quarantined))
