"""Admin quarantine: stored records the current model cannot load (skipped by every read):
beliefs, turns, review items and audit events."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, Field

from service.api.deps import CurrentActor, ServicesDep
from service.beliefs.quarantine import Kind, QuarantineService, RecordKindName
from service.domain.belief import ID_RE

router = APIRouter(prefix="/v1/admin", tags=["admin"])
RECORD_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"  # turn, review item and audit event ids


def get_quarantine(services: ServicesDep) -> QuarantineService:
    return QuarantineService(services.beliefs.lifecycle)


QuarantineDep = Annotated[QuarantineService, Depends(get_quarantine)]


class QuarantinedOut(BaseModel):
    kind: Kind
    record_id: str = Field(description="The belief, turn, review item or audit event id")
    belief_id: str | None = Field(None, description="The record_id when kind is belief, else null")
    owner_id: str | None = Field(description="Its owner (an audit event: its actor), if the document names one")
    scope: list[str]
    reason: str = Field(description="The first check the stored document fails")


class QuarantinePageOut(BaseModel):
    kind: Kind
    items: list[QuarantinedOut]
    scanned: int = Field(description="Stored records of this kind in the tenant this page looked at")
    next_cursor: str | None = Field(None, description="Pass as ?cursor= to scan on; null at the end")


class QuarantineErasedOut(BaseModel):
    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    text_copies_redacted: int = Field(0, description="Turns, review items and audit events its text was redacted from")
    review_items_removed: int = 0
    expunged: bool = False
    erased_at: datetime


class QuarantinedRecordErasedOut(BaseModel):
    kind: RecordKindName
    record_id: str
    erased_at: datetime


@router.get(
    "/quarantine",
    response_model=QuarantinePageOut,
    summary="Scan the tenant for stored records of one kind that cannot be loaded (admin; cursor pagination)",
)
def list_quarantine(
    actor: CurrentActor,
    quarantine: QuarantineDep,
    kind: Annotated[Kind, Query(description="Which records to scan")] = "belief",
    limit: Annotated[int, Query(ge=1, le=500, description="Stored records scanned per page")] = 500,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> QuarantinePageOut:
    page = quarantine.scan(actor, kind=kind, size=limit, after=cursor)
    return QuarantinePageOut(
        kind=kind,
        items=[
            QuarantinedOut(
                kind=kind,
                record_id=item.record_id,
                belief_id=item.record_id if kind == "belief" else None,
                owner_id=item.owner_id,
                scope=item.scope,
                reason=item.reason,
            )
            for item in page.items
        ],
        scanned=page.scanned,
        next_cursor=page.next_cursor,
    )


@router.delete(
    "/quarantine/{belief_id}",
    response_model=QuarantineErasedOut,
    summary="Erase a quarantined belief by id, without loading it (admin)",
)
def erase_quarantined(
    belief_id: Annotated[str, Path(pattern=ID_RE.pattern)],
    actor: CurrentActor,
    quarantine: QuarantineDep,
    expunge: Annotated[bool, Query(description="Also merge the deleted copies out of the segments")] = False,
) -> QuarantineErasedOut:
    return QuarantineErasedOut(**vars(quarantine.erase(actor, belief_id, expunge=expunge)))


@router.delete(
    "/quarantine/{kind}/{record_id}",
    response_model=QuarantinedRecordErasedOut,
    summary="Erase a quarantined turn, review item or audit event by id, without loading it (admin)",
)
def erase_quarantined_record(
    kind: RecordKindName,
    record_id: Annotated[str, Path(pattern=RECORD_ID)],
    actor: CurrentActor,
    quarantine: QuarantineDep,
) -> QuarantinedRecordErasedOut:
    return QuarantinedRecordErasedOut(**vars(quarantine.erase_record(actor, kind, record_id)))
