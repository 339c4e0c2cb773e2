"""The belief lifecycle: the only code that changes a belief's state and records it in the audit trail.

Create, import, supersede, merge a review proposal, merge (compaction), retire, reinforce, pin,
resolve, retract, add aliases and erase all live here, each writing its audit event under one
:class:`~service.domain.audit.AuditAction`. The API (:mod:`service.beliefs.api_service`),
extraction (:mod:`service.extraction.merge`), the alias flywheel, the review queue and compaction
call these methods; none of them writes a belief document or an audit action itself.

What the callers still own: authorization (which scopes a caller may write; the API checks grants,
extraction drops scopes without one) and their own rules for *when* to change a belief (the
paper's merge rules, compaction's plans). What this module owns: *how* a belief changes: every
write is a read-modify-write with optimistic concurrency that bumps ``version``, stamps
``updated_at``, appends a change-log entry and re-validates the whole belief.

Two kinds of callers, one code path, told apart by :attr:`Change.key`:

* a request (the API) has no key: a create over an existing id is a 409, events get fresh ids;
* a retried task (extraction, reviews, compaction) gives a key derived from its turn or plan: a
  create finding its own earlier write finishes it, and event ids derive from the key, so running
  the same step twice changes nothing twice (``AuditStore.append_once``).

Alias inheritance on supersede (one rule for the API, extraction and review resolution, paper §3.6):
the replacement keeps the caller's aliases first, then the old aliases, then the old canonical name
as a counter-signal alias *when the name changes*, spelled with spaces (``orm_choice`` ->
``orm choice``). Why this and not the API's former "always append the snake_case name": the name analyzer
indexes ``orm_choice`` and ``orm choice`` as the same terms (``tenure_whole_name``), so recall is
the same, but the spaced form is how people type it and how extraction, compaction and the
flywheel spell it, so it de-duplicates against an alias someone already gave instead of taking a
second of the 25 slots; and when the name does not change, the old name *is* the new canonical
name, so repeating it as an alias only burns a slot and double-counts a name match in scoring.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from service.auth.actor import Actor
from service.domain import scopes as scope_rules
from service.domain.audit import AuditAction
from service.domain.belief import (
    MAX_ALIASES,
    Belief,
    BeliefType,
    ChangeLogEntry,
    EpistemicStatus,
    Provenance,
    new_belief_id,
    normalize_alias,
    normalize_aliases,
    utcnow,
)
from service.domain.principal import Principal
from service.domain.text import clip
from service.errors import (
    Conflict,
    Forbidden,
    NotFound,
    StoreUnavailable,
    TenureError,
    Unreadable,
    ValidationFailed,
)
from service.outbox import RedisOutbox
from service.recall.cache import RenderCache
from service.recall.query import clean_query
from service.storage import beliefs as belief_storage
from service.storage import erasure
from service.storage import quarantine as quarantine_storage
from service.storage.audit import AuditEvent, AuditStore
from service.storage.beliefs import BeliefStore, Refresh, WriteResult
from service.storage.reviews import REVIEWS
from service.storage.turns import TURNS
from service.storage.unreadable import why_record_unreadable, why_unreadable

log = logging.getLogger(__name__)

MAX_RETRIES = 3
MAX_CHAIN = 200  # versions followed when erasing a supersession chain
MAX_HISTORY = 50  # versions a history read follows in each direction (each is one read)

_REVERSE = {"supersedes": "superseded_by", "superseded_by": "supersedes"}


def reciprocal(current: Belief, link: str, other: Belief) -> bool:
    """``other`` is the version ``current`` names through ``link`` (``supersedes`` or
    ``superseded_by``) *and* names ``current`` back, with the same owner. Only such links are a
    supersession chain: a link one side forged (an import naming a colleague's belief) is not
    followed by erase or history."""
    return (
        getattr(current, link) == other.id
        and getattr(other, _REVERSE[link]) == current.id
        and other.owner_id == current.owner_id
        and other.tenant_id == current.tenant_id
    )


def follow_chain(
    root: Belief, fetch: Callable[[str], Belief | None], *, limit: int
) -> tuple[list[Belief], list[Belief]]:
    """The versions before and after ``root`` (older first / newer last), following reciprocal
    links only, at most ``limit`` reads in each direction."""
    sides: dict[str, list[Belief]] = {"supersedes": [], "superseded_by": []}
    seen = {root.id}
    for link, found in sides.items():
        cursor = root
        while len(found) < limit:
            target = getattr(cursor, link)
            if not target or target in seen:
                break
            nxt = fetch(target)
            if nxt is None or not reciprocal(cursor, link, nxt):
                break
            seen.add(nxt.id)
            found.append(nxt)
            cursor = nxt
    return list(reversed(sides["supersedes"])), sides["superseded_by"]


# --------------------------------------------------------------------------- building blocks


def mutate(
    store: BeliefStore,
    principal: Principal,
    belief_id: str,
    change: Callable[[Belief], Belief],
    *,
    refresh: Refresh = "wait_for",
    tenant_wide: bool = False,
) -> Belief:
    """Read-modify-write with optimistic concurrency, retried on a concurrent change."""
    for attempt in range(MAX_RETRIES):
        current, seq_no, term = store.get_versioned(principal, belief_id, tenant_wide=tenant_wide)
        updated = change(current.model_copy(deep=True))
        updated = updated.model_copy(update={"version": current.version + 1, "updated_at": utcnow()})
        updated = revalidated(updated)
        try:
            store.replace(updated, if_seq_no=seq_no, if_primary_term=term, refresh=refresh)
            return updated
        except Conflict:
            if attempt == MAX_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def revalidated(changed: Belief) -> Belief:
    """The whole belief validated again after a change, as it will be stored (a change log past
    its cap is rolled over there). A change can break a rule only the whole belief checks (an alias
    NFKC-normalised past its length limit): that is the caller's invalid input, a 422."""
    try:
        return Belief.model_validate(changed.model_dump())
    except ValidationError as exc:
        raise ValidationFailed("the change makes the belief invalid", details=pydantic_details(exc, ("body",))) from exc


def merge_aliases(existing: list[str], new: list[str], *, cap: int = MAX_ALIASES) -> tuple[list[str], list[str]]:
    """Union within the cap. Returns (merged, dropped-for-cap)."""
    merged = list(existing)
    dropped: list[str] = []
    for alias in normalize_aliases(new, cap=None):
        if alias in merged:
            continue
        if len(merged) >= cap:
            dropped.append(alias)
        else:
            merged.append(alias)
    return merged, dropped


def without_removed(belief: Belief, aliases: list[str]) -> list[str]:
    """``aliases`` (normalised) less those a person took back from ``belief``."""
    removed = set(belief.removed_aliases())
    return [a for a in normalize_aliases(aliases, cap=None) if a not in removed]


def spoken_name(canonical_name: str) -> str:
    """A canonical name as an alias, the way people type it: ``orm_choice`` -> ``orm choice``."""
    return normalize_alias(canonical_name.replace("_", " "))


def inherited_aliases(old: Belief, new_name: str, given: list[str]) -> tuple[list[str], list[str]]:
    """The aliases of ``old``'s replacement (see the module docstring): the caller's, then the old
    aliases, then the old name as a counter-signal when the name changes. Returns (aliases,
    dropped-for-cap)."""
    counter_signal = [spoken_name(old.canonical_name)] if new_name != old.canonical_name else []
    return merge_aliases(normalize_aliases(given, cap=None), [*old.aliases, *counter_signal])


def unwritable_scopes(principal: Principal, labels: list[str], *, owner_id: str | None = None) -> list[str]:
    """The labels ``principal`` may not write: shared scopes without a grant and, for a belief of
    another owner (``owner_id``), that owner's personal scopes (``user:*``, ``domain:*``)."""
    return [
        s
        for s in labels
        if (scope_rules.is_shared(s) and s not in principal.shared_grants)
        or (owner_id is not None and owner_id != principal.user_id and scope_rules.is_personal(s))
    ]


def check_writable(principal: Principal, labels: list[str], *, owner_id: str | None = None) -> None:
    """Shared scopes need a grant; personal scopes are always the writer's own, so a change to
    another owner's belief (``owner_id``) that also carries that owner's personal scopes is
    refused: it would change what the owner's own sessions are given."""
    denied = unwritable_scopes(principal, labels, owner_id=owner_id)
    if not denied:
        return
    ungranted = [s for s in denied if scope_rules.is_shared(s)]
    theirs = [s for s in denied if not scope_rules.is_shared(s)]
    reasons = [f"no grant to write into {', '.join(ungranted)}"] if ungranted else []
    if theirs:
        reasons.append(f"{', '.join(theirs)}: {owner_id}'s personal scope, ask them to change it")
    raise Forbidden("; ".join(reasons), details={"scopes": denied})


def pydantic_details(exc: ValidationError, prefix: tuple[str | int, ...]) -> list[dict[str, Any]]:
    return [
        {"loc": [*prefix, *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in exc.errors(include_url=False)
    ]


def snapshot(belief: Belief | None) -> dict[str, Any] | None:
    """The payload copy kept in the audit trail (without the change log, which history has)."""
    if belief is None:
        return None
    return belief.model_dump(mode="json", exclude={"change_log"})


def _erasable_texts(belief: Belief) -> list[str]:
    """The statements an erase removes from every copy: content and why_it_matters, also as the
    change log kept them (earlier contents), each also as recall's query clean-up records it (a
    recall receipt keeps the cleaned query: a statement quoted in a question lost its numbers and
    punctuation there)."""
    earlier = [e.previous_content for e in belief.change_log if e.previous_content]
    statements = [t for t in (belief.content, belief.why_it_matters, *earlier) if t]
    return [*statements, *(clean_query(t).text for t in statements)]


def _raw_erasable_texts(source: dict[str, Any]) -> list[str]:
    """:func:`_erasable_texts` of a stored document the model cannot load: the same statements,
    read field by field from the raw source wherever they are strings."""
    log = source.get("change_log")
    entries = log if isinstance(log, list) else []
    earlier = [e.get("previous_content") for e in entries if isinstance(e, dict)]
    candidates = [source.get("content"), source.get("why_it_matters"), *earlier]
    statements = [t for t in candidates if isinstance(t, str) and t]
    return [*statements, *(clean_query(t).text for t in statements)]


# --------------------------------------------------------------------------- who and why


@dataclass(frozen=True)
class Change:
    """Who changes a belief and in which context.

    ``key`` is set by retried tasks only (see the module docstring). ``author`` names the change
    log's actor when it is not the principal's user (``compaction``). ``details`` are added to every
    audit event of the change (the extraction's ``turn_id``, a trigger)."""

    actor: Actor
    key: str | None = None
    turn_id: str | None = None
    author: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    at: datetime = field(default_factory=utcnow)

    @property
    def principal(self) -> Principal:
        return self.actor.principal

    def entry(
        self,
        trigger: str,
        *,
        previous: Belief | None = None,
        note: str | None = None,
        removed_aliases: list[str] | None = None,
    ) -> ChangeLogEntry:
        session = self.actor.session_id
        return ChangeLogEntry(
            changed_at=self.at,
            trigger=clip(trigger, 200),
            actor=self.author or self.principal.user_id,
            previous_content=previous.content if previous else None,
            previous_epistemic_status=previous.epistemic_status if previous else None,
            previous_confidence=previous.confidence if previous else None,
            changed_by_session=session[:200] if session else None,
            changed_by_turn=self.turn_id,
            note=clip(note, 2000) if note else None,
            removed_aliases=removed_aliases or None,
        )

    def logged(self, belief: Belief, trigger: str) -> bool:
        """This change (same turn) already wrote ``trigger`` into the belief's change log."""
        return self.turn_id is not None and any(
            e.changed_by_turn == self.turn_id and e.trigger == trigger for e in belief.change_log
        )


@dataclass(frozen=True)
class Replacement:
    """What a superseding version changes; everything unset is carried over from the old one."""

    content: str | None = None
    canonical_name: str | None = None
    aliases: list[str] = field(default_factory=list)
    why_it_matters: str | None = None
    confidence: float | None = None
    pinned: bool | None = None
    id: str | None = None
    reason: str | None = None
    trigger: str = "supersedes"
    provenance: Provenance | None = None
    reinforced_now: bool = False  # extraction: the statement that superseded it reinforces it


@dataclass(frozen=True)
class MergedProposal:
    """A review proposal merged into the belief it conflicts with (the review queue decides the
    content and why-it-matters; see :meth:`BeliefLifecycle.merge_proposal`)."""

    review_id: str
    content: str
    why_it_matters: str
    aliases: list[str]  # the proposal's aliases and, when it differs, its name as typed
    choices: dict[str, str] = field(default_factory=dict)  # where content/why came from, for the audit
    id: str | None = None  # a derived id for a keyed (retried) change


@dataclass(frozen=True)
class ErasureReceipt:
    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    erased_at: datetime
    text_copies_redacted: int = 0  # turns, reviews and audit events that held the erased text
    review_items_removed: int = 0  # conflicts and resolutions about an erased version
    expunged: bool = False  # deleted copies merged out of the segments as well


# Fields a replacement never inherits from the version it supersedes.
_NOT_INHERITED = {
    "id",
    "aliases",
    "content",
    "canonical_name",
    "change_log",
    "superseded_by",
    "created_at",
    "updated_at",
    "version",
    "reinforcement_count",
    "last_reinforced_at",
    "resolved_at",
    "retracted_at",
}


# --------------------------------------------------------------------------- the lifecycle


class BeliefLifecycle:
    def __init__(
        self,
        store: BeliefStore,
        audit: AuditStore,
        *,
        refresh: Refresh = "wait_for",
        render_cache: RenderCache | None = None,
        drain_receipts: Callable[[], None] | None = None,
        redact_outboxes: Callable[[str, list[str]], int] | None = None,
        audit_outbox: RedisOutbox[AuditEvent] | None = None,
    ):
        self.store = store
        self.audit = audit
        # where the events of a change already stored wait when the audit index refuses them: a
        # 503 then would lose them (the client's resend finds the ids taken and records nothing)
        self.audit_outbox = audit_outbox
        self.refresh: Refresh = refresh
        self.render_cache = render_cache
        # moves the injection receipts still waiting in the Redis outbox into the audit index
        # (service/recall/audit_trail.py), so every erase path redacts their query text too
        self.drain_receipts = drain_receipts
        # (tenant, texts) -> entries rewritten: the records still waiting in Redis outboxes
        # (service/storage/erasure.py redact_outboxes)
        self.redact_outboxes = redact_outboxes

    # ------------------------------------------------------------------ audit

    def record(
        self,
        change: Change,
        action: AuditAction,
        belief_ids: list[str],
        *,
        part: str = "",
        scopes: list[str] | None = None,
        before: Belief | dict[str, Any] | None = None,
        after: Belief | dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Append one audit event for ``change``. A keyed change gets an event id derived from its
        key (and ``part``, when one change records several events), recorded at most once."""
        event = self.event(change, action, belief_ids, scopes=scopes, before=before, after=after, details=details)
        if change.key is None:
            self._append([event])
            return
        raw = f"{change.principal.tenant_id}|{action.value}|{change.key}|{part}"
        event.event_id = f"ev-{hashlib.sha256(raw.encode()).hexdigest()[:32]}"
        self.audit.append_once(event)

    @staticmethod
    def event(
        change: Change,
        action: AuditAction,
        belief_ids: list[str],
        *,
        scopes: list[str] | None = None,
        before: Belief | dict[str, Any] | None = None,
        after: Belief | dict[str, Any] | None = None,
        details: dict[str, Any] | None = None,
    ) -> AuditEvent:
        actor = change.actor
        subject = after if isinstance(after, Belief) else before if isinstance(before, Belief) else None
        merged = {**change.details, **(details or {})}
        return AuditEvent(
            tenant_id=actor.principal.tenant_id,
            action=action.value,
            actor_id=actor.principal.user_id,
            actor_kind=actor.kind,
            credential_id=actor.credential_id,
            belief_ids=belief_ids,
            session_id=actor.session_id,
            request_id=actor.request_id,
            scopes=scopes if scopes is not None else (list(subject.scope) if subject else []),
            before=snapshot(before) if isinstance(before, Belief) else before,
            after=snapshot(after) if isinstance(after, Belief) else after,
            details=merged or None,
        )

    def _mutate(
        self,
        change: Change,
        belief_id: str,
        edit: Callable[[Belief], Belief],
        *,
        tenant_wide: bool = False,
    ) -> tuple[Belief, Belief]:
        """Apply ``edit`` under optimistic concurrency; returns (before, after) of the last try."""
        seen: list[Belief] = []

        def tracked(belief: Belief) -> Belief:
            seen.append(belief.model_copy(deep=True))
            return edit(belief)

        try:
            updated = mutate(
                self.store, change.principal, belief_id, tracked, refresh=self.refresh, tenant_wide=tenant_wide
            )
        except Conflict:
            self.bump_refused(change)
            raise
        return seen[-1], updated

    def bump_refused(self, change: Change) -> None:
        """Bump the tenant's write version for a change refused because its belief is already past
        it ("already retracted", "not live"): the refusal may answer the retry of a change whose
        own bump was lost (its process died, or Redis failed, between the write and the bump), and
        every cache keyed by the old version would otherwise serve the state before it until the
        tenant's next write. One bump too many costs a rebuild."""
        self.store.written([change.principal.tenant_id])

    # ------------------------------------------------------------------ create

    def create(
        self,
        change: Change,
        belief: Belief,
        *,
        action: AuditAction = AuditAction.BELIEF_CREATE,
        details: dict[str, Any] | None = None,
        tenant_wide: bool = False,
        part: str = "",
    ) -> bool:
        """Store a new belief and record it. True when written now; False when a keyed change finds
        its own earlier write (which must be visible to the principal, or it is not ours: 404)."""
        created = self._put_new(change, belief, tenant_wide=tenant_wide)
        # a keyed re-run re-records the event (same id): the earlier attempt may have died before it
        self.record(change, action, [belief.id], part=part, after=belief, details=details)
        return created

    def _put_new(self, change: Change, belief: Belief, *, tenant_wide: bool = False) -> bool:
        try:
            self.store.put(belief, create_only=True, refresh=self.refresh)
        except Conflict:
            if change.key is None:
                raise
            self.store.get(change.principal, belief.id, tenant_wide=tenant_wide)
            return False
        return True

    def import_many(
        self, change: Change, beliefs: list[Belief], *, details: dict[str, dict[str, Any]] | None = None
    ) -> WriteResult:
        """Bulk create (validated and authorized by the caller); an existing id fails only that
        record. One event per imported belief, with its payload copy, like any other create;
        ``details`` per belief id (an admin import that kept server-owned fields says which)."""
        result = self.store.put_many(beliefs, create_only=True, refresh=self.refresh)
        written = set(result.written)
        extra = details or {}
        events = [
            self.event(change, AuditAction.BELIEF_IMPORT, [b.id], after=b, details=extra.get(b.id))
            for b in beliefs
            if b.id in written
        ]
        self._append(events)
        return result

    def _append(self, events: list[AuditEvent]) -> None:
        """The events of a change already stored, into the audit index, or, when it cannot take
        them now, into the audit outbox (drained into the index before every audit read; a
        replay records nothing twice: events keep their ids)."""
        try:
            if len(events) == 1:
                self.audit.append(events[0])
            else:
                self.audit.append_many(events)
        except StoreUnavailable as exc:
            outbox = self.audit_outbox
            # all of the change's events or none: a part queued would reach the trail after the
            # 503, and the client's resend (finding every id taken) records nothing of the rest
            if outbox is None or not outbox.put_all_if_reachable(events):
                raise
            log.warning(
                "%d audit events wait in the outbox: the audit index refused them (%s)", len(events), exc.message
            )

    # ------------------------------------------------------------------ supersede, merge, retire

    def replacement_for(self, change: Change, old: Belief, spec: Replacement) -> Belief:
        """The version that supersedes ``old``: type, subtype, scope, pinned, provenance and the
        rest carried over, aliases inherited (:func:`inherited_aliases`)."""
        name = spec.canonical_name or old.canonical_name
        aliases, dropped = inherited_aliases(old, name, spec.aliases)
        notes = [n for n in (spec.reason, f"alias cap reached; dropped {dropped}" if dropped else None) if n]
        values = old.model_dump(exclude=_NOT_INHERITED)
        values.update(
            id=spec.id or new_belief_id(),
            canonical_name=name,
            aliases=aliases,
            content=spec.content or old.content,
            why_it_matters=spec.why_it_matters if spec.why_it_matters is not None else old.why_it_matters,
            confidence=spec.confidence if spec.confidence is not None else old.confidence,
            pinned=spec.pinned if spec.pinned is not None else old.pinned,
            epistemic_status=EpistemicStatus.ACTIVE,
            supersedes=old.id,
            last_reinforced_at=change.at if spec.reinforced_now else None,
            # aliases taken back from the old version stay taken back from the new one
            change_log=[
                change.entry(
                    f"{spec.trigger} belief {old.id}",
                    previous=old,
                    note="; ".join(notes) or None,
                    removed_aliases=[a for a in old.removed_aliases() if a not in aliases],
                )
            ],
        )
        if spec.provenance is not None:
            values["provenance"] = spec.provenance
        try:
            return Belief.model_validate(values)
        except ValidationError as exc:
            raise ValidationFailed("invalid replacement belief", details=pydantic_details(exc, ("body",))) from exc

    def supersede(
        self, change: Change, old: Belief, spec: Replacement, *, tenant_wide: bool = False
    ) -> tuple[Belief, Belief]:
        """A new version replaces ``old`` (which must be live): the new one is stored, the old one
        marked superseded and pointed at it. Returns (retired, new). If retiring fails, the new
        version written by this call is removed again."""
        before, retired, new = self._new_version(change, old, spec, tenant_wide=tenant_wide)
        self.record(
            change,
            AuditAction.BELIEF_SUPERSEDE,
            [old.id],
            part="retire",
            before=before,
            after=retired,
            details={"superseded_by": new.id},
        )
        self.record(
            change, AuditAction.BELIEF_CREATE, [new.id], part="create", after=new, details={"supersedes": old.id}
        )
        return retired, new

    def merge_proposal(
        self, change: Change, old: Belief, proposal: MergedProposal, *, tenant_wide: bool = False
    ) -> tuple[Belief, Belief]:
        """A review proposal merged into the live belief it conflicts with: a new version keeps
        the belief's name, type and scopes, takes the chosen content and why-it-matters, and
        gains the proposal's aliases after its own (the union, within the cap; the belief's own
        aliases win the slots). The old version stays in the chain, so the history keeps what was
        believed before. One ``belief.merge`` event names both versions. Returns (retired, new)."""
        aliases, dropped = merge_aliases(old.aliases, proposal.aliases)
        added = [a for a in aliases if a not in old.aliases]
        spec = Replacement(
            id=proposal.id,
            content=proposal.content,
            why_it_matters=proposal.why_it_matters,
            aliases=aliases,
            trigger=f"merged review {proposal.review_id} into",
            reason=f"alias cap {MAX_ALIASES} reached; dropped {dropped}" if dropped else None,
        )
        before, retired, new = self._new_version(change, old, spec, tenant_wide=tenant_wide)
        self.record(
            change,
            AuditAction.BELIEF_MERGE,
            [old.id, new.id],
            part="merge",
            before=before,
            after=new,
            details={
                "review_id": proposal.review_id,
                "merged_into": new.id,
                "aliases_added": added,
                "dropped_for_cap": dropped,
                **proposal.choices,
            },
        )
        return retired, new

    def _new_version(
        self, change: Change, old: Belief, spec: Replacement, *, tenant_wide: bool
    ) -> tuple[Belief, Belief, Belief]:
        """Store the version that replaces ``old`` and retire ``old``; returns (old before,
        old retired, new). If retiring fails, the new version written by this call is removed,
        unless the retirement took effect after all (its answer was lost)."""
        if not old.is_live and (spec.id is None or old.superseded_by != spec.id):
            self.bump_refused(change)
            raise Conflict(f"belief {old.id!r} is {old.lifecycle.value}; cannot supersede it")
        new = self.replacement_for(change, old, spec)
        created = self._put_new(change, new, tenant_wide=tenant_wide)
        try:
            before, retired = self.retire(change, old.id, new.id, note=spec.reason, tenant_wide=tenant_wide)
        except Exception:
            if created and self._surely_not_retired(change, old.id, new.id):
                belief_storage.delete_ids(self.store, change.principal, [new.id])  # undo the half-done write
            raise
        return before, retired, new

    def _surely_not_retired(self, change: Change, belief_id: str, successor_id: str) -> bool:
        """After a failed retire: True only when a real-time read shows ``belief_id`` is not
        superseded by ``successor_id``. A timed-out update may still have been applied; deleting the
        successor then would leave the old version pointing at nothing and both out of recall. When
        the read fails too, the successor is kept: a live duplicate is visible and mendable, a lost
        version is not."""
        try:
            successor = self.store.successor_now(change.principal.tenant_id, belief_id)
        except TenureError:
            return False
        return successor != successor_id

    def merge(self, change: Change, merged: Belief, sources: list[Belief], note: str) -> bool:
        """Compaction: ``merged`` (built by the caller from ``sources``) replaces them all. Each
        source is retired with the compaction note. True when ``merged`` was written now."""
        created = self._put_new(change, merged)
        for source in sources:
            self.retire(change, source.id, merged.id, note=note, compaction=True)
        if created:
            source_ids = sorted(b.id for b in sources)
            self.record(
                change,
                AuditAction.BELIEF_COMPACT,
                [merged.id, *source_ids],
                after=merged,
                details={"sources": source_ids, "note": note},
            )
        return created

    def retire(
        self,
        change: Change,
        belief_id: str,
        successor_id: str,
        *,
        note: str | None = None,
        compaction: bool = False,
        tenant_wide: bool = False,
    ) -> tuple[Belief, Belief]:
        """Mark a live belief superseded by ``successor_id`` (idempotent for the same successor);
        returns (before, after). ``compaction`` also stores ``note`` as its compaction note."""
        trigger = f"compaction: superseded by {successor_id}" if compaction else f"superseded by {successor_id}"

        def edit(belief: Belief) -> Belief:
            if belief.superseded_by == successor_id:
                return belief  # an earlier attempt of this change retired it
            if not belief.is_live:
                raise Conflict(f"belief {belief_id!r} was changed concurrently; it is no longer live")
            previous = belief.model_copy()
            belief.epistemic_status = EpistemicStatus.SUPERSEDED
            belief.superseded_by = successor_id
            if compaction and note:
                belief.compaction_note = clip(note, 2000)
            belief.change_log.append(change.entry(trigger, previous=previous, note=note))
            return belief

        return self._mutate(change, belief_id, edit, tenant_wide=tenant_wide)

    # ------------------------------------------------------------------ reinforce, aliases

    def reinforce(
        self,
        change: Change,
        belief_id: str,
        aliases: list[str],
        *,
        trigger: str = "reinforced",
        promote: Callable[[Belief, datetime], bool] | None = None,
        keep_removed_out: bool = False,
    ) -> Belief:
        """One more statement of a live belief (plus aliases). A change with a turn reinforces at
        most once per turn; ``promote`` decides whether an inferred belief becomes active;
        ``keep_removed_out`` (the memory loop) leaves out aliases a person took back."""
        promoted: list[bool] = []

        def edit(belief: Belief) -> Belief:
            if not belief.is_live:
                raise Conflict(f"belief {belief_id!r} is {belief.lifecycle.value}; cannot reinforce it")
            wanted = without_removed(belief, aliases) if keep_removed_out else aliases
            belief.aliases, dropped = merge_aliases(belief.aliases, wanted)
            if change.logged(belief, trigger):
                return belief
            belief.reinforcement_count += 1
            belief.last_reinforced_at = change.at
            belief.change_log.append(
                change.entry(trigger, note=f"alias cap reached; dropped {dropped}" if dropped else None)
            )
            if (
                promote is not None
                and belief.epistemic_status is EpistemicStatus.INFERRED
                and promote(belief, change.at)
            ):
                previous = belief.model_copy()
                belief.epistemic_status = EpistemicStatus.ACTIVE
                belief.change_log.append(change.entry("promoted: inferred -> active", previous=previous))
                promoted.append(True)
            return belief

        before, updated = self._mutate(change, belief_id, edit)
        details = {"promoted": True} if promoted else None
        self.record(change, AuditAction.BELIEF_REINFORCE, [belief_id], before=before, after=updated, details=details)
        return updated

    def add_aliases(
        self,
        change: Change,
        belief_id: str,
        aliases: list[str],
        *,
        trigger: str = "aliases added",
        tenant_wide: bool = False,
        keep_removed_out: bool = False,
    ) -> tuple[Belief, list[str], list[str]]:
        """Add aliases within the cap. Returns the belief, the aliases actually added and those
        dropped for the cap; the change log and the audit trail record only a change that added or
        dropped something. ``keep_removed_out`` (the memory loop) leaves out aliases a person
        took back (:meth:`Belief.removed_aliases`); a person adding one again is not refused."""
        if not normalize_aliases(aliases, cap=None):
            raise ValidationFailed("no aliases given (an alias needs visible text)")
        added: list[str] = []
        dropped: list[str] = []

        def edit(belief: Belief) -> Belief:
            wanted = without_removed(belief, aliases) if keep_removed_out else aliases
            merged, cut = merge_aliases(belief.aliases, wanted)
            added[:] = [a for a in merged if a not in belief.aliases]
            dropped[:] = cut
            if added or cut:
                belief.aliases = merged
                note = f"alias cap {MAX_ALIASES} reached; dropped {cut}" if cut else None
                belief.change_log.append(change.entry(trigger, note=note))
            return belief

        before, updated = self._mutate(change, belief_id, edit, tenant_wide=tenant_wide)
        if added or dropped:
            self.record(
                change,
                AuditAction.BELIEF_ADD_ALIASES,
                [belief_id],
                before=before,
                after=updated,
                details={"added": added, "dropped_for_cap": dropped, "trigger": trigger},
            )
        return updated, added, dropped

    def remove_aliases(self, change: Change, belief_id: str, aliases: list[str]) -> tuple[Belief, list[str]]:
        """Take back aliases (a wrong alias makes a belief surface where it should not). Every
        given alias must be one of the belief's, compared in normalised form, or nothing changes
        (422 naming the others). Returns the belief and the aliases removed; logged and audited."""
        wanted = normalize_aliases(aliases, cap=None)
        if not wanted:
            raise ValidationFailed("no aliases given")
        removed: list[str] = []

        def edit(belief: Belief) -> Belief:
            unknown = [a for a in wanted if a not in belief.aliases]
            if unknown:
                raise ValidationFailed(
                    f"not aliases of this belief: {', '.join(unknown)}",
                    details=[{"loc": ["body", "aliases"], "msg": "not an alias of this belief", "input": unknown}],
                )
            removed[:] = wanted
            belief.aliases = [a for a in belief.aliases if a not in wanted]
            belief.change_log.append(change.entry("aliases removed", note=", ".join(wanted), removed_aliases=wanted))
            return belief

        before, updated = self._mutate(change, belief_id, edit)
        self.record(
            change,
            AuditAction.BELIEF_REMOVE_ALIASES,
            [belief_id],
            before=before,
            after=updated,
            details={"removed": removed},
        )
        return updated, removed

    # ------------------------------------------------------------------ pin, resolve, retract

    def set_pinned(self, change: Change, belief_id: str, pinned: bool) -> Belief:
        def edit(belief: Belief) -> Belief:
            belief.pinned = pinned
            # an explicit pin/unpin by its owner is the user's edit (the cross-scope pinned rule: the
            # owner's user-edited pinned beliefs reach all of the owner's sessions); a colleague's
            # pin of a shared belief is not the owner's edit
            if change.principal.user_id == belief.owner_id:
                belief.user_edited = True
            belief.change_log.append(change.entry("pinned" if pinned else "unpinned"))
            return belief

        before, updated = self._mutate(change, belief_id, edit)
        action = AuditAction.BELIEF_PIN if pinned else AuditAction.BELIEF_UNPIN
        self.record(change, action, [belief_id], before=before, after=updated)
        return updated

    def resolve(
        self,
        change: Change,
        belief_id: str,
        *,
        note: str | None = None,
        resolved_by: str | None = None,
        trigger: str | None = None,
        if_open: bool = False,
    ) -> Belief | None:
        """Close an open question. Resolving a resolved one is a 409, or, with ``if_open``,
        nothing (None). ``resolved_by`` must be a belief the principal can see (404 otherwise)."""
        if resolved_by is not None:
            self.store.get(change.principal, resolved_by)
        closed: list[bool] = []

        def edit(belief: Belief) -> Belief:
            if belief.type is not BeliefType.OPEN_QUESTION:
                raise ValidationFailed(f"belief {belief_id!r} is a {belief.type.value}, not an open question")
            if belief.resolved_at is not None:
                if if_open:
                    return belief
                raise Conflict(f"open question {belief_id!r} is already resolved")
            belief.resolved_at = change.at
            detail = trigger or (f"resolved by {resolved_by}" if resolved_by else "resolved")
            belief.change_log.append(change.entry(detail, note=note))
            closed.append(True)
            return belief

        before, updated = self._mutate(change, belief_id, edit)
        if not closed:
            return None
        self.record(change, AuditAction.BELIEF_RESOLVE, [belief_id], before=before, after=updated)
        return updated

    def retract(self, change: Change, belief_id: str, reason: str | None) -> Belief:
        def edit(belief: Belief) -> Belief:
            if belief.retracted_at is not None:
                raise Conflict(f"belief {belief_id!r} is already retracted")
            belief.retracted_at = change.at
            belief.change_log.append(change.entry("retracted", note=reason))
            return belief

        before, updated = self._mutate(change, belief_id, edit)
        self.record(change, AuditAction.BELIEF_RETRACT, [belief_id], before=before, after=updated)
        return updated

    # ------------------------------------------------------------------ erase

    def erase(self, change: Change, belief_id: str, *, expunge: bool = False) -> ErasureReceipt:
        """Admin hard delete of a belief and its whole supersession chain, the audit payload copies
        of those versions, every copy of their text in the namespace's turns, reviews and audit
        events (redacted), and the tenant's cached renderings; with ``expunge`` the deleted copies
        are merged out of the segments too. The erase itself is audited by id."""
        principal = change.principal
        if not principal.is_admin:
            raise Forbidden("erasing beliefs needs the admin role")
        try:
            root = self._maybe_get(principal, belief_id)
        except Unreadable:
            return self.erase_unreadable(change, belief_id, expunge=expunge)  # quarantined: by id alone
        if root is None:
            # maybe the retry of an erase cut off after its beliefs were deleted (the sweep of the
            # cached renderings or the bump failed): nothing is left to find, but the cached
            # renderings may still hold the erased names, so they are swept again before the 404
            self.store.written([principal.tenant_id])
            self._sweep_renderings(principal)
            raise NotFound(f"belief {belief_id!r} not found")
        versions = self.with_compaction_relatives(principal, self.chain(principal, root))
        ids = [b.id for b in versions]
        # the copies first, the beliefs last: an erase that fails part-way (a timeout, Redis down)
        # leaves the root in place, so the admin's retry finds it and redoes every step (each is
        # idempotent); deleted first, the copies' texts would be known to nothing any more
        self._drain_receipts()
        texts = [t for b in versions for t in _erasable_texts(b)]
        payloads, reviews, redacted = self._erase_copies(principal, ids, texts)
        removed = belief_storage.delete_ids(self.store, principal, ids)
        cached = self._sweep_renderings(principal)
        if expunge:
            erasure.expunge_deletes(self.store.client, [self.store.alias, self.store.logs.alias, *self._copy_aliases()])
        receipt = ErasureReceipt(
            belief_id=belief_id,
            belief_versions_removed=removed,
            audit_payload_copies_removed=payloads,
            cached_renderings_removed=cached,
            erased_at=utcnow(),
            text_copies_redacted=redacted,
            review_items_removed=reviews,
            expunged=expunge,
        )
        self.record(
            change,
            AuditAction.BELIEF_ERASE,
            removed,
            details={
                "audit_payload_copies_removed": payloads,
                "cached_renderings_removed": cached,
                "text_copies_redacted": redacted,
                "review_items_removed": reviews,
                "expunged": expunge,
            },
        )
        return receipt

    def _erase_copies(self, principal: Principal, belief_ids: list[str], texts: list[str]) -> tuple[int, int, int]:
        """Every copy of erased beliefs outside their own documents: the audit payload copies, the
        review items about them, and their texts wherever the namespace kept one. Returns
        (payload copies, review items, documents redacted)."""
        payloads = self.audit.erase_payloads(principal, belief_ids)
        reviews = erasure.remove_reviews_about(
            self.store.client, REVIEWS.alias(self.store.namespace), principal, belief_ids
        )
        # Redis first: a record drained from there after the index was redacted would bring the
        # text back into it
        waiting = self.redact_outboxes(principal.tenant_id, texts) if self.redact_outboxes else 0
        redacted = erasure.redact(self.store.client, self._copy_aliases(), principal, texts)
        return payloads, reviews, redacted + waiting

    def _sweep_renderings(self, principal: Principal) -> int:
        """Drop the tenant's cached renderings (the shared vocabulary holds names and aliases)."""
        return self.render_cache.invalidate_tenant(principal.tenant_id) if self.render_cache else 0

    def _drain_receipts(self) -> None:
        """Pending injection receipts into the audit index before an erase redacts it: a receipt
        left in the Redis outbox would land there later with the erased text in its query. Fails
        the erase (StoreUnavailable) when they cannot be moved."""
        if self.drain_receipts is not None:
            self.drain_receipts()

    def _copy_aliases(self) -> list[str]:
        """The indices that keep copies of belief text: turns, the review queue, the audit trail."""
        ns = self.store.namespace
        return [TURNS.alias(ns), REVIEWS.alias(ns), self.audit.alias]

    def erase_unreadable(self, change: Change, belief_id: str, *, expunge: bool = False) -> ErasureReceipt:
        """Admin hard delete of a stored document the model cannot load (quarantined), by id and
        without loading it: the document, the audit payload copies naming it, the review items about
        it, every copy of its text (its statements read from the raw source) in the turns, reviews
        and audit events, and the tenant's cached renderings, like :meth:`erase` (no chain: links of
        a document that cannot be loaded are not followed). A belief that loads is refused (409)."""
        principal = change.principal
        if not principal.is_admin:
            raise Forbidden("erasing beliefs needs the admin role")
        source = belief_storage.raw_source(self.store, principal, belief_id)
        if source is None:
            raise NotFound(f"belief {belief_id!r} not found")
        reason = why_unreadable(source)
        if reason is None:
            raise Conflict(f"belief {belief_id!r} loads fine: erase it with DELETE /v1/beliefs/{belief_id}")
        self._drain_receipts()  # copies first, the document last, as in erase
        payloads, reviews, redacted = self._erase_copies(principal, [belief_id], _raw_erasable_texts(source))
        removed = belief_storage.delete_ids(self.store, principal, [belief_id])
        cached = self._sweep_renderings(principal)
        if expunge:
            erasure.expunge_deletes(self.store.client, [self.store.alias, self.store.logs.alias, *self._copy_aliases()])
        self.record(
            change,
            AuditAction.BELIEF_QUARANTINE_ERASE,
            removed,
            details={
                "reason": reason,
                "audit_payload_copies_removed": payloads,
                "cached_renderings_removed": cached,
                "text_copies_redacted": redacted,
                "review_items_removed": reviews,
                "expunged": expunge,
            },
        )
        return ErasureReceipt(
            belief_id=belief_id,
            belief_versions_removed=removed,
            audit_payload_copies_removed=payloads,
            cached_renderings_removed=cached,
            erased_at=utcnow(),
            text_copies_redacted=redacted,
            review_items_removed=reviews,
            expunged=expunge,
        )

    def erase_unreadable_record(self, change: Change, shelf: quarantine_storage.Shelf, record_id: str) -> None:
        """Admin hard delete of a stored turn, review item or audit event the model cannot load,
        by id and without loading it; the erase is audited with the kind, id and reason. A record
        that loads is refused (409): it is not the quarantine's to erase."""
        principal = change.principal
        if not principal.is_admin:
            raise Forbidden("the quarantine needs the admin role")
        ns = self.store.namespace
        source = quarantine_storage.raw_source(self.store.client, ns, shelf, principal, record_id)
        if source is None:
            raise NotFound(f"{shelf.kind.name} record {record_id!r} not found")
        reason = why_record_unreadable(shelf.kind, source)
        if reason is None:
            raise Conflict(f"{shelf.kind.name} record {record_id!r} loads fine: it is not quarantined")
        if not quarantine_storage.delete(self.store.client, ns, shelf, principal, record_id):
            raise NotFound(f"{shelf.kind.name} record {record_id!r} not found")
        details = {"kind": shelf.kind.name, "record_id": record_id, "reason": reason}
        self.record(change, AuditAction.RECORD_QUARANTINE_ERASE, [], details=details)

    def chain(self, principal: Principal, root: Belief) -> list[Belief]:
        """``root`` and every version linked to it through *reciprocal* supersedes/superseded_by
        links of the same owner (tenant-wide): a one-sided link never widens an erase."""
        older, newer = follow_chain(root, lambda bid: self._linked(principal, bid), limit=MAX_CHAIN)
        return [root, *reversed(older), *newer]

    def with_compaction_relatives(self, principal: Principal, versions: list[Belief]) -> list[Belief]:
        """``versions`` (a chain) and, each with its own chain, every belief a compaction merged
        into one of them and every merged belief one of them was retired into, for an erase. A
        merged belief names only the source it kept (``supersedes``), yet the others hold the
        statements it merged (an exact duplicate, the very text), and it holds theirs. A relative
        counts when it has the owner and a compaction note, as only a compaction (or that owner)
        writes one; at most MAX_CHAIN versions in all."""
        owner = versions[0].owner_id
        found = {b.id: b for b in versions}
        todo = list(versions)
        while todo and len(found) < MAX_CHAIN:
            relatives = [r for r in self._compaction_relatives(principal, todo) if r.owner_id == owner]
            todo = []
            for relative in relatives:
                for version in self.chain(principal, relative) if relative.id not in found else []:
                    if version.id not in found and len(found) < MAX_CHAIN:
                        found[version.id] = version
                        todo.append(version)
        return list(found.values())

    def _compaction_relatives(self, principal: Principal, versions: list[Belief]) -> list[Belief]:
        """The sources merged into the compaction-made beliefs among ``versions``, and the merged
        beliefs the compaction-retired ones among them point at."""
        noted = [b for b in versions if b.compaction_note]
        sources = self.store.merged_into(principal, [b.id for b in noted], limit=MAX_CHAIN)
        products = [self._linked(principal, b.superseded_by) for b in noted if b.superseded_by]
        return [*sources, *(p for p in products if p is not None and p.compaction_note)]

    def chain_ids(self, principal: Principal, root: Belief) -> list[str]:
        return [b.id for b in self.chain(principal, root)]

    def _linked(self, principal: Principal, belief_id: str) -> Belief | None:
        """A linked version, or None when it is missing or cannot be loaded (the chain ends)."""
        try:
            return self._maybe_get(principal, belief_id)
        except Unreadable:
            return None

    def _maybe_get(self, principal: Principal, belief_id: str) -> Belief | None:
        try:
            return self.store.get(principal, belief_id, tenant_wide=True)
        except NotFound:
            return None
