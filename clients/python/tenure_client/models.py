"""Typed request and response models of the Tenure API.

Generated from the service's OpenAPI schema by ``tenure_client._codegen``: do not edit by hand.
Response models accept fields they do not know (a newer server may add some); request models
reject unknown ones, as the server does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class AdminTurnDetail(BaseModel):
    """One turn, whole: its extraction state, the exchange and the sidecar."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    turn_id: str
    owner_id: str
    session_id: str
    scope: list[str]
    source: str
    model: str | None
    parse_status: str
    gate: str | None
    extraction_status: Literal["pending", "running", "done", "failed", "skipped"]
    attempts: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    user_message: str
    assistant_text: str
    sidecar_raw: str | None
    injected_ids: list[str]
    result: dict[str, Any] | None


class AdminTurnOut(BaseModel):
    """A turn's extraction state, without the exchange's text (``GET /v1/admin/turns/{id}`` has it)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    turn_id: str
    owner_id: str
    session_id: str
    scope: list[str]
    source: str
    model: str | None
    parse_status: str
    gate: str | None
    extraction_status: Literal["pending", "running", "done", "failed", "skipped"]
    attempts: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class AdminTurnPage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    items: list[AdminTurnOut]
    next_cursor: str | None = None
    quarantined: int = 0


class AliasesIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    aliases: list[str]


class AnthropicErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: str
    message: str
    code: str
    details: Any | None = None


class AnthropicErrorOut(BaseModel):
    """The error shape of the Anthropic Messages route (``/v1/messages``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
    request_id: str | None = None


class AuditEvent(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    event_id: str | None = None
    tenant_id: str
    at: datetime | None = None
    action: str
    actor_id: str
    actor_kind: str
    credential_id: str | None = None
    belief_ids: list[str] | None = None
    session_id: str | None = None
    request_id: str | None = None
    scopes: list[str] | None = None
    query: str | None = None
    injected: list[dict[str, Any]] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    details: dict[str, Any] | None = None
    payload_erased_at: datetime | None = None


class AuditPage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    items: list[AuditEvent]
    next_cursor: str | None = None
    quarantined: int = 0


BeliefType = Literal["preference", "decision", "entity", "open_question", "relation"]


EpistemicStatus = Literal["active", "inferred", "exploratory", "superseded"]


class ChangeLogEntry(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    changed_at: datetime
    trigger: str
    actor: str | None = None
    previous_content: str | None = None
    previous_epistemic_status: EpistemicStatus | None = None
    previous_confidence: float | None = None
    changed_by_session: str | None = None
    changed_by_turn: str | None = None
    note: str | None = None
    removed_aliases: list[str] | None = None


ExpertiseDepth = Literal["learning", "working", "deep", "expert"]


class Provenance(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    session_id: str | None = None
    turn_id: str | None = None
    source_model: str | None = None
    author: str | None = None
    extracted_at: datetime | None = None


Subtype = Literal["expertise", "style"]


class Belief(BaseModel):
    """A stored belief. ``tenant_id`` always comes from the caller's credentials."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str | None = None
    tenant_id: str
    owner_id: str
    type: BeliefType
    subtype: Subtype | None = None
    canonical_name: str
    aliases: list[str] | None = None
    content: str
    why_it_matters: str = ""
    scope: list[str]
    epistemic_status: EpistemicStatus = "active"
    confidence: float = 0.8
    pinned: bool = False
    user_edited: bool = False
    reinforcement_count: int = 0
    last_reinforced_at: datetime | None = None
    supersedes: str | None = None
    superseded_by: str | None = None
    resolved_at: datetime | None = None
    retracted_at: datetime | None = None
    participants: list[str] | None = None
    relation_type: str | None = None
    expertise_domain: str | None = None
    expertise_depth: ExpertiseDepth | None = None
    compaction_note: str | None = None
    provenance: Provenance | None = None
    change_log: list[ChangeLogEntry] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    version: int = 1


class BeliefCreate(BaseModel):
    """A new belief. The tenant and owner come from the credentials, never from the body."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str | None = None
    type: BeliefType
    subtype: Subtype | None = None
    canonical_name: str
    aliases: list[str] | None = None
    content: str
    why_it_matters: str = ""
    scope: list[str]
    epistemic_status: EpistemicStatus = "active"
    confidence: float = 0.8
    pinned: bool = False
    user_edited: bool = False
    participants: list[str] | None = None
    relation_type: str | None = None
    expertise_domain: str | None = None
    expertise_depth: ExpertiseDepth | None = None
    provenance: Provenance | None = None


class BeliefPage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    items: list[Belief]
    next_cursor: str | None = None
    quarantined: int = 0


class BulkRetryIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    owner_id: str | None = None
    limit: int = 50


class TurnRetryOut(BaseModel):
    """The turn as the retry left it (pending, no attempts), and what it had failed with."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    turn_id: str
    owner_id: str
    session_id: str
    scope: list[str]
    source: str
    model: str | None
    parse_status: str
    gate: str | None
    extraction_status: Literal["pending", "running", "done", "failed", "skipped"]
    attempts: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    previous_error: str | None
    previous_attempts: int
    queued: bool


class BulkRetryOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    retried: list[TurnRetryOut]
    not_retried: dict[str, str]
    more: bool


class Clause(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    clause: str
    term: str | None = None
    score: float | None = None


class CompactionIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    force: bool = False


class ErasureReceiptOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    erased_at: datetime
    text_copies_redacted: int = 0
    review_items_removed: int = 0
    expunged: bool = False


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    code: str
    message: str
    details: Any | None = None
    request_id: str | None = None


class ErrorOut(BaseModel):
    """The one error shape of every endpoint."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    error: ErrorDetail


Role = Literal["member", "admin"]


class GrantsPatch(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    add_projects: list[str] | None = None
    remove_projects: list[str] | None = None
    add_teams: list[str] | None = None
    remove_teams: list[str] | None = None
    add_roles: list[Role] | None = None
    remove_roles: list[Role] | None = None


class Health(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    status: Literal["ok"] = "ok"


class HistoryEntry(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    belief_id: str
    version: int
    entry: ChangeLogEntry


class HistoryOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    belief_id: str
    chain: list[Belief]
    change_log: list[HistoryEntry]


class ImportResult(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    imported: list[str]
    failed: dict[str, dict[str, str]]
    changed: dict[str, list[str]] | None = None
    warnings: list[str] | None = None


class Injection(BaseModel):
    """The rendered block, sent once (API change of 2026-11-30, docs/api.md "Recall")."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    text: str
    beliefs_end: int
    dynamic_start: int
    beliefs: str | None = None
    dynamic: str | None = None


class IssuedKeyOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    key_id: str
    tenant_id: str
    user_id: str
    name: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    key: str


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = ""
    roles: list[Role] | None = None
    projects: list[str] | None = None
    teams: list[str] | None = None
    expires_in_s: int | None = None


class KeyOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    key_id: str
    tenant_id: str
    user_id: str
    name: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class KeyPage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    items: list[KeyOut]
    next_cursor: str | None = None


Lifecycle = Literal["live", "superseded", "resolved", "retracted"]


class MergeIn(BaseModel):
    """How a conflict's proposal is merged into the existing belief (``action: merge``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    content: Literal["existing", "proposed"] = "existing"
    why_it_matters: Literal["existing", "proposed"] = "existing"
    edited_content: str | None = None
    edited_why_it_matters: str | None = None


class OpenAIErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    message: str
    type: str
    code: str
    param: str | None = None
    details: Any | None = None
    request_id: str | None = None


class OpenAIErrorOut(BaseModel):
    """The error shape of the OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/models``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    error: OpenAIErrorDetail


class QuarantineErasedOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    text_copies_redacted: int = 0
    review_items_removed: int = 0
    expunged: bool = False
    erased_at: datetime


class QuarantinedOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    kind: Literal["belief", "turn", "review", "audit_event"]
    record_id: str
    belief_id: str | None = None
    owner_id: str | None
    scope: list[str]
    reason: str


class QuarantinePageOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    kind: Literal["belief", "turn", "review", "audit_event"]
    items: list[QuarantinedOut]
    scanned: int
    next_cursor: str | None = None


class QuarantinedRecordErasedOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    kind: Literal["turn", "review", "audit_event"]
    record_id: str
    erased_at: datetime


class Readiness(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    status: Literal["ready", "unavailable"]
    opensearch: bool
    redis: bool
    indices: bool


class RecallBudget(BaseModel):
    """Per-request caps; anything unset falls back to the deployment's defaults."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    maxBeliefs: int | None = None
    maxPinnedFacts: int | None = None
    maxQuestions: int | None = None
    maxCharsPerBelief: int | None = None
    maxPersonaChars: int | None = None
    minScore: float | None = None


class RecallIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    scopes: list[str] | None = None
    query: str = ""
    session_id: str | None = None
    budget: RecallBudget | None = None
    explain: bool = False
    injection_parts: bool = False


class TierItem(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str
    canonical_name: str
    type: BeliefType
    scope: list[str]
    content: str
    why_it_matters: str
    epistemic_status: EpistemicStatus
    confidence: float
    score: float | None = None
    clauses: list[Clause] | None = None
    via_relation: str | None = None
    relation_type: str | None = None


class Tiers(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    pinned: list[TierItem]
    relevant: list[TierItem]
    questions: list[TierItem]


class RecallOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    scopes: list[str]
    query: str
    persona: str | None
    tiers: Tiers
    injected_ids: list[str]
    truncated: bool
    injection: Injection
    receipt_id: str
    quarantined: int = 0
    explain: list[dict[str, Any]] | None = None


class ReinforceIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    aliases: list[str] | None = None


class RetractIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    reason: str | None = None


class ReviewItem(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    tenant_id: str
    review_id: str
    kind: Literal["conflict", "alias_candidate"]
    status: Literal["open", "resolved", "dismissed"] = "open"
    owner_id: str
    scope: list[str] | None = None
    belief_id: str | None = None
    canonical_name: str | None = None
    surface: str | None = None
    reason: str = ""
    paper_outcome: str | None = None
    proposed: dict[str, Any] | None = None
    session_id: str | None = None
    turn_ids: list[str] | None = None
    sightings: int = 1
    resolved_at: datetime | None = None
    resolved_by: str | None = None
    resolution: str | None = None
    result_belief_id: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class SupersedeIn(BaseModel):
    """The replacement. Unset fields are carried over from the superseded belief."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str | None = None
    content: str
    canonical_name: str | None = None
    why_it_matters: str | None = None
    aliases: list[str] | None = None
    confidence: float | None = None
    reason: str | None = None


class SupersedeResult(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    superseded: Belief
    current: Belief


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    tenant_id: str
    name: str = ""


class TenantOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    tenant_id: str
    name: str
    disabled: bool
    created_at: datetime


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ttl_s: int | None = None


class TokenOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    token: str
    token_type: str = "Bearer"
    expires_at: int


class TokenRevokeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    token: str


class TokenRevokedOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    jti: str
    revoked: bool
    expires_at: int


class TurnIn(BaseModel):
    """A completed turn posted by a client that called the model itself."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    turn_id: str | None = None
    session_id: str | None = None
    scope: list[str] | None = None
    model: str
    user_message: str
    assistant_message: str
    injected_ids: list[str] | None = None


class TurnOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    turn_id: str
    session_id: str
    scope: list[str]
    parse_status: str
    extraction_status: str
    visible: str | None = None
    result: dict[str, Any] | None = None
    model_warning: str | None = None


class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    user_id: str
    roles: list[Role] | None = None
    projects: list[str] | None = None
    teams: list[str] | None = None


class UserOut(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    tenant_id: str
    user_id: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    disabled: bool
    created_at: datetime
    updated_at: datetime


class UserPage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    items: list[UserOut]
    next_cursor: str | None = None


class WhoAmI(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    tenant_id: str
    user_id: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    credential: str
    credential_id: str | None


class BeliefsResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    note: str | None = None
    resolved_by: str | None = None


class MemoryLoopResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    action: Literal["keep_existing", "accept_proposed", "merge", "apply_alias", "dismiss"]
    merge: MergeIn | None = None


__all__ = [
    "AdminTurnDetail",
    "AdminTurnOut",
    "AdminTurnPage",
    "AliasesIn",
    "AnthropicErrorDetail",
    "AnthropicErrorOut",
    "AuditEvent",
    "AuditPage",
    "Belief",
    "BeliefCreate",
    "BeliefPage",
    "BeliefType",
    "BeliefsResolveIn",
    "BulkRetryIn",
    "BulkRetryOut",
    "ChangeLogEntry",
    "Clause",
    "CompactionIn",
    "EpistemicStatus",
    "ErasureReceiptOut",
    "ErrorDetail",
    "ErrorOut",
    "ExpertiseDepth",
    "GrantsPatch",
    "Health",
    "HistoryEntry",
    "HistoryOut",
    "ImportResult",
    "Injection",
    "IssuedKeyOut",
    "KeyIn",
    "KeyOut",
    "KeyPage",
    "Lifecycle",
    "MemoryLoopResolveIn",
    "MergeIn",
    "OpenAIErrorDetail",
    "OpenAIErrorOut",
    "Provenance",
    "QuarantineErasedOut",
    "QuarantinePageOut",
    "QuarantinedOut",
    "QuarantinedRecordErasedOut",
    "Readiness",
    "RecallBudget",
    "RecallIn",
    "RecallOut",
    "ReinforceIn",
    "RetractIn",
    "ReviewItem",
    "Role",
    "Subtype",
    "SupersedeIn",
    "SupersedeResult",
    "TenantIn",
    "TenantOut",
    "TierItem",
    "Tiers",
    "TokenIn",
    "TokenOut",
    "TokenRevokeIn",
    "TokenRevokedOut",
    "TurnIn",
    "TurnOut",
    "TurnRetryOut",
    "UserIn",
    "UserOut",
    "UserPage",
    "WhoAmI",
]
