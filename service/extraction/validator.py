"""Validate (and, for truncated blocks, repair) a sidecar payload (paper §4.2).

The sidecar is untrusted data written by a model that read user-controlled text. Everything in it
is checked for type, size and shape; a bad item is skipped on its own with a recorded reason, a
bad payload is rejected as a whole with a reason, and nothing in it is ever treated as an
instruction. Text that tries to talk to the system (prompt-injection phrasing, our own markers or
injection tags) is refused, because accepted beliefs are injected into future system prompts.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from service.domain import scopes as scope_rules
from service.domain.belief import (
    MAX_ALIAS_CHARS,
    MAX_ALIASES,
    MAX_NAME_CHARS,
    BeliefType,
    EpistemicStatus,
    ExpertiseDepth,
    Subtype,
    normalize_alias,
    normalize_canonical_name,
)
from service.domain.json_tree import nesting_depth
from service.domain.text import clip
from service.domain.visible_text import visible_text
from service.extraction.sidecar import ParseStatus

TURN_SIGNALS = ("substantive", "acknowledgment", "clarification", "correction")
UPDATE_CHANGES = ("reinforced", "contradicted", "superseded")
CANDIDATE_CONFIDENCE = ("low", "medium", "high")
INSERTABLE_STATUSES = (
    EpistemicStatus.ACTIVE,
    EpistemicStatus.INFERRED,
    EpistemicStatus.EXPLORATORY,
)

MAX_DEPTH = 6
MAX_CONTENT = 2000
MAX_WHY = 500
MAX_ID = 128
MAX_LABEL = 80
MAX_ALIAS_WORDS = 6
SECTION_LIMITS = {
    "new_beliefs": 20,
    "belief_updates": 20,
    "entity_updates": 20,
    "possible_alias_candidates": 20,
    "resolved_open_questions": 20,
    "new_open_questions": 10,
    "style_signals": 20,
}

_FENCE = re.compile(r"^\s*```(?:json)?\s*|\s*```\s*$", re.IGNORECASE)
_OBJECT = re.compile(r"\{[\s\S]*\}")
# Text that addresses the system rather than stating a fact about the user or their work.
INSTRUCTION_LIKE = re.compile(
    r"(ignore|disregard|forget|override)\s+(all\s+|any\s+|the\s+|your\s+)*(previous|prior|above|earlier|system)\s+"
    r"(instructions?|prompts?|rules?|messages?)"
    r"|system\s+prompt|<<<|>>>|</?(persona|scope|pinned_facts|relevant_beliefs|open_questions|system)\b"
    r"|\byou\s+are\s+now\b|\bnew\s+instructions?\b|\bjailbreak",
    re.IGNORECASE,
)


def addresses_system(text: str) -> bool:
    """Whether ``text`` is instruction-like (:data:`INSTRUCTION_LIKE`) as stored and as a model
    reads it: checked after the store's clean-up (:func:`visible_text` drops zero-width spaces,
    word joiners and control characters, so ``system\u200b prompt`` is stored as ``system
    prompt``), NFKC (full-width ``Ｉｇｎｏｒｅ`` reads as ``Ignore``) and without the invisible
    format characters the store keeps (zero-width joiners, soft hyphens); and as written (the
    clean-up shortens our ``<<<`` markers, which are refused all the same)."""
    folded = unicodedata.normalize("NFKC", visible_text(text))
    read = "".join(c for c in folded if unicodedata.category(c) != "Cf")
    return any(INSTRUCTION_LIKE.search(form) for form in (text, read))


@dataclass(frozen=True)
class Skip:
    section: str
    index: int | None
    reason: str


@dataclass(frozen=True)
class NewBelief:
    type: BeliefType
    subtype: Subtype | None
    canonical_name: str
    content: str
    why_it_matters: str
    scope: list[str]
    confidence: float
    epistemic_status: EpistemicStatus
    aliases: list[str]
    resolves_open_question: str | None = None
    expertise_domain: str | None = None
    expertise_depth: ExpertiseDepth | None = None


@dataclass(frozen=True)
class BeliefUpdate:
    belief_id: str
    change: str
    new_content: str | None = None
    new_canonical_name: str | None = None


@dataclass(frozen=True)
class EntityUpdate:
    canonical_name: str
    new_aliases: list[str]


@dataclass(frozen=True)
class AliasCandidate:
    surface: str
    possible_entities: list[str]
    confidence: str


@dataclass(frozen=True)
class NewOpenQuestion:
    canonical_name: str
    content: str
    scope: list[str]


@dataclass
class ValidatedSidecar:
    status: ParseStatus
    accepted: bool
    rejected_reason: str | None = None
    turn_signal: str | None = None
    topic_shift: bool = False
    topic_label: str | None = None
    new_beliefs: list[NewBelief] = field(default_factory=list)
    belief_updates: list[BeliefUpdate] = field(default_factory=list)
    entity_updates: list[EntityUpdate] = field(default_factory=list)
    alias_candidates: list[AliasCandidate] = field(default_factory=list)
    resolved_open_questions: list[str] = field(default_factory=list)
    new_open_questions: list[NewOpenQuestion] = field(default_factory=list)
    style_signal_count: int = 0
    skipped: list[Skip] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "parse_status": self.status.value,
            "accepted": self.accepted,
            "rejected_reason": self.rejected_reason,
            "turn_signal": self.turn_signal,
            "counts": {
                "new_beliefs": len(self.new_beliefs),
                "belief_updates": len(self.belief_updates),
                "entity_updates": len(self.entity_updates),
                "alias_candidates": len(self.alias_candidates),
                "resolved_open_questions": len(self.resolved_open_questions),
                "new_open_questions": len(self.new_open_questions),
                "style_signals": self.style_signal_count,
            },
            "skipped": [{"section": s.section, "index": s.index, "reason": s.reason} for s in self.skipped],
        }


class _Bad(Exception):
    """One item is invalid; the message is the recorded reason."""


def _rejected(status: ParseStatus, reason: str) -> ValidatedSidecar:
    return ValidatedSidecar(status=status, accepted=False, rejected_reason=reason)


def validate_sidecar(raw: str | None, status: ParseStatus, *, max_chars: int = 32_000) -> ValidatedSidecar:
    """Parse, repair if needed, and validate every section; never raises on bad input."""
    if status is ParseStatus.MISSING or raw is None:
        return _rejected(ParseStatus.MISSING, "no sidecar in the answer")
    text = raw
    if status is ParseStatus.NEEDS_REPAIR:
        text = text[:max_chars]
        found = _OBJECT.search(text)
        if not found:
            return _rejected(status, "truncated sidecar: no JSON object to repair")
        text = found.group(0)
    elif len(text) > max_chars:
        return _rejected(status, f"sidecar larger than {max_chars} characters")
    text = _FENCE.sub("", text)
    try:
        data = json.loads(text)
    except RecursionError:
        return _rejected(status, "sidecar nested too deeply")
    except ValueError as exc:
        return _rejected(status, f"sidecar is not valid JSON: {str(exc)[:120]}")
    if not isinstance(data, dict):
        return _rejected(status, "sidecar top level must be a JSON object")
    if nesting_depth(data) > MAX_DEPTH:
        return _rejected(status, f"sidecar nested deeper than {MAX_DEPTH} levels")
    signal = data.get("turn_signal")
    if signal not in TURN_SIGNALS:
        return _rejected(status, f"invalid turn_signal {str(signal)[:40]!r}")
    out = ValidatedSidecar(status=status, accepted=True, turn_signal=signal)
    out.topic_shift = data.get("topic_shift") is True
    label = data.get("topic_label")
    out.topic_label = clip(label.strip(), MAX_LABEL) if isinstance(label, str) and label.strip() else None
    out.new_beliefs = _section(data, "new_beliefs", _new_belief, out.skipped)
    out.belief_updates = _section(data, "belief_updates", _belief_update, out.skipped)
    out.entity_updates = _section(data, "entity_updates", _entity_update, out.skipped)
    out.alias_candidates = _section(data, "possible_alias_candidates", _alias_candidate, out.skipped)
    out.resolved_open_questions = _section(data, "resolved_open_questions", _id_value, out.skipped)
    out.new_open_questions = _section(data, "new_open_questions", _open_question, out.skipped)
    out.style_signal_count = len(_section(data, "style_signals", _any_object, out.skipped))
    return out


def _section(data: dict[str, Any], name: str, check: Any, skipped: list[Skip]) -> list[Any]:
    items = data.get(name)
    if items is None:
        return []
    if not isinstance(items, list):
        skipped.append(Skip(name, None, f"{name} must be an array, got {type(items).__name__}"))
        return []
    limit = SECTION_LIMITS[name]
    if len(items) > limit:
        skipped.append(Skip(name, None, f"{len(items) - limit} items over the limit of {limit} dropped"))
    out: list[Any] = []
    for index, item in enumerate(items[:limit]):
        try:
            out.append(check(item))
        except _Bad as exc:
            skipped.append(Skip(name, index, str(exc)))
    return out


def _obj(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise _Bad(f"item must be an object, got {type(item).__name__}")
    return item


def _text(item: dict[str, Any], key: str, limit: int, *, required: bool = True) -> str | None:
    value = item.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise _Bad(f"{key} is required")
        return None
    if not isinstance(value, str):
        raise _Bad(f"{key} must be a string, got {type(value).__name__}")
    value = value.strip()
    if len(value) > limit:
        raise _Bad(f"{key} longer than {limit} characters")
    if addresses_system(value):
        raise _Bad(f"{key} looks like an instruction to the system (possible prompt injection)")
    return value


def _name(item: dict[str, Any], key: str = "canonical_name", *, required: bool = True) -> str | None:
    # the bound that matters is on the normalised name; the raw one only stops absurd input
    value = _text(item, key, MAX_CONTENT, required=required)
    if value is None:
        return None
    name = normalize_canonical_name(value)
    if not name:
        raise _Bad(f"{key} has no letters or digits")
    if len(name) > MAX_NAME_CHARS:
        raise _Bad(f"{key} longer than {MAX_NAME_CHARS} characters")
    return name


def _enum(value: Any, enum: Any, key: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise _Bad(f"invalid {key} {str(value)[:40]!r}") from None


def _scopes(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _Bad("scope must be an array of strings")
    try:
        return scope_rules.normalize_scopes(value)
    except scope_rules.InvalidScope as exc:
        raise _Bad(str(exc)) from None


def _aliases(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(f"{key} must be an array of strings")
    out: list[str] = []
    for raw in value[: MAX_ALIASES * 2]:
        if not isinstance(raw, str):
            raise _Bad(f"{key} must contain strings only")
        alias = normalize_alias(raw)
        if not alias or len(alias) > MAX_ALIAS_CHARS or len(alias.split()) > MAX_ALIAS_WORDS:
            continue  # a sentence is not an alias; drop it, keep the rest
        if addresses_system(alias):
            raise _Bad(f"{key} contains an instruction-like alias (possible prompt injection)")
        if alias not in out:
            out.append(alias)
    return out


def _confidence(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad("confidence must be a number in [0, 1]")
    if not 0.0 <= float(value) <= 1.0:
        raise _Bad(f"confidence {value} outside [0, 1]")
    return float(value)


def _new_belief(raw: Any) -> NewBelief:
    item = _obj(raw)
    kind = _enum(item.get("type"), BeliefType, "type")
    subtype = None if item.get("subtype") is None else _enum(item.get("subtype"), Subtype, "subtype")
    if subtype is not None and kind is not BeliefType.PREFERENCE:
        raise _Bad("subtype is only valid on preference beliefs")
    if kind is BeliefType.RELATION:
        raise _Bad("relations need belief ids as participants; not accepted from a sidecar")
    status = _enum(item.get("epistemic_status") or "active", EpistemicStatus, "epistemic_status")
    if status not in INSERTABLE_STATUSES:
        raise _Bad(f"epistemic_status {status.value!r} cannot be set by extraction")
    depth = item.get("expertise_depth")
    resolves = item.get("resolves_open_question")
    return NewBelief(
        type=kind,
        subtype=subtype,
        canonical_name=str(_name(item)),
        content=str(_text(item, "content", MAX_CONTENT)),
        why_it_matters=str(_text(item, "why_it_matters", MAX_WHY)),  # the paper's quality gate
        scope=_scopes(item.get("scope")),
        confidence=_confidence(item.get("confidence")),
        epistemic_status=status,
        aliases=_aliases(item.get("aliases"), "aliases"),
        resolves_open_question=_id_value(resolves) if resolves is not None else None,
        expertise_domain=_text(item, "expertise_domain", 200, required=False),
        expertise_depth=None if depth is None else _enum(depth, ExpertiseDepth, "expertise_depth"),
    )


def _belief_update(raw: Any) -> BeliefUpdate:
    item = _obj(raw)
    change = item.get("change")
    if change not in UPDATE_CHANGES:
        raise _Bad(f"invalid change {str(change)[:40]!r}")
    return BeliefUpdate(
        belief_id=_id_value(item.get("belief_id")),
        change=change,
        new_content=_text(item, "new_content", MAX_CONTENT, required=False),
        new_canonical_name=_name(item, "new_canonical_name", required=False),
    )


def _entity_update(raw: Any) -> EntityUpdate:
    item = _obj(raw)
    aliases = _aliases(item.get("new_aliases"), "new_aliases")
    if not aliases:
        raise _Bad("new_aliases is empty")
    return EntityUpdate(canonical_name=str(_name(item)), new_aliases=aliases)


def _alias_candidate(raw: Any) -> AliasCandidate:
    item = _obj(raw)
    surface = _aliases([item.get("surface")] if isinstance(item.get("surface"), str) else None, "surface")
    if not surface:
        raise _Bad("surface must be a short string")
    entities = item.get("possible_entities")
    if not isinstance(entities, list) or not entities or not all(isinstance(e, str) for e in entities):
        raise _Bad("possible_entities must be a non-empty array of strings")
    names = [n for n in (normalize_canonical_name(e) for e in entities[:5]) if n]
    confidence = item.get("confidence")
    if confidence not in CANDIDATE_CONFIDENCE:
        raise _Bad(f"invalid confidence {str(confidence)[:20]!r}")
    return AliasCandidate(surface=surface[0], possible_entities=names, confidence=str(confidence))


def _open_question(raw: Any) -> NewOpenQuestion:
    item = _obj(raw)
    return NewOpenQuestion(
        canonical_name=str(_name(item)),
        content=str(_text(item, "content", MAX_CONTENT)),
        scope=_scopes(item.get("scope")),
    )


def _id_value(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise _Bad("belief id must be a non-empty string")
    value = raw.strip()
    if len(value) > MAX_ID or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", value):
        raise _Bad(f"malformed belief id {value[:40]!r}")
    return value


def _any_object(raw: Any) -> dict[str, Any]:
    return _obj(raw)
