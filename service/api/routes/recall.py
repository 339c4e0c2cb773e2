"""POST /v1/recall: the four tiers plus the rendered injection block, with an injection receipt."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from service.api.deps import RecallCallerDep
from service.domain import scopes as scope_rules
from service.domain.belief import BeliefType, EpistemicStatus
from service.recall.context import RecallBudget, TierEntry
from service.recall.render import InjectionBlock
from service.recall.service import Recall
from service.recall.tiers import Tier

router = APIRouter(prefix="/v1", tags=["recall"])


class RecallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scopes: list[str] = Field(
        default_factory=list,
        max_length=scope_rules.MAX_SCOPES,
        description="The session's scope labels",
    )
    query: str = Field("", max_length=20_000, description="The user's message (or any text to recall for)")
    session_id: str | None = Field(None, min_length=1, max_length=200)
    budget: RecallBudget | None = None
    explain: bool = Field(False, description="Add per-clause scores and why beliefs were filtered")
    injection_parts: bool = Field(
        False,
        description=(
            "Also send `injection.beliefs` and `injection.dynamic` as strings (the response before "
            "2026-11-30, which sent the block twice). Without it, cut them from `injection.text` "
            "with `beliefs_end` and `dynamic_start`."
        ),
    )

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, values: list[str]) -> list[str]:
        return scope_rules.normalize_scopes(values)


class Clause(BaseModel):
    clause: str
    term: str | None = None
    score: float | None = None


class TierItem(BaseModel):
    id: str
    canonical_name: str
    type: BeliefType
    scope: list[str]
    content: str
    why_it_matters: str
    epistemic_status: EpistemicStatus
    confidence: float
    score: float | None = None
    clauses: list[Clause] = Field(default_factory=list)
    via_relation: str | None = None
    relation_type: str | None = Field(None, description="Relations: what links the participants (depends_on, ...)")


def _tiers_model() -> type[BaseModel]:
    """``tiers`` of the response: one required list of items per :class:`Tier`, in its order
    (the same schema as the hand-written model this replaces: the SDK's ``Tiers``)."""
    fields: dict[str, Any] = {tier.value: (list[TierItem], ...) for tier in Tier}
    return create_model("Tiers", **fields)


Tiers = _tiers_model()


class Injection(BaseModel):
    """The rendered block, sent once (API change of 2026-11-30, docs/api.md "Recall")."""

    text: str = Field(description="What goes into the system prompt: the stable part, then the dynamic part")
    beliefs_end: int = Field(
        description="`text[:beliefs_end]` is the stable part: instructions, persona, pinned facts (cacheable); "
        "offsets count Unicode code points"
    )
    dynamic_start: int = Field(
        description="`text[dynamic_start:]` is the dynamic part: query-surfaced beliefs and open questions"
    )
    beliefs: str | None = Field(None, description="The stable part again; only with `injection_parts: true`")
    dynamic: str | None = Field(None, description="The dynamic part again; only with `injection_parts: true`")


class RecallOut(BaseModel):
    scopes: list[str]
    query: str
    persona: str | None
    tiers: Tiers  # type: ignore[valid-type]  # a model built from Tier (mypy sees no class statement)
    injected_ids: list[str]
    truncated: bool
    injection: Injection
    receipt_id: str = Field(description="The audit event recording this injection")
    quarantined: int = Field(
        0, description="Stored documents that matched but cannot be loaded: skipped, never injected"
    )
    explain: list[dict[str, Any]] | None = None


def _item(entry: TierEntry) -> dict[str, Any]:
    """One :class:`TierItem` as plain data (the response is built here once and sent with orjson:
    no model instance per hit, no re-validation by the framework; tests compare it with the model)."""
    b = entry.belief
    return {
        "id": b.id,
        "canonical_name": b.canonical_name,
        "type": b.type.value,
        "scope": b.scope,
        "content": b.content,
        "why_it_matters": b.why_it_matters,
        "epistemic_status": b.epistemic_status.value,
        "confidence": b.confidence,
        "score": entry.score,
        "clauses": [{"clause": c.clause, "term": c.term, "score": c.score} for c in entry.clauses],
        "via_relation": entry.via_relation,
        "relation_type": b.relation_type,
    }


def _injection(block: InjectionBlock, *, with_parts: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "text": block.text,
        "beliefs_end": block.beliefs_end,
        "dynamic_start": block.dynamic_start,
        "beliefs": None,
        "dynamic": None,
    }
    if with_parts:
        out["beliefs"], out["dynamic"] = block.beliefs, block.dynamic
    return out


def recall_body(done: Recall, *, explain: bool, injection_parts: bool) -> dict[str, Any]:
    """The :class:`RecallOut` of one recall, as the JSON-ready dict the route sends."""
    r = done.result
    return {
        "scopes": r.scopes,
        "query": r.query.text,
        "persona": r.persona,
        "tiers": {tier.value: [_item(e) for e in entries] for tier, entries in r.tiers().items()},
        "injected_ids": r.injected_ids,
        "truncated": r.truncated,
        "injection": _injection(done.block, with_parts=injection_parts),
        "receipt_id": done.receipt_id,
        "quarantined": len(r.quarantined),
        "explain": r.notes if explain else None,
    }


@router.post("/recall", response_model=RecallOut, summary="Recall the four tiers and the injection block")
async def recall(body: RecallIn, caller: RecallCallerDep) -> Response:
    # async end to end: authentication, the rate limit, the OpenSearch requests and the receipt
    # are awaited on the event loop (no thread-pool hop on the hot path, issue 16)
    actor = caller.actor
    if body.session_id:
        actor = replace(actor, session_id=body.session_id)

    def answer(done: Recall) -> bytes:
        return orjson.dumps(recall_body(done, explain=body.explain, injection_parts=body.injection_parts))

    content = await caller.recall.arecall(
        actor, body.scopes, body.query, answer=answer, budget=body.budget, explain=body.explain, built=caller.built
    )
    return Response(content, media_type="application/json")
