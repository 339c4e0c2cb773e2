"""Turns: the tenant's recorded chat exchanges by extraction status (failed first), one turn whole,
and sending a failed one, or the newest failed ones, back for extraction. Admins only, through
:class:`FailedTurns` (the same as ``/v1/admin/turns``): a turn of another tenant is "not found",
a retry is audited as ``turn.retry`` with the admin's actor, a turn no longer failed is a 409."""

from __future__ import annotations

from typing import Annotated, get_args

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import FailedTurnsDep, ServicesDep
from service.console.web import PREFIX, AdminUser, ConsoleRoute, Form, Writer, confirm, confirmed, page, redirect
from service.domain.accounts import SLUG_RE
from service.errors import ValidationFailed
from service.extraction.failed_turns import MAX_BULK_RETRY, BulkRetry, RetriedTurn, not_failed
from service.storage.turns import ExtractionStatus

router = APIRouter(prefix=f"{PREFIX}/turns", route_class=ConsoleRoute, include_in_schema=False)

PAGE_SIZE = 50
BULK_DEFAULT = 50  # as POST /v1/admin/turns/retry
STATUSES: tuple[str, ...] = get_args(ExtractionStatus)
# A turn's texts are the client's: the page shows this much of each (scrollable), the API the rest.
TEXT_CLIP = 20_000
TurnId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
Owner = Annotated[str, Query(max_length=200)]


def _owner(raw: str) -> str | None:
    owner = raw.strip()
    if owner and not SLUG_RE.fullmatch(owner):
        raise ValidationFailed(f"owner: not a user id: {owner!r}")
    return owner or None


@router.get("")
def turn_list(
    request: Request,
    user: AdminUser,
    failed_turns: FailedTurnsDep,
    status: Annotated[ExtractionStatus, Query()] = "failed",
    owner: Owner = "",
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    items, next_cursor = failed_turns.page(
        user.principal, status=status, owner_id=_owner(owner), size=PAGE_SIZE, after=cursor
    )
    return page(
        request,
        "turns.html",
        nav="turns",
        items=items,
        quarantined=items.quarantined,
        next_cursor=next_cursor,
        status=status,
        owner=owner.strip(),
        statuses=STATUSES,
        bulk_default=BULK_DEFAULT,
        bulk_max=MAX_BULK_RETRY,
    )


@router.get("/{turn_id}")
def turn_page(request: Request, turn_id: TurnId, user: AdminUser, failed_turns: FailedTurnsDep) -> Response:
    turn = failed_turns.get(user.principal, turn_id)
    return page(request, "turn.html", nav="turns", turn=turn, clip=TEXT_CLIP)


def _retry_notice(done: RetriedTurn, sweep_after_s: int) -> str:
    if done.queued:
        return f"turn {done.turn.turn_id} sent back for extraction: queued"
    return (
        f"turn {done.turn.turn_id} is pending again; the queue refused the send, so it will be picked up "
        f"by the sweep once it has been pending {sweep_after_s} s"
    )


@router.post("/retry")
def retry_failed(
    request: Request, user: Writer, form: Form, failed_turns: FailedTurnsDep, services: ServicesDep
) -> Response:
    owner = _owner(form.get("owner", ""))
    limit = _bulk_limit(form.get("limit", ""))
    back = "/turns" + (f"?owner={owner}" if owner else "")
    if not confirmed(form):
        whose = f"{owner}'s" if owner else "the tenant's"
        what = (
            f"Send up to {limit} of {whose} failed turns, newest first, back for extraction: each becomes pending "
            "with its attempts reset and is extracted with its author's current grants. Each retry is audited."
        )
        return confirm(
            request, action="retry", what=what, form=form, action_url="/turns/retry", cancel_url=back, nav="turns"
        )
    done = failed_turns.retry_failed(user.actor, owner_id=owner, limit=limit)
    return redirect(back, notice=_bulk_notice(done, services.settings.loop.sweep_stale_after_s), user=user)


def _bulk_limit(raw: str) -> int:
    if not raw.strip():
        return BULK_DEFAULT
    try:
        limit = int(raw)
    except ValueError as exc:
        raise ValidationFailed(f"limit: not a number: {raw!r}") from exc
    if not 1 <= limit <= MAX_BULK_RETRY:
        raise ValidationFailed(f"limit: between 1 and {MAX_BULK_RETRY}")
    return limit


def _bulk_notice(done: BulkRetry, sweep_after_s: int) -> str:
    if not done.retried and not done.not_retried:
        return "no failed turn to retry"
    retried, queued = len(done.retried), sum(1 for r in done.retried if r.queued)
    said = f"{retried} failed turn{'' if retried == 1 else 's'} sent back for extraction ({queued} queued"
    if retried > queued:
        said += f", {retried - queued} will be picked up by the sweep once pending {sweep_after_s} s"
    said += ")"
    if done.not_retried:
        said += f"; not retried: {len(done.not_retried)} ({', '.join(sorted(done.not_retried)[:5])})"
    if done.more:
        said += "; more failed turns remain: retry again"
    return said


@router.post("/{turn_id}/retry")
def retry_one(
    request: Request, turn_id: TurnId, user: Writer, form: Form, failed_turns: FailedTurnsDep, services: ServicesDep
) -> Response:
    turn = failed_turns.get(user.principal, turn_id)  # another tenant's: 404 before anything is said
    if not confirmed(form):
        if turn.extraction_status != "failed":
            raise not_failed(turn_id, turn.extraction_status)
        what = (
            f"Send {turn.owner_id}'s turn {turn_id} (session {turn.session_id}, {turn.attempts} attempts spent) back "
            "for extraction: it becomes pending with its attempts reset and is extracted with its author's current "
            "grants. The retry is audited."
        )
        return confirm(
            request,
            action="retry",
            what=what,
            form=form,
            action_url=f"/turns/{turn_id}/retry",
            cancel_url=f"/turns/{turn_id}",
            nav="turns",
        )
    done = failed_turns.retry(user.actor, turn_id)
    return redirect(
        f"/turns/{turn_id}", notice=_retry_notice(done, services.settings.loop.sweep_stale_after_s), user=user
    )
