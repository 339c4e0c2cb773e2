"""The belief: typed, scoped, versioned state about a user or team (paper §2).

This model is the contract for every write. It normalises what it can (names, aliases, scopes,
timestamps) and rejects what it cannot with a precise error. It loads the paper's seed records as
they are: ``_id`` becomes ``id`` and ``user_id`` becomes ``owner_id``.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from service.domain import scopes as scope_rules
from service.domain.text import clip, drop_optional_spaces
from service.domain.visible_text import visible_text

MAX_ALIASES = 25
MAX_ALIAS_CHARS = 100
MAX_NAME_CHARS = 120
MAX_CONTENT_CHARS = 8000
MAX_WHY_CHARS = 2000
MAX_CHANGE_LOG = 200
MAX_RELATION_TYPE_CHARS = 64
MAX_REMOVED_ALIASES = 500  # remembered per belief (the change log's rollover keeps them too)
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# the largest count or version kept: every JSON reader holds it exactly (2**53), far below the
# 64 bits the store's encoder and OpenSearch's long take
MAX_COUNT = 2**53
# Indexed fields derived from the model, never part of it: the lifecycle and content fingerprint
# (to_document), the analysed name units the storage layer adds (kept out of the stored source
# by the mapping; ignored here too, so an index without that exclusion still reads) and the ref of
# the change-log document the storage layer keeps the log in (service/storage/change_logs.py).
_DERIVED_FIELDS = frozenset({"lifecycle", "content_hash", "vocabulary_units", "change_log_ref"})


class BeliefType(str, Enum):
    PREFERENCE = "preference"
    DECISION = "decision"
    ENTITY = "entity"
    OPEN_QUESTION = "open_question"
    RELATION = "relation"


class Subtype(str, Enum):
    EXPERTISE = "expertise"
    STYLE = "style"


class EpistemicStatus(str, Enum):
    ACTIVE = "active"
    INFERRED = "inferred"
    EXPLORATORY = "exploratory"
    SUPERSEDED = "superseded"


class ExpertiseDepth(str, Enum):
    LEARNING = "learning"
    WORKING = "working"
    DEEP = "deep"
    EXPERT = "expert"


class Lifecycle(str, Enum):
    """Derived, indexed state: only ``live`` beliefs are ever injected."""

    LIVE = "live"
    SUPERSEDED = "superseded"
    RESOLVED = "resolved"
    RETRACTED = "retracted"


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_belief_id() -> str:
    return f"b-{uuid.uuid4().hex}"


def _is_word_char(char: str) -> bool:
    """A letter or digit of any script, or a combining mark that belongs to one (Devanagari vowel
    signs, a decomposed accent NFKC could not compose)."""
    return char.isalnum() or unicodedata.category(char).startswith("M")


def _is_camel_boundary(before: str, after: str) -> bool:
    """``redisCache``, ``k8sCluster``, ``configuraciónRegional``: a lower-case letter or digit
    followed by an upper-case one starts a new word (any cased script, not only ASCII)."""
    return (before.islower() or before.isdigit()) and after.isupper()


def normalize_canonical_name(value: str) -> str:
    """``Redis Cache`` / ``redisCache`` / ``redis-cache`` -> ``redis_cache``; letters and digits of
    every script are kept: ``Überwachung`` -> ``überwachung``, ``テスト方針`` stays as written.

    NFKC first, so full-width ``ＡＰＩ`` is ``api`` and half-width katakana is full-width; then
    lower-case (not ``casefold``: ``ß`` stays ``ß`` as the user wrote it, the analyzers fold it to
    ``ss`` for matching); every run of anything that is not a letter, digit or mark becomes one
    ``_``. Pure-ASCII input gives exactly the form it always had.
    """
    text = unicodedata.normalize("NFKC", value).strip()
    pieces: list[str] = []
    for index, char in enumerate(text):
        if index and _is_camel_boundary(text[index - 1], char):
            pieces.append("_")
        pieces.append(char if _is_word_char(char) else "_")
    snake = "".join(pieces).lower()
    return _UNDERSCORE_RUNS.sub("_", snake).strip("_")


_UNDERSCORE_RUNS = re.compile(r"_+")


def normalize_relation_type(value: str | None) -> str | None:
    """A relation's type as a snake_case verb phrase (``Depends On`` / ``depends-on`` ->
    ``depends_on``), checked after normalising like a name; blank means none."""
    if value is None:
        return None
    kind = normalize_canonical_name(visible_text(value))
    if not kind:
        if value.strip():
            raise ValueError("relation_type must contain at least one letter or digit")
        return None
    if len(kind) > MAX_RELATION_TYPE_CHARS:
        raise ValueError(f"relation_type longer than {MAX_RELATION_TYPE_CHARS} characters once normalised")
    return kind


def normalize_alias(value: str) -> str:
    """Aliases are NFKC-normalised, lower-cased, trimmed and whitespace-collapsed; punctuation is
    kept because the analyzers turn ``react.js`` or ``allkeys-lru`` into their word forms
    themselves. CJK aliases are kept as written (``セッションストア``). Control, bidi-override and
    marker sequences go first (:func:`visible_text`), on every path that adds an alias: a NUL alias
    used to be stored through the alias routes, which do not rebuild the model."""
    return fold_alias(visible_text(value))


def fold_alias(value: str) -> str:
    """:func:`normalize_alias` of a text already free of what :func:`visible_text` drops: NFKC,
    lower case, white space collapsed (the stored-document check's cheaper half)."""
    return " ".join(unicodedata.normalize("NFKC", value).lower().split())


def normalize_aliases(values: list[str], *, cap: int | None = MAX_ALIASES) -> list[str]:
    out: list[str] = []
    for raw in values:
        alias = normalize_alias(raw)
        if alias and alias not in out:
            out.append(alias)
    if cap is not None and len(out) > cap:
        raise ValueError(f"at most {cap} aliases are allowed, got {len(out)}")
    return out


def content_fingerprint(content: str) -> str:
    """Hash of the normalised content: equal fingerprints mean the same stated fact. NFKC first
    (full-width ``Ｓｔｒｉｐｅ`` is ``stripe``), and for Japanese/Chinese the optional spaces around
    embedded words and a closing ``。`` do not count; ASCII text hashes as it always did."""
    normal = drop_optional_spaces(" ".join(unicodedata.normalize("NFKC", content).lower().split())).rstrip(".!。")
    return hashlib.sha256(normal.encode()).hexdigest()


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # 9999-12-31T23:59:59-05:00 is in year 10000 in UTC: a ValueError is pydantic's 422
        raise ValueError("date out of range once converted to UTC") from None


BeliefId = Annotated[str, Field(pattern=ID_RE.pattern)]
# an alias as the change log remembers it (normalised, so within the alias limit); the constraint
# also refuses an unpaired surrogate, which the store's JSON encoder cannot write
RemovedAlias = Annotated[str, Field(max_length=MAX_ALIAS_CHARS)]


class Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(None, max_length=200)
    turn_id: str | None = Field(None, max_length=200)
    source_model: str | None = Field(None, max_length=200)
    author: str | None = Field(None, max_length=200)
    extracted_at: datetime | None = None

    _utc = field_validator("extracted_at")(_as_utc)


class ChangeLogEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    changed_at: datetime
    trigger: str = Field(..., min_length=1, max_length=200)
    actor: str | None = Field(None, max_length=200)
    previous_content: str | None = Field(None, max_length=MAX_CONTENT_CHARS)
    previous_epistemic_status: EpistemicStatus | None = None
    previous_confidence: float | None = Field(None, ge=0.0, le=1.0)
    changed_by_session: str | None = Field(None, max_length=200)
    changed_by_turn: str | None = Field(None, max_length=200)
    note: str | None = Field(None, max_length=2000)
    # aliases a person took back (normalised): the memory loop never adds them again
    removed_aliases: list[RemovedAlias] | None = Field(None, max_length=MAX_REMOVED_ALIASES)

    _utc = field_validator("changed_at")(_as_utc)


ROLLOVER_TRIGGER = "change log rolled over"
_DROPPED = re.compile(r"^(\d+) ")


def roll_over(entries: list[ChangeLogEntry], *, cap: int = MAX_CHANGE_LOG) -> list[ChangeLogEntry]:
    """A busy belief's change log keeps its first entry (how it began), one marker saying how many
    entries were dropped in all, and the newest ones, ``cap`` entries at most: a change never fails
    because the log is full (it used to answer 500 at 200 entries, and extraction skipped the
    belief's reinforcements)."""
    if len(entries) <= cap:
        return entries
    first, rest = entries[0], entries[1:]
    dropped_before = 0
    if rest and rest[0].trigger == ROLLOVER_TRIGGER:
        marker, rest = rest[0], rest[1:]
        found = _DROPPED.match(marker.note or "")
        dropped_before = int(found.group(1)) if found else 0
    keep = cap - 2
    dropped = dropped_before + len(rest) - keep
    gone = ([marker] if dropped_before else []) + rest[: len(rest) - keep]
    marker = ChangeLogEntry(
        changed_at=rest[-keep - 1].changed_at if len(rest) > keep else first.changed_at,
        trigger=ROLLOVER_TRIGGER,
        actor="tenure",
        note=f"{dropped} entries between the first and the last {keep} dropped",
        removed_aliases=removed_in(gone)[-MAX_REMOVED_ALIASES:] or None,
    )
    return [first, marker, *rest[-keep:]]


def removed_in(entries: list[ChangeLogEntry]) -> list[str]:
    """The aliases the entries record as taken back, oldest first, each once (the rollover marker
    carries those of the entries it replaced, so none is forgotten)."""
    out: list[str] = []
    for entry in entries:
        for alias in entry.removed_aliases or ():
            if alias not in out:
                out.append(alias)
    return out


class Belief(BaseModel):
    """A stored belief. ``tenant_id`` always comes from the caller's credentials."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=False)

    id: BeliefId = Field(default_factory=new_belief_id, validation_alias=AliasChoices("id", "_id"))
    tenant_id: str = Field(..., min_length=1, max_length=128)
    owner_id: str = Field(..., min_length=1, max_length=128, validation_alias=AliasChoices("owner_id", "user_id"))
    type: BeliefType
    subtype: Subtype | None = None
    # Lengths are checked on the normalised value (NFKC can grow or shrink a string).
    canonical_name: str
    aliases: list[str] = Field(default_factory=list)
    content: str = Field(..., min_length=1, max_length=MAX_CONTENT_CHARS)
    why_it_matters: str = Field("", max_length=MAX_WHY_CHARS)
    scope: list[str] = Field(..., min_length=1)
    epistemic_status: EpistemicStatus = EpistemicStatus.ACTIVE
    confidence: float = Field(0.8, ge=0.0, le=1.0)
    pinned: bool = False
    user_edited: bool = False
    reinforcement_count: int = Field(0, ge=0, le=MAX_COUNT)
    last_reinforced_at: datetime | None = None
    supersedes: BeliefId | None = None
    superseded_by: BeliefId | None = None
    resolved_at: datetime | None = None
    retracted_at: datetime | None = None
    participants: list[BeliefId] = Field(default_factory=list, max_length=16)
    # what a relation says about its participants (`depends_on`, `uses`, `owned_by`, ...): the
    # paper author's later releases carry it; snake_cased like a name, relations only
    relation_type: str | None = None
    expertise_domain: str | None = Field(None, max_length=200)
    expertise_depth: ExpertiseDepth | None = None
    compaction_note: str | None = Field(None, max_length=2000)
    provenance: Provenance = Field(default_factory=Provenance)
    change_log: list[ChangeLogEntry] = Field(default_factory=list)  # rolled over past MAX_CHANGE_LOG
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    version: int = Field(1, ge=1, le=MAX_COUNT)

    @field_validator("canonical_name")
    @classmethod
    def _snake_case(cls, value: str) -> str:
        name = normalize_canonical_name(value)
        if not name:
            raise ValueError("canonical_name must contain at least one letter or digit")
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(f"canonical_name longer than {MAX_NAME_CHARS} characters once normalised")
        return name

    @field_validator("relation_type")
    @classmethod
    def _relation_type(cls, value: str | None) -> str | None:
        return normalize_relation_type(value)

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, values: list[str]) -> list[str]:
        for raw in values:
            alias = normalize_alias(raw)
            if len(alias) > MAX_ALIAS_CHARS:
                raise ValueError(f"alias longer than {MAX_ALIAS_CHARS} characters: {clip(alias, 40)!r}…")
        return normalize_aliases(values)

    @field_validator("scope")
    @classmethod
    def _scopes(cls, values: list[str]) -> list[str]:
        return scope_rules.normalize_scopes(values)

    @field_validator("content", "why_it_matters")
    @classmethod
    def _visible(cls, value: str, info: ValidationInfo) -> str:
        # Checked after normalisation: "   " or "\u3000\u2028" used to pass min_length and be
        # stored as "", which no later read could load.
        text = visible_text(value)
        if info.field_name == "content" and not text:
            raise ValueError("content must contain visible text, not only whitespace or control characters")
        return text

    @field_validator("change_log")
    @classmethod
    def _rolled_over(cls, entries: list[ChangeLogEntry]) -> list[ChangeLogEntry]:
        return roll_over(entries)

    @field_validator("aliases", mode="before")
    @classmethod
    def _visible_aliases(cls, values: Any) -> Any:
        """Control, bidi-override and marker sequences out before the aliases are normalised."""
        if isinstance(values, list):
            return [visible_text(v) if isinstance(v, str) else v for v in values]
        return values

    @field_validator("last_reinforced_at", "resolved_at", "retracted_at", "created_at", "updated_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _as_utc(value)

    @model_validator(mode="after")
    def _consistent(self) -> Belief:
        self.raise_if_inconsistent()
        return self

    def raise_if_inconsistent(self) -> None:
        """The model's cross-field rules (ValueError naming the first broken one); validation runs
        them, and so does a stored document decoded without validation (stored_belief.py)."""
        if self.subtype is not None and self.type is not BeliefType.PREFERENCE:
            raise ValueError("subtype (expertise | style) is only valid on preference beliefs")
        if self.participants and self.type is not BeliefType.RELATION:
            raise ValueError("participants are only valid on relation beliefs")
        if self.relation_type is not None and self.type is not BeliefType.RELATION:
            raise ValueError("relation_type is only valid on relation beliefs")
        if self.type is BeliefType.RELATION and len(self.participants) < 2:
            raise ValueError("a relation must link at least two participants (belief ids)")
        if self.resolved_at is not None and self.type is not BeliefType.OPEN_QUESTION:
            raise ValueError("resolved_at is only valid on open_question beliefs")
        if self.superseded_by is not None and self.epistemic_status is not EpistemicStatus.SUPERSEDED:
            raise ValueError("a belief with superseded_by must have epistemic_status 'superseded'")
        if self.id in self.participants:
            raise ValueError("a relation cannot link itself")

    @property
    def lifecycle(self) -> Lifecycle:
        if self.retracted_at is not None:
            return Lifecycle.RETRACTED
        if self.superseded_by is not None or self.epistemic_status is EpistemicStatus.SUPERSEDED:
            return Lifecycle.SUPERSEDED
        if self.resolved_at is not None:
            return Lifecycle.RESOLVED
        return Lifecycle.LIVE

    @property
    def is_live(self) -> bool:
        return self.lifecycle is Lifecycle.LIVE

    def removed_aliases(self) -> list[str]:
        """Aliases a person took back and has not given back since (an alias they add again
        through the API is theirs to add): extraction and the alias flywheel must not add them."""
        return [a for a in removed_in(self.change_log) if a not in self.aliases]

    def to_document(self) -> dict[str, Any]:
        """The OpenSearch source: the model plus derived, indexed fields."""
        doc = self.model_dump(mode="json")
        if doc["relation_type"] is None:
            # only relations that have one carry the field (beliefs template v3): every other
            # document keeps the shape an index of an older template accepts
            del doc["relation_type"]
        doc["lifecycle"] = self.lifecycle.value
        doc["content_hash"] = content_fingerprint(self.content)
        return doc

    @classmethod
    def from_document(cls, source: dict[str, Any]) -> Belief:
        """The belief of a stored source (derived, indexed-only fields are ignored)."""
        data = {k: v for k, v in source.items() if k not in _DERIVED_FIELDS}
        return cls.model_validate(data)

    @classmethod
    def from_record(cls, record: dict[str, Any], *, tenant_id: str) -> Belief:
        """Load an external record (the paper's seed format or our export). The tenant always
        comes from the caller, never from the record."""
        data = dict(record)
        data.pop("tenant_id", None)
        return cls.model_validate({**data, "tenant_id": tenant_id})
