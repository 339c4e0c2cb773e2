"""Stored belief documents decoded without re-running the model's validation when they need none.

Every document in the beliefs index was written through :class:`~service.domain.belief.Belief`, so
it is normally already in the model's normal form: names snake_cased, aliases and scopes
normalised, text cleaned, timestamps in UTC. Validating such a document again (``from_document``)
re-runs every normaliser and cost ~50 us per hit, a visible share of the API's CPU per recall
(issue 16). :func:`decode_stored` first checks, cheaply, that the document is exactly what the model
would produce from it: every key a field, every value of the field's type and within its limits,
every normalised field already a fixed point of its normaliser, the model's cross-field rules. Only
then does it build the belief without validation (``model_construct``), which gives the belief full
validation would (``tests/test_stored_belief.py`` compares the two over a generated corpus and
random damage). Anything else (a document written before a rule existed, a hand-edited one, a
change log, a shape it does not know) goes through full validation, which loads it or raises, so
an unloadable document is quarantined exactly as before (``service/storage/unreadable.py``).

The checks are sufficient conditions, never the rules themselves: a check that is too strict only
sends a document to the slow path; it must never pass one that full validation would change or
refuse. Printable ASCII text is recognised by a pattern; other text is compared with its
normaliser's output (the normaliser is the definition).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from service.domain import scopes as scope_rules
from service.domain.belief import (
    _DERIVED_FIELDS,
    ID_RE,
    MAX_ALIAS_CHARS,
    MAX_ALIASES,
    MAX_CONTENT_CHARS,
    MAX_COUNT,
    MAX_NAME_CHARS,
    MAX_RELATION_TYPE_CHARS,
    MAX_WHY_CHARS,
    Belief,
    BeliefType,
    EpistemicStatus,
    ExpertiseDepth,
    Provenance,
    Subtype,
    fold_alias,
    normalize_canonical_name,
    normalize_relation_type,
)
from service.domain.visible_text import visible_text
from service.interning import SharedValues

M = TypeVar("M", bound=BaseModel)

_FIELDS = frozenset(Belief.model_fields)
# without these the model would invent a value (a new id, the current time): never the stored one
_REQUIRED = frozenset(
    {"id", "tenant_id", "owner_id", "type", "canonical_name", "content", "scope", "created_at", "updated_at"}
)
# a snake_case ASCII name is its own normal form (normalize_canonical_name changes nothing)
_PLAIN_NAME = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
# printable ASCII without upper case, single inner spaces, no marker run: visible_text and
# normalize_alias change nothing
_PLAIN_ALIAS = re.compile(r"(?!.*(?:<<<|>>>))[!-@\[-~]+(?: [!-@\[-~]+)*")
# what visible_text removes or shortens (controls but newline and tab, invisible characters,
# marker runs); with no whitespace at either end, a text without these is its own visible form
_NOT_VISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b\u202a-\u202e\u2060\u2066-\u2069\ufeff]")
# the form Belief.to_document writes (pydantic's JSON form of a UTC datetime)
_UTC_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{6})?Z")


# what the model puts in a field the document does not have (model_construct would look each up
# through pydantic's default machinery, which inspects the factory's signature on every call)
_DEFAULTS: dict[str, Callable[[], Any]] = {
    name: field.default_factory or (lambda default=field.default: default)  # type: ignore[misc]
    for name, field in Belief.model_fields.items()
}


class _NeedsValidation(Exception):
    """The document is not provably in normal form: full validation decides."""


def decode_stored(source: dict[str, Any]) -> Belief:
    """The belief of a stored source: the same belief as :meth:`Belief.from_document`, and the
    same errors for a document that cannot load (it is the fallback)."""
    if type(source) is dict:
        try:
            return _construct(source)
        except Exception:  # noqa: S110 - any doubt (a check that refused, or raised): full validation decides
            pass
    return Belief.from_document(source)


def _construct(source: dict[str, Any]) -> Belief:
    keys = source.keys() - _DERIVED_FIELDS  # a new set: the belief's fields_set
    if not (_REQUIRED <= keys <= _FIELDS) or source.get("change_log"):
        raise _NeedsValidation  # unknown keys, a missing one, or a change log: full validation
    values = {name: check(source[name]) if name in keys else default() for name, check, default in _FIELD_RULES}
    belief = _unvalidated(Belief, values, _shared_fields_set(keys))
    belief.raise_if_inconsistent()  # the model's cross-field rules, on the constructed values
    return belief


def _unvalidated(model: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
    """What ``model.model_construct(fields_set, **values)`` builds from a value for every field,
    without its per-field alias and default look-ups (half the cost of a decode)."""
    instance = model.__new__(model)
    object.__setattr__(instance, "__dict__", values)
    object.__setattr__(instance, "__pydantic_fields_set__", fields_set)
    object.__setattr__(instance, "__pydantic_extra__", None)
    object.__setattr__(instance, "__pydantic_private__", None)
    return instance


# One fields set per distinct set of stored keys, shared by every model decoded with those keys
# (nearly all beliefs have the same keys). A set of its own for each of a belief and its
# provenance was ~40 % of what the API's paced collection walked: a recall keeps the beliefs it
# decoded (the decode and tier caches), and each set holds a reference per field
# (docs/benchmarks.md, "Paced collections, again"). Safe because the service never reads a
# fields set (no ``exclude_unset``, no ``model_fields_set``: tests/test_stored_belief.py checks)
# and pydantic's ``model_copy`` copies it before it changes it; a field assigned on a decoded
# model that its document lacked adds its name for all that share the set, which nothing reads.
# Documents of odd shapes beyond 256 key sets get a set of their own.
_SHARED_FIELDS_SETS: SharedValues[frozenset[str], set[str]] = SharedValues(256)


def _shared_fields_set(keys: AbstractSet[str]) -> set[str]:
    return _SHARED_FIELDS_SETS.get(frozenset(keys), set)


def _require(ok: bool) -> None:
    if not ok:
        raise _NeedsValidation


def _string(value: Any, *, min_chars: int = 0, max_chars: int | None = None) -> str:
    _require(type(value) is str and min_chars <= len(value) and (max_chars is None or len(value) <= max_chars))
    return str(value)


def _optional_string(max_chars: int | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value is None else _string(value, max_chars=max_chars)

    return check


def _member(enum: type[Enum]) -> Callable[[Any], Any]:
    by_value = {member.value: member for member in enum}

    def check(value: Any) -> Any:
        _require(type(value) is str and value in by_value)
        return by_value[value]

    return check


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else check(value)


def _visible(value: Any, *, min_chars: int, max_chars: int) -> str:
    text = _string(value, min_chars=min_chars, max_chars=max_chars)
    if text and _may_change_when_made_visible(text):
        _require(visible_text(text) == text)
    return text


def _may_change_when_made_visible(text: str) -> bool:
    return text[0].isspace() or text[-1].isspace() or "<<<" in text or ">>>" in text or bool(_NOT_VISIBLE.search(text))


def _id(value: Any) -> str:
    _require(type(value) is str and ID_RE.fullmatch(value) is not None)
    return str(value)


def _name(value: Any) -> str:
    name = _string(value, min_chars=1, max_chars=MAX_NAME_CHARS)
    _require(_PLAIN_NAME.fullmatch(name) is not None or normalize_canonical_name(name) == name)
    return name


def _aliases(value: Any) -> list[str]:
    _require(type(value) is list and len(value) <= MAX_ALIASES)
    for alias in value:
        _string(alias, min_chars=1, max_chars=MAX_ALIAS_CHARS)
    _require(len(set(value)) == len(value))
    for alias in value:
        if _PLAIN_ALIAS.fullmatch(alias) is None:
            _require(visible_text(alias) == alias and fold_alias(alias) == alias)
    return list(value)


def _scopes(value: Any) -> list[str]:
    _require(type(value) is list and 1 <= len(value) <= scope_rules.MAX_SCOPES)
    for label in value:
        # a label the pattern takes whole is lower case and trimmed: normalize_scope keeps it
        _require(type(label) is str and scope_rules.SCOPE_RE.fullmatch(label) is not None)
    _require(len(set(value)) == len(value))
    return list(value)


def _timestamp(value: Any) -> datetime:
    _require(type(value) is str and _UTC_TIMESTAMP.fullmatch(value) is not None)
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError as exc:  # a day or hour that does not exist
        raise _NeedsValidation from exc


def _fraction(value: Any) -> float:
    _require(type(value) is float and 0.0 <= value <= 1.0)
    return float(value)


def _count(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        _require(type(value) is int and minimum <= value <= MAX_COUNT)
        return int(value)

    return check


def _flag(value: Any) -> bool:
    _require(type(value) is bool)
    return bool(value)


def _participants(value: Any) -> list[str]:
    _require(type(value) is list and len(value) <= 16)
    return [_id(item) for item in value]


def _relation_type(value: Any) -> str | None:
    if value is None:
        return None
    kind = _string(value, min_chars=1, max_chars=MAX_RELATION_TYPE_CHARS)
    _require(_PLAIN_NAME.fullmatch(kind) is not None or normalize_relation_type(kind) == kind)
    return kind


def _provenance(value: Any) -> Provenance:
    _require(type(value) is dict)
    if value == _NO_PROVENANCE:  # most documents: nothing known, nothing to validate
        return _unvalidated(Provenance, dict(value), _shared_fields_set(value.keys()))
    try:
        return Provenance.model_validate(value)
    except ValidationError as exc:  # full validation reports it, with the field's path
        raise _NeedsValidation from exc


_NO_PROVENANCE = dict.fromkeys(Provenance.model_fields)


def _no_change_log(value: Any) -> list[Any]:
    _require(value == [])  # a non-empty log was sent to full validation already
    return []


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "id": _id,
    "tenant_id": lambda v: _string(v, min_chars=1, max_chars=128),
    "owner_id": lambda v: _string(v, min_chars=1, max_chars=128),
    "type": _member(BeliefType),
    "subtype": _optional(_member(Subtype)),
    "canonical_name": _name,
    "aliases": _aliases,
    "content": lambda v: _visible(v, min_chars=1, max_chars=MAX_CONTENT_CHARS),
    "why_it_matters": lambda v: _visible(v, min_chars=0, max_chars=MAX_WHY_CHARS),
    "scope": _scopes,
    "epistemic_status": _member(EpistemicStatus),
    "confidence": _fraction,
    "pinned": _flag,
    "user_edited": _flag,
    "reinforcement_count": _count(0),
    "last_reinforced_at": _optional(_timestamp),
    "supersedes": _optional(_id),
    "superseded_by": _optional(_id),
    "resolved_at": _optional(_timestamp),
    "retracted_at": _optional(_timestamp),
    "participants": _participants,
    "relation_type": _relation_type,
    "expertise_domain": _optional_string(200),
    "expertise_depth": _optional(_member(ExpertiseDepth)),
    "compaction_note": _optional_string(2000),
    "provenance": _provenance,
    "change_log": _no_change_log,
    "created_at": _timestamp,
    "updated_at": _timestamp,
    "version": _count(1),
}
if missing := _FIELDS - _CHECKS.keys():  # a new field needs its check here
    raise TypeError(f"stored_belief has no check for the Belief fields {sorted(missing)}")

# Each field's check and default in the model's order, looked up once here instead of per field
# of every decoded document.
_FIELD_RULES = tuple((name, _CHECKS[name], default) for name, default in _DEFAULTS.items())
