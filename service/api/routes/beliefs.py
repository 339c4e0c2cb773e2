"""Belief endpoints: thin handlers over :class:`BeliefService`."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service.api.deps import AdminPrincipal, BeliefsDep, CurrentActor
from service.api.examples import IMPORT_EXAMPLE
from service.beliefs.api_service import BeliefCreate, SupersedeIn
from service.domain import scopes as scope_rules
from service.domain.belief import ID_RE, Belief, BeliefType, ChangeLogEntry, Lifecycle
from service.errors import ValidationFailed
from service.storage.beliefs import ListFilter

router = APIRouter(prefix="/v1/beliefs", tags=["beliefs"])

BeliefIdPath = Annotated[str, Path(pattern=ID_RE.pattern, description="A belief id")]
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines")


class BeliefPage(BaseModel):
    items: list[Belief]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null at the end")
    quarantined: int = Field(
        0, description="Stored documents on this page that cannot be loaded: skipped (admins: /v1/admin/quarantine)"
    )


class ImportResult(BaseModel):
    imported: list[str]
    failed: dict[str, dict[str, str]]
    changed: dict[str, list[str]] = Field(
        default_factory=dict, description="Per imported id: what the server changed in the record, and why"
    )
    warnings: list[str] = Field(default_factory=list, description="E.g. owners that are not users of the tenant")


class SupersedeResult(BaseModel):
    superseded: Belief
    current: Belief


class AliasesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    aliases: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(..., min_length=1, max_length=25)


class ReinforceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    aliases: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list, max_length=25)


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(None, max_length=2000)
    resolved_by: str | None = Field(None, pattern=ID_RE.pattern, description="The belief that answers the question")


class RetractIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, max_length=2000)


class HistoryEntry(BaseModel):
    belief_id: str
    version: int
    entry: ChangeLogEntry


class HistoryOut(BaseModel):
    belief_id: str
    chain: list[Belief] = Field(description="Every version in the supersession chain, oldest first")
    change_log: list[HistoryEntry] = Field(description="All change-log entries of the chain, in time order")


class ErasureReceiptOut(BaseModel):
    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    erased_at: datetime
    text_copies_redacted: int = Field(0, description="Turns, review items and audit events whose copy was redacted")
    review_items_removed: int = Field(
        0, description="Review items about an erased version (conflicts filed against it, resolutions that created it)"
    )
    expunged: bool = Field(False, description="Deleted copies were also merged out of the index segments")


def _scopes(values: list[str]) -> tuple[str, ...]:
    try:
        return tuple(scope_rules.normalize_scopes(values))
    except scope_rules.InvalidScope as exc:
        raise ValidationFailed(str(exc), details=[{"loc": ["query", "scope"], "msg": str(exc)}]) from exc


def _filter(
    type_: list[BeliefType],
    status_: list[Lifecycle],
    scope: list[str],
    pinned: bool | None,
    q: str | None,
) -> ListFilter:
    return ListFilter(
        types=tuple(t.value for t in type_),
        lifecycle=tuple(s.value for s in status_),
        scopes=_scopes(scope),
        pinned=pinned,
        text=q.strip() or None if q else None,
    )


TypeQ = Annotated[list[BeliefType], Query(alias="type", description="Belief types (repeatable)")]
StatusQ = Annotated[list[Lifecycle], Query(alias="status", description="Lifecycle states (repeatable)")]
ScopeQ = Annotated[list[str], Query(max_length=32, description="Scope labels (repeatable)")]
TextQ = Annotated[str | None, Query(max_length=1000, description="Match names and aliases")]
AllQ = Annotated[
    bool,
    Query(alias="all", description="Admins: the whole tenant, not only what they can see as a user"),
]


@router.post("", response_model=Belief, status_code=status.HTTP_201_CREATED, summary="Create one belief")
def create_belief(body: BeliefCreate, actor: CurrentActor, beliefs: BeliefsDep) -> Belief:
    return beliefs.create(actor, body)


def _loads(text: str, where: str, loc: list[Any]) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationFailed(
            f"{where} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            details=[{"loc": loc, "msg": exc.msg}],
        ) from exc
    except RecursionError as exc:  # absurdly deep nesting: still the client's problem
        raise ValidationFailed(f"{where} nests too deeply", details=[{"loc": loc}]) from exc
    except ValueError as exc:  # not a JSONDecodeError: Python refuses integers of more than 4300 digits
        msg = "a number has too many digits"
        raise ValidationFailed(f"{where} is not valid JSON: {msg}", details=[{"loc": loc, "msg": msg}]) from exc


def _parse_import(raw: bytes, content_type: str) -> list[dict[str, Any]]:
    text = raw.decode("utf-8", errors="strict") if raw else ""
    if any(content_type.startswith(t) for t in JSONL_TYPES):
        return [
            _loads(line, f"line {number}", ["body", number])
            for number, line in enumerate(text.splitlines(), start=1)
            if line.strip()
        ]
    data = _loads(text, "body", ["body"])
    if isinstance(data, dict) and isinstance(data.get("beliefs"), list):
        data = data["beliefs"]
    if not isinstance(data, list):
        raise ValidationFailed('expected a JSON array of beliefs, {"beliefs": [...]}, or JSONL')
    return data


@router.post(
    "/import",
    response_model=ImportResult,
    summary="Bulk import (JSON array, {beliefs: [...]} or JSONL)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"type": "array", "items": {"type": "object"}},
                    "example": IMPORT_EXAMPLE,
                },
                "application/x-ndjson": {"schema": {"type": "string"}},
            },
        }
    },
)
async def import_beliefs(request: Request, actor: CurrentActor, beliefs: BeliefsDep) -> ImportResult:
    raw = await request.body()
    try:
        records = _parse_import(raw, request.headers.get("content-type", "application/json").lower())
    except UnicodeDecodeError as exc:
        raise ValidationFailed("body is not UTF-8") from exc
    report = await run_in_threadpool(beliefs.import_records, actor, records)
    return ImportResult(
        imported=report.imported, failed=report.failed, changed=report.changed, warnings=report.warnings
    )


@router.get("", response_model=BeliefPage, summary="List beliefs (filters, cursor pagination)")
def list_beliefs(
    actor: CurrentActor,
    beliefs: BeliefsDep,
    type_: TypeQ = [],  # noqa: B006 - FastAPI copies query defaults
    status_: StatusQ = [],  # noqa: B006
    scope: ScopeQ = [],  # noqa: B006
    pinned: bool | None = None,
    q: TextQ = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
    all_: AllQ = False,
) -> BeliefPage:
    items, next_cursor = beliefs.list_beliefs(
        actor, _filter(type_, status_, scope, pinned, q), size=limit, after=cursor, tenant_wide=all_
    )
    return BeliefPage(items=items, next_cursor=next_cursor, quarantined=len(items.quarantined))


@router.get(
    "/export",
    summary="Export as JSONL (one belief per line, change logs included)",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
def export_beliefs(
    actor: CurrentActor,
    beliefs: BeliefsDep,
    type_: TypeQ = [],  # noqa: B006
    status_: StatusQ = [],  # noqa: B006
    scope: ScopeQ = [],  # noqa: B006
    pinned: bool | None = None,
    q: TextQ = None,
    all_: AllQ = False,
) -> StreamingResponse:
    rows = beliefs.export(actor, _filter(type_, status_, scope, pinned, q), tenant_wide=all_)
    first = list(itertools.islice(rows, 1))  # fail (403/503) before the response has started

    def lines() -> Iterator[bytes]:
        for belief in itertools.chain(first, rows):
            yield (belief.model_dump_json() + "\n").encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/{belief_id}", response_model=Belief, summary="Get one belief")
def get_belief(belief_id: BeliefIdPath, actor: CurrentActor, beliefs: BeliefsDep) -> Belief:
    return beliefs.get(actor, belief_id)


@router.get("/{belief_id}/history", response_model=HistoryOut, summary="Supersession chain and change log")
def belief_history(belief_id: BeliefIdPath, actor: CurrentActor, beliefs: BeliefsDep) -> HistoryOut:
    history = beliefs.history(actor, belief_id)
    entries = [HistoryEntry(belief_id=b.id, version=b.version, entry=e) for b in history.chain for e in b.change_log]
    entries.sort(key=lambda h: h.entry.changed_at)
    return HistoryOut(belief_id=belief_id, chain=history.chain, change_log=entries)


@router.post(
    "/{belief_id}/supersede",
    response_model=SupersedeResult,
    status_code=status.HTTP_201_CREATED,
    summary="Replace with a new version (old aliases and name become counter-signal aliases)",
)
def supersede_belief(
    belief_id: BeliefIdPath, body: SupersedeIn, actor: CurrentActor, beliefs: BeliefsDep
) -> SupersedeResult:
    old, new = beliefs.supersede(actor, belief_id, body)
    return SupersedeResult(superseded=old, current=new)


@router.post("/{belief_id}/reinforce", response_model=Belief, summary="Reinforce (optionally adding aliases)")
def reinforce_belief(
    belief_id: BeliefIdPath,
    actor: CurrentActor,
    beliefs: BeliefsDep,
    body: ReinforceIn | None = None,
) -> Belief:
    return beliefs.reinforce(actor, belief_id, body.aliases if body else [])


@router.post("/{belief_id}/pin", response_model=Belief, summary="Pin")
def pin_belief(belief_id: BeliefIdPath, actor: CurrentActor, beliefs: BeliefsDep) -> Belief:
    return beliefs.set_pinned(actor, belief_id, True)


@router.post("/{belief_id}/unpin", response_model=Belief, summary="Unpin")
def unpin_belief(belief_id: BeliefIdPath, actor: CurrentActor, beliefs: BeliefsDep) -> Belief:
    return beliefs.set_pinned(actor, belief_id, False)


@router.post("/{belief_id}/resolve", response_model=Belief, summary="Resolve an open question")
def resolve_question(
    belief_id: BeliefIdPath, actor: CurrentActor, beliefs: BeliefsDep, body: ResolveIn | None = None
) -> Belief:
    body = body or ResolveIn()
    return beliefs.resolve(actor, belief_id, body.note, body.resolved_by)


@router.post("/{belief_id}/aliases", response_model=Belief, summary="Add aliases (within the cap of 25)")
def add_belief_aliases(belief_id: BeliefIdPath, body: AliasesIn, actor: CurrentActor, beliefs: BeliefsDep) -> Belief:
    return beliefs.add_aliases(actor, belief_id, body.aliases)


@router.post(
    "/{belief_id}/aliases/remove",
    response_model=Belief,
    summary="Remove aliases (each must be one of the belief's; audited as belief.remove_aliases)",
)
def remove_belief_aliases(belief_id: BeliefIdPath, body: AliasesIn, actor: CurrentActor, beliefs: BeliefsDep) -> Belief:
    return beliefs.remove_aliases(actor, belief_id, body.aliases)


@router.post(
    "/{belief_id}/retract",
    response_model=Belief,
    summary="Retract (never injected again; kept for history)",
)
def retract_belief(
    belief_id: BeliefIdPath, actor: CurrentActor, beliefs: BeliefsDep, body: RetractIn | None = None
) -> Belief:
    return beliefs.retract(actor, belief_id, body.reason if body else None)


@router.delete(
    "/{belief_id}",
    response_model=ErasureReceiptOut,
    summary="Admin erase: all versions, every copy of their text in the namespace, cached renderings",
)
def erase_belief(
    belief_id: BeliefIdPath,
    _admin: AdminPrincipal,
    actor: CurrentActor,
    beliefs: BeliefsDep,
    expunge: Annotated[
        bool, Query(description="Also merge the deleted copies out of the index segments (I/O heavy)")
    ] = False,
) -> ErasureReceiptOut:
    receipt = beliefs.erase(actor, belief_id, expunge=expunge)
    return ErasureReceiptOut(**receipt.__dict__)
