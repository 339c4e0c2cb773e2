"""Admin quarantine: stored beliefs the current model cannot load (skipped by every read)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, Field

from service.api.deps import CurrentActor, ServicesDep
from service.beliefs.quarantine import QuarantineService
from service.domain.belief import ID_RE

router = APIRouter(prefix="/v1/admin", tags=["admin"])


def get_quarantine(services: ServicesDep) -> QuarantineService:
    return QuarantineService(services.beliefs.lifecycle)


QuarantineDep = Annotated[QuarantineService, Depends(get_quarantine)]


class QuarantinedOut(BaseModel):
    belief_id: str
    owner_id: str | None
    scope: list[str]
    reason: str = Field(description="The first check the stored document fails")


class QuarantinePageOut(BaseModel):
    items: list[QuarantinedOut]
    scanned: int = Field(description="Stored beliefs of the tenant this page looked at")
    next_cursor: str | None = Field(None, description="Pass as ?cursor= to scan on; null at the end")


class QuarantineErasedOut(BaseModel):
    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    erased_at: datetime


@router.get(
    "/quarantine",
    response_model=QuarantinePageOut,
    summary="Scan the tenant for stored beliefs that cannot be loaded (admin; cursor pagination)",
)
def list_quarantine(
    actor: CurrentActor,
    quarantine: QuarantineDep,
    limit: Annotated[int, Query(ge=1, le=500, description="Stored beliefs scanned per page")] = 500,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> QuarantinePageOut:
    page = quarantine.scan(actor, size=limit, after=cursor)
    return QuarantinePageOut(
        items=[QuarantinedOut(**vars(item)) for item in page.items],
        scanned=page.scanned,
        next_cursor=page.next_cursor,
    )


@router.delete(
    "/quarantine/{belief_id}",
    response_model=QuarantineErasedOut,
    summary="Erase a quarantined belief by id, without loading it (admin)",
)
def erase_quarantined(
    belief_id: Annotated[str, Path(pattern=ID_RE.pattern)], actor: CurrentActor, quarantine: QuarantineDep
) -> QuarantineErasedOut:
    return QuarantineErasedOut(**vars(quarantine.erase(actor, belief_id)))
