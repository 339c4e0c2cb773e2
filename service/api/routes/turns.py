"""Admin routes over the tenant's turns: list them by extraction status, read one whole, and send a
failed one (or a batch of them) back for extraction. ``service/extraction/failed_turns.py`` holds
the rules."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import AdminPrincipal, CurrentActor, FailedTurnsDep
from service.api.routes.memory_loop import TurnIdPath
from service.domain.accounts import SLUG_RE
from service.extraction.failed_turns import MAX_BULK_RETRY, RetriedTurn
from service.storage.turns import ExtractionStatus, TurnRecord

router = APIRouter(prefix="/v1/admin", tags=["memory loop"])


OwnerQuery = Annotated[str | None, Query(pattern=SLUG_RE.pattern, description="Only this user's turns")]


class AdminTurnOut(BaseModel):
    """A turn's extraction state, without the exchange's text (``GET /v1/admin/turns/{id}`` has it)."""

    turn_id: str
    owner_id: str
    session_id: str
    scope: list[str]
    source: str
    model: str | None
    parse_status: str
    gate: str | None
    extraction_status: ExtractionStatus
    attempts: int
    error: str | None = Field(description="Why it failed; after a retry, the retry's note until it finishes")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class AdminTurnDetail(AdminTurnOut):
    """One turn, whole: its extraction state, the exchange and the sidecar."""

    user_message: str
    assistant_text: str
    sidecar_raw: str | None
    injected_ids: list[str]
    result: dict[str, Any] | None


class AdminTurnPage(BaseModel):
    items: list[AdminTurnOut]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null at the end")
    quarantined: int = Field(
        0,
        description="Stored turns on this page that cannot be loaded: skipped (listed at "
        "/v1/admin/quarantine?kind=turn)",
    )


class TurnRetryOut(AdminTurnOut):
    """The turn as the retry left it (pending, no attempts), and what it had failed with."""

    previous_error: str | None
    previous_attempts: int
    queued: bool = Field(description="Its extraction was enqueued (false: the sweep sends it later)")


class BulkRetryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    owner_id: str | None = Field(None, pattern=SLUG_RE.pattern, description="Only this user's failed turns")
    limit: int = Field(50, ge=1, le=MAX_BULK_RETRY, description="At most this many turns, newest first")


class BulkRetryOut(BaseModel):
    retried: list[TurnRetryOut]
    not_retried: dict[str, str] = Field(description="Turn id -> why it was not retried (retried meanwhile, ...)")
    more: bool = Field(description="More failed turns may remain: send the request again")


def _out(turn: TurnRecord) -> AdminTurnOut:
    return AdminTurnOut(**turn.model_dump(include=set(AdminTurnOut.model_fields)))


def _retried(done: RetriedTurn) -> TurnRetryOut:
    return TurnRetryOut(
        **_out(done.turn).model_dump(),
        previous_error=done.previous_error,
        previous_attempts=done.previous_attempts,
        queued=done.queued,
    )


@router.get(
    "/turns",
    response_model=AdminTurnPage,
    summary="The tenant's turns by extraction status, newest first (admin; cursor pagination)",
)
def list_turns(
    admin: AdminPrincipal,
    failed_turns: FailedTurnsDep,
    status: Annotated[ExtractionStatus, Query(description="Extraction status")] = "failed",
    owner_id: OwnerQuery = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size")] = 100,
    cursor: Annotated[str | None, Query(max_length=2000, description="next_cursor of the previous page")] = None,
) -> AdminTurnPage:
    items, next_cursor = failed_turns.page(admin, status=status, owner_id=owner_id, size=limit, after=cursor)
    return AdminTurnPage(items=[_out(t) for t in items], next_cursor=next_cursor, quarantined=len(items.quarantined))


@router.get("/turns/{turn_id}", response_model=AdminTurnDetail, summary="One turn of the tenant, whole (admin)")
def get_turn(turn_id: TurnIdPath, admin: AdminPrincipal, failed_turns: FailedTurnsDep) -> AdminTurnDetail:
    turn = failed_turns.get(admin, turn_id)
    return AdminTurnDetail(**turn.model_dump(include=set(AdminTurnDetail.model_fields)))


@router.post(
    "/turns/retry",
    response_model=BulkRetryOut,
    summary="Send the tenant's failed turns back for extraction, newest first, up to a limit (admin)",
)
def retry_failed_turns(
    actor: CurrentActor, failed_turns: FailedTurnsDep, body: Annotated[BulkRetryIn | None, Body()] = None
) -> BulkRetryOut:
    given = body or BulkRetryIn()
    done = failed_turns.retry_failed(actor, owner_id=given.owner_id, limit=given.limit)
    return BulkRetryOut(retried=[_retried(r) for r in done.retried], not_retried=done.not_retried, more=done.more)


@router.post(
    "/turns/{turn_id}/retry",
    response_model=TurnRetryOut,
    summary="Send a failed turn back for extraction (admin; 409 turn_not_failed otherwise)",
)
def retry_turn(turn_id: TurnIdPath, actor: CurrentActor, failed_turns: FailedTurnsDep) -> TurnRetryOut:
    return _retried(failed_turns.retry(actor, turn_id))
