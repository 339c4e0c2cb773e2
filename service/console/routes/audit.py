"""Audit: the trail with filters, injection receipts ("what was injected into whose prompt, for
which query") linked to the beliefs, and JSONL/CSV export of a filtered view. Admins only, through
:class:`AuditTrail` (the same reads as ``GET /v1/admin/audit``)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from service.api.deps import AuditDep, BeliefsDep
from service.console.web import PREFIX, AdminUser, ConsoleRoute, page
from service.domain.audit import AuditAction
from service.domain.belief import ID_RE, Belief
from service.errors import NotFound, Unreadable, ValidationFailed
from service.storage.audit import AuditEvent, AuditQuery

router = APIRouter(prefix=f"{PREFIX}/audit", route_class=ConsoleRoute, include_in_schema=False)

PAGE_SIZE = 50
EXPORT_LIMIT = 100_000
ACTIONS = tuple(action.value for action in AuditAction)  # the one vocabulary (service/domain/audit.py)
CSV_COLUMNS = (
    "at",
    "event_id",
    "action",
    "actor_id",
    "actor_kind",
    "credential_id",
    "session_id",
    "request_id",
    "belief_ids",
    "scopes",
    "query",
    "injected",
    "details",
)
Text = Annotated[str, Query(max_length=200)]


def _when(raw: str, name: str) -> datetime | None:
    """A ``datetime-local`` value (or any ISO timestamp); without a zone it is UTC."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ValidationFailed(f"{name}: not a date and time: {raw!r}") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Filters:
    """The audit page's filters, as typed in (to fill the form again) and as a query."""

    form: dict[str, str]
    query: AuditQuery


def filters(
    actor_id: Text = "",
    action: Text = "",
    belief_id: Text = "",
    session_id: Text = "",
    since: Text = "",
    until: Text = "",
) -> Filters:
    if belief_id and not ID_RE.fullmatch(belief_id):
        raise ValidationFailed(f"not a belief id: {belief_id!r}")
    query = AuditQuery(
        actor_id=actor_id.strip() or None,
        action=action.strip() or None,
        belief_id=belief_id.strip() or None,
        session_id=session_id.strip() or None,
        since=_when(since, "since"),
        until=_when(until, "until"),
    )
    form = {
        "actor_id": actor_id,
        "action": action,
        "belief_id": belief_id,
        "session_id": session_id,
        "since": since,
        "until": until,
    }
    return Filters(form=form, query=query)


FiltersDep = Annotated[Filters, Depends(filters)]


@router.get("")
def trail(
    request: Request,
    user: AdminUser,
    audit: AuditDep,
    chosen: FiltersDep,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    items, next_cursor = audit.search(user.principal, chosen.query, size=PAGE_SIZE, after=cursor)
    return page(
        request, "audit.html", nav="audit", items=items, next_cursor=next_cursor, form=chosen.form, actions=ACTIONS
    )


def _csv_cell(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False) if value is not None else ""
    # A cell starting with = + - @ would run as a formula in a spreadsheet (CSV injection).
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _csv_rows(events: Iterator[AuditEvent]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for event in events:
        row = event.model_dump(mode="json")
        row["belief_ids"] = " ".join(row["belief_ids"])
        row["scopes"] = " ".join(row["scopes"])
        writer.writerow([_csv_cell(row.get(c)) for c in CSV_COLUMNS])
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    if buffer.tell():  # pragma: no cover - the header alone, with no events
        yield buffer.getvalue()


@router.get("/export.{fmt}")
def export(
    user: AdminUser,
    audit: AuditDep,
    chosen: FiltersDep,
    fmt: Annotated[str, Path(pattern="^(jsonl|csv)$")],
) -> Response:
    events = audit.export(user.principal, chosen.query, limit=EXPORT_LIMIT)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    filename = f"audit-{user.principal.tenant_id}-{stamp}.{fmt}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"', "Cache-Control": "no-store"}
    if fmt == "csv":
        return StreamingResponse(_csv_rows(events), media_type="text/csv; charset=utf-8", headers=headers)
    lines = (e.model_dump_json(exclude_none=True) + "\n" for e in events)
    return StreamingResponse(lines, media_type="application/x-ndjson", headers=headers)


@router.get("/{event_id}")
def event_page(
    request: Request,
    user: AdminUser,
    audit: AuditDep,
    beliefs: BeliefsDep,
    event_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:-]{1,200}$")],
) -> Response:
    found, _ = audit.search(user.principal, AuditQuery(event_id=event_id), size=1, after=None)
    if not found:
        raise NotFound(f"audit event {event_id!r} not found")
    event = found[0]
    current: dict[str, Belief | None] = {}
    for belief_id in event.belief_ids[:50]:
        try:
            current[belief_id] = beliefs.get(user.actor, belief_id, tenant_wide=True)
        except (NotFound, Unreadable):
            current[belief_id] = None  # erased since, or stored in a form that cannot be loaded
    return page(request, "audit_event.html", nav="audit", event=event, current=current)
