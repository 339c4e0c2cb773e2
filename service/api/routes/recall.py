"""POST /v1/recall: the four tiers plus the rendered injection block, with an injection receipt."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from service.api.deps import ReadingActor, RecallDep
from service.domain import scopes as scope_rules
from service.domain.belief import BeliefType, EpistemicStatus
from service.recall.context import RecallBudget, TierEntry
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
    beliefs: str = Field(description="Stable part: instructions, persona, pinned facts (cacheable)")
    dynamic: str = Field(description="Query-surfaced beliefs and open questions")
    text: str = Field(description="Both parts joined: what goes into the system prompt")


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


def _item(entry: TierEntry) -> TierItem:
    b = entry.belief
    return TierItem(
        id=b.id,
        canonical_name=b.canonical_name,
        type=b.type,
        scope=b.scope,
        content=b.content,
        why_it_matters=b.why_it_matters,
        epistemic_status=b.epistemic_status,
        confidence=b.confidence,
        score=entry.score,
        clauses=[Clause(clause=c.clause, term=c.term, score=c.score) for c in entry.clauses],
        via_relation=entry.via_relation,
        relation_type=b.relation_type,
    )


@router.post("/recall", response_model=RecallOut, summary="Recall the four tiers and the injection block")
async def recall(body: RecallIn, actor: ReadingActor, service: RecallDep) -> RecallOut:
    # async end to end: authentication, the rate limit, the OpenSearch requests and the receipt
    # are awaited on the event loop (no thread-pool hop on the hot path, issue 16)
    if body.session_id:
        actor = replace(actor, session_id=body.session_id)
    done = await service.arecall(actor, body.scopes, body.query, budget=body.budget, explain=body.explain)
    r = done.result
    return RecallOut(
        scopes=r.scopes,
        query=r.query.text,
        persona=r.persona,
        tiers=Tiers(**{tier.value: [_item(e) for e in entries] for tier, entries in r.tiers().items()}),
        injected_ids=r.injected_ids,
        truncated=r.truncated,
        injection=Injection(beliefs=done.block.beliefs, dynamic=done.block.dynamic, text=done.block.text),
        receipt_id=done.receipt_id,
        quarantined=len(r.quarantined),
        explain=r.notes if body.explain else None,
    )
