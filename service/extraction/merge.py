"""The merge rules on write (paper §4.5): how a validated sidecar changes the belief store.

Order within one payload: belief_updates -> entity_updates -> new_beliefs -> new_open_questions ->
resolved_open_questions (alias candidates go to the flywheel task, style signals are counted only).

Conservative by construction: content is never overwritten silently. A name/alias match with the
same content reinforces (and adds aliases); with different content it goes to the review queue;
only an explicit ``superseded`` update replaces a belief, and then as a new version that inherits
the old aliases plus the old canonical name as counter-signals. A user-edited or pinned belief
is never superseded by extraction (that becomes a conflict for review too).

The author's turn changes only what the author's API call could: a belief that also lives in a
shared scope they hold no grant to, or in its (other) owner's personal scopes, is not superseded,
re-aliased or resolved by it (review items instead, or a skipped question); a plain reinforcement
still counts.

Idempotent per turn: new ids, review ids and audit ids are derived from ``(tenant, turn, item)``,
and a reinforcement already logged for the turn is not applied again, so re-running a turn's
extraction after a crash or a redelivery changes nothing twice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from service.auth.actor import Actor
from service.beliefs.lifecycle import BeliefLifecycle, Change, Replacement, snapshot, unwritable_scopes
from service.config import MemoryLoopSettings
from service.domain import scopes as scope_rules
from service.domain.audit import AuditAction
from service.domain.belief import (
    MAX_ALIASES,
    Belief,
    BeliefType,
    ChangeLogEntry,
    Provenance,
    content_fingerprint,
    normalize_aliases,
    utcnow,
)
from service.domain.principal import Principal
from service.errors import Conflict, NotFound, ValidationFailed
from service.extraction.validator import (
    BeliefUpdate,
    EntityUpdate,
    NewBelief,
    NewOpenQuestion,
    ValidatedSidecar,
)
from service.storage.beliefs import Refresh
from service.storage.lookup import BeliefLookup
from service.storage.reviews import ReviewItem, ReviewKind, ReviewStore
from service.telemetry import metrics

OPEN_QUESTION_CONFIDENCE = 0.7
# Belief writes by extraction are made visible at once: a later item of the same payload may read
# the belief again (optimistic concurrency reads by search), and the very next turn must recall it.
REFRESH: Refresh = "true"
TRIGGER_REINFORCED = "reinforced (extraction)"


@dataclass(frozen=True)
class MergeContext:
    principal: Principal
    session_id: str
    turn_id: str
    source_model: str | None
    session_scopes: list[str]
    now: datetime = field(default_factory=utcnow)
    actor_kind: str = "memory_loop"

    def derived_id(self, prefix: str, *parts: str) -> str:
        raw = "|".join((self.principal.tenant_id, self.turn_id, *parts))
        return f"{prefix}-{hashlib.sha256(raw.encode()).hexdigest()[:24]}"

    def provenance(self) -> Provenance:
        return Provenance(
            session_id=self.session_id[:200],
            turn_id=self.turn_id,
            source_model=(self.source_model or "")[:200] or None,
            author=self.principal.user_id,
            extracted_at=self.now,
        )

    def change(self, key: str) -> Change:
        """One step of this turn's merge, keyed so that a re-run of the turn repeats nothing."""
        actor = Actor(principal=self.principal, kind=self.actor_kind, session_id=self.session_id)
        return Change(
            actor=actor,
            key=f"{self.turn_id}|{key}",
            turn_id=self.turn_id,
            details={"turn_id": self.turn_id},
            at=self.now,
        )

    def log(self, trigger: str, previous: Belief | None = None, note: str | None = None) -> ChangeLogEntry:
        return ChangeLogEntry(
            changed_at=self.now,
            trigger=trigger,
            actor=self.principal.user_id,
            previous_content=previous.content if previous else None,
            previous_epistemic_status=previous.epistemic_status if previous else None,
            previous_confidence=previous.confidence if previous else None,
            changed_by_session=self.session_id[:200],
            changed_by_turn=self.turn_id,
            note=note,
        )


@dataclass(frozen=True)
class Op:
    section: str
    index: int | None
    outcome: str
    belief_id: str | None = None
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class MergeReport:
    ops: list[Op] = field(default_factory=list)

    def add(self, op: Op) -> Op:
        self.ops.append(op)
        metrics.MERGE_DECISIONS.labels(op.section, op.outcome).inc()
        return op

    def count(self, outcome: str) -> int:
        return sum(op.outcome == outcome for op in self.ops)

    def as_dict(self) -> dict[str, Any]:
        return {"ops": [op.as_dict() for op in self.ops]}


class BeliefMerger:
    def __init__(self, lifecycle: BeliefLifecycle, reviews: ReviewStore, policy: MemoryLoopSettings):
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.lookup = BeliefLookup(lifecycle.store)
        self.reviews = reviews
        self.policy = policy

    # ------------------------------------------------------------------ entry point

    def apply(self, ctx: MergeContext, sidecar: ValidatedSidecar) -> MergeReport:
        report = MergeReport()
        if not sidecar.accepted:
            return report
        for i, upd in enumerate(sidecar.belief_updates):
            report.add(self._guard("belief_updates", i, lambda u=upd, i=i: self.belief_update(ctx, u, i)))
        for i, ent in enumerate(sidecar.entity_updates):
            report.add(self._guard("entity_updates", i, lambda e=ent, i=i: self.entity_update(ctx, e, i)))
        for i, nb in enumerate(sidecar.new_beliefs):
            report.add(self._guard("new_beliefs", i, lambda n=nb, i=i: self.new_belief(ctx, n, i)))
        for i, q in enumerate(sidecar.new_open_questions):
            report.add(self._guard("new_open_questions", i, lambda q=q, i=i: self.open_question(ctx, q, i)))
        for i, qid in enumerate(sidecar.resolved_open_questions):
            report.add(
                self._guard(
                    "resolved_open_questions",
                    i,
                    lambda q=qid, i=i: self.resolve_question(ctx, q, i),
                )
            )
        return report

    @staticmethod
    def _guard(section: str, index: int, run: Any) -> Op:
        """One item's failure to apply is recorded and never stops the others."""
        try:
            op: Op = run()
            return op
        except NotFound as exc:
            return Op(section, index, "not_found", detail=exc.message)
        except ValidationFailed as exc:
            return Op(section, index, "skipped", detail=exc.message[:300])
        except (ValueError, Conflict) as exc:
            return Op(section, index, "skipped", detail=str(exc)[:300])

    # ------------------------------------------------------------------ rules

    def new_belief(self, ctx: MergeContext, nb: NewBelief, index: int) -> Op:
        scopes, dropped = self._scopes(ctx, nb.scope)
        if not scopes:
            return Op(
                "new_beliefs",
                index,
                "skipped",
                detail="no usable scope " + (f"(dropped {dropped})" if dropped else "(session has none)"),
            )
        # the same name in another project (or domain) is another belief: only what a session in
        # the new belief's scopes sees is the same one
        matches = self.lookup.by_name_or_alias(ctx.principal, nb.canonical_name, scopes=scopes)
        if not matches:
            if nb.confidence < self.policy.min_insert_confidence:
                return Op(
                    "new_beliefs",
                    index,
                    "skipped_low_confidence",
                    detail=f"confidence {nb.confidence} < {self.policy.min_insert_confidence}",
                )
            belief_id = self._insert(ctx, nb, scopes, index)
            left_open = self._close_question(ctx, nb.resolves_open_question)[1] if nb.resolves_open_question else None
            return Op("new_beliefs", index, "inserted", belief_id, left_open)
        own_id = ctx.derived_id("b", "new", nb.canonical_name)
        fingerprint = content_fingerprint(nb.content)
        if any(m.id == own_id and content_fingerprint(m.content) == fingerprint for m in matches):
            # Inserted by an earlier attempt of this very turn (the worker died after the write,
            # or the task was redelivered), or by an earlier item of it stating the same: finish
            # that insert, which is idempotent, instead of letting the turn reinforce the belief
            # it created. An item stating something else under that name is a conflict below.
            belief_id = self._insert(ctx, nb, scopes, index)
            left_open = self._close_question(ctx, nb.resolves_open_question)[1] if nb.resolves_open_question else None
            return Op("new_beliefs", index, "inserted", belief_id, left_open)
        existing = matches[0]
        if content_fingerprint(existing.content) == fingerprint:
            denied = unwritable_scopes(ctx.principal, existing.scope, owner_id=existing.owner_id)
            if denied:
                # one more statement of it is counted (no text of the author's enters the belief),
                # but its new aliases would pull it into turns of scopes the author may not write
                updated = self._reinforce(ctx, existing.id, [])
                queued = self._propose_aliases(ctx, existing, nb.aliases, denied, "new belief")
                return Op("new_beliefs", index, "reinforced", updated.id, _not_added(denied, queued))
            updated = self._reinforce(ctx, existing.id, nb.aliases)
            return Op("new_beliefs", index, "reinforced", updated.id)
        margin = abs(existing.confidence - nb.confidence)
        paper_outcome = (
            "flagged_conflict" if margin < self.policy.conflict_confidence_margin else "insufficient_without_supersede"
        )
        review_id = self._queue_conflict(
            ctx,
            existing,
            key=f"new:{index}:{nb.canonical_name}",
            reason="a belief with this name or alias exists with different content",
            paper_outcome=paper_outcome,
            proposed=_proposed(nb, scopes),
        )
        return Op("new_beliefs", index, "conflict_queued", existing.id, detail=review_id)

    def belief_update(self, ctx: MergeContext, upd: BeliefUpdate, index: int) -> Op:
        target = self.store.get(ctx.principal, upd.belief_id)
        if not target.is_live:
            return Op(
                "belief_updates",
                index,
                "skipped",
                target.id,
                detail=f"belief is {target.lifecycle.value}",
            )
        if upd.change == "reinforced":
            self._reinforce(ctx, target.id, [])
            return Op("belief_updates", index, "reinforced", target.id)
        # the author sees the belief through one grant, but a new version of it is written into
        # every scope it has: one the author may not write (a shared scope without a grant, the
        # owner's personal one) makes it a proposal for an admin, as the API refuses it with a 403
        denied = unwritable_scopes(ctx.principal, target.scope, owner_id=target.owner_id)
        # a pin is a deliberate curation, whoever made it (a colleague's pin is not the owner's
        # edit, so it does not set user_edited): replacing a pinned belief is a person's call
        if upd.change == "contradicted" or target.user_edited or target.pinned or denied:
            review_id = self._queue_conflict(
                ctx,
                target,
                key=f"update:{index}:{target.id}",
                reason=(
                    "the user contradicted this belief"
                    if upd.change == "contradicted"
                    else "extraction proposed superseding a user-edited belief"
                    if target.user_edited
                    else "extraction proposed superseding a pinned belief"
                    if target.pinned
                    else f"extraction proposed superseding a belief in scopes its author may not write: {denied}"
                ),
                paper_outcome="flagged_conflict",
                proposed={
                    "change": upd.change,
                    "content": upd.new_content,
                    "canonical_name": upd.new_canonical_name,
                },
            )
            return Op("belief_updates", index, "conflict_queued", target.id, detail=review_id)
        replacement = self.supersede(
            ctx,
            target,
            new_content=upd.new_content,
            new_name=upd.new_canonical_name,
            key=str(index),
        )
        return Op("belief_updates", index, "superseded", replacement.id, detail=f"replaces {target.id}")

    def entity_update(self, ctx: MergeContext, ent: EntityUpdate, index: int) -> Op:
        target = self._named(ctx, ent.canonical_name)
        if target is None:
            return Op(
                "entity_updates",
                index,
                "not_found",
                detail=f"no single live belief named {ent.canonical_name!r}",
            )
        if not ent.new_aliases:
            return Op("entity_updates", index, "unchanged", target.id, "added []")
        # an alias reaches every session of the belief's scopes: one the author may not write (a
        # shared scope without a grant, the owner's personal one) makes it a proposal for an admin,
        # as the API refuses the author's add_aliases with a 403
        denied = unwritable_scopes(ctx.principal, target.scope, owner_id=target.owner_id)
        if denied:
            queued = self._propose_aliases(ctx, target, ent.new_aliases, denied, "entity_update")
            return Op(
                "entity_updates", index, "queued" if queued else "unchanged", target.id, _not_added(denied, queued)
            )
        refused = [a for a in normalize_aliases(ent.new_aliases, cap=None) if a in target.removed_aliases()]
        _, added, dropped = self.lifecycle.add_aliases(
            ctx.change(f"entity|{index}"),
            target.id,
            ent.new_aliases,
            trigger="entity_update: aliases added",
            keep_removed_out=True,
        )
        detail = f"added {added}" + (f"; alias cap reached, dropped {dropped}" if dropped else "")
        detail += f"; taken back by a person, not added again: {refused}" if refused else ""
        return Op("entity_updates", index, "aliases_added" if added else "unchanged", target.id, detail)

    def open_question(self, ctx: MergeContext, q: NewOpenQuestion, index: int) -> Op:
        scopes, _ = self._scopes(ctx, q.scope)
        if not scopes:
            return Op("new_open_questions", index, "skipped", detail="no usable scope")
        existing = [
            b
            for b in self.lookup.by_canonical_name(ctx.principal, q.canonical_name, scopes=scopes)
            if b.type is BeliefType.OPEN_QUESTION
        ]
        own_id = ctx.derived_id("b", "question", q.canonical_name)
        # a question created by an earlier attempt of this turn is not reinforced by it (re-run
        # after a crash): it falls through to the idempotent create below
        if existing and all(b.id != own_id for b in existing):
            self._reinforce(ctx, existing[0].id, [])
            return Op("new_open_questions", index, "reinforced", existing[0].id)
        belief = Belief(
            id=own_id,
            tenant_id=ctx.principal.tenant_id,
            owner_id=ctx.principal.user_id,
            type=BeliefType.OPEN_QUESTION,
            canonical_name=q.canonical_name,
            content=q.content,
            scope=scopes,
            confidence=OPEN_QUESTION_CONFIDENCE,
            # Only pinned open questions reach the questions tier; an extracted question is
            # asked so that future sessions keep it in view.
            pinned=True,
            provenance=ctx.provenance(),
            last_reinforced_at=ctx.now,
            change_log=[ctx.log("created (extraction: open question)")],
        )
        self._create(ctx, belief, f"question:{index}")
        return Op("new_open_questions", index, "inserted", belief.id)

    def resolve_question(self, ctx: MergeContext, question_id: str, index: int) -> Op:
        closed, left_open = self._close_question(ctx, question_id)
        outcome = "skipped" if left_open else "resolved" if closed else "unchanged"
        return Op("resolved_open_questions", index, outcome, question_id, left_open)

    # ------------------------------------------------------------------ building blocks

    def _named(self, ctx: MergeContext, name: str) -> Belief | None:
        """The one live belief ``name`` refers to: by canonical name, else by a unique alias; first
        among those the session's scopes see (the same name in another project is another
        belief), then among all the author sees. Several at the first level that has any: None
        (an alias is never added to a guess)."""
        for scopes in ([ctx.session_scopes] if ctx.session_scopes else []) + [None]:
            matches = self.lookup.by_canonical_name(ctx.principal, name, scopes=scopes) or self.lookup.by_name_or_alias(
                ctx.principal, name, scopes=scopes
            )
            if matches:
                return matches[0] if len(matches) == 1 else None
        return None

    def supersede(
        self,
        ctx: MergeContext,
        target: Belief,
        *,
        new_content: str | None,
        new_name: str | None,
        key: str,
        trigger: str = "supersedes",
    ) -> Belief:
        """New version of ``target`` through the lifecycle (which carries type, subtype, scope and
        pinned over and inherits the aliases plus the old name as a counter-signal)."""
        spec = Replacement(
            id=ctx.derived_id("b", "supersede", target.id, key),
            content=new_content,
            canonical_name=new_name,
            trigger=trigger,
            provenance=ctx.provenance(),
            reinforced_now=True,
        )
        change = ctx.change(f"supersede|{target.id}|{key}")
        change = replace(change, details={**change.details, "trigger": trigger})
        _, replacement = self.lifecycle.supersede(change, target, spec, tenant_wide=ctx.principal.is_admin)
        return replacement

    def _insert(self, ctx: MergeContext, nb: NewBelief, scopes: list[str], index: int) -> str:
        belief = Belief(
            id=ctx.derived_id("b", "new", nb.canonical_name),
            tenant_id=ctx.principal.tenant_id,
            owner_id=ctx.principal.user_id,
            type=nb.type,
            subtype=nb.subtype,
            canonical_name=nb.canonical_name,
            aliases=nb.aliases[:MAX_ALIASES],
            content=nb.content,
            why_it_matters=nb.why_it_matters,
            scope=scopes,
            epistemic_status=nb.epistemic_status,
            confidence=nb.confidence,
            expertise_domain=nb.expertise_domain,
            expertise_depth=nb.expertise_depth,
            # only pinned questions reach the questions tier (and no other tier shows one): a
            # question stated as a new belief is kept in view like one from new_open_questions
            pinned=nb.type is BeliefType.OPEN_QUESTION,
            provenance=ctx.provenance(),
            last_reinforced_at=ctx.now,
            change_log=[ctx.log("created (extraction)")],
        )
        self._create(ctx, belief, f"new:{index}")
        return belief.id

    def _create(self, ctx: MergeContext, belief: Belief, key: str) -> None:
        """Ids are derived from the turn: a re-run finds its own earlier write (the lifecycle checks
        it is really ours) and re-records the event under the same id."""
        self.lifecycle.create(ctx.change(key), belief, details={"trigger": belief.change_log[-1].trigger})

    def _reinforce(self, ctx: MergeContext, belief_id: str, aliases: list[str]) -> Belief:
        return self.lifecycle.reinforce(
            ctx.change(f"reinforce|{belief_id}"),
            belief_id,
            aliases,
            trigger=TRIGGER_REINFORCED,
            promote=self._promotable,
            keep_removed_out=True,
        )

    def _promotable(self, belief: Belief, now: datetime) -> bool:
        return belief.reinforcement_count >= self.policy.inferred_promotion_count and now - belief.created_at >= (
            timedelta(seconds=self.policy.inferred_promotion_age_s)
        )

    def _close_question(self, ctx: MergeContext, question_id: str) -> tuple[bool, str | None]:
        """Close an open question: (closed now, why it was left open). One that also lives in
        scopes the author may not write is left open (the API refuses the author's resolve)."""
        question = self.store.get(ctx.principal, question_id)
        denied = unwritable_scopes(ctx.principal, question.scope, owner_id=question.owner_id)
        if denied:
            return (
                False,
                f"question {question_id} left open: it lives in scopes the turn's author may not write: {denied}",
            )
        closed = self.lifecycle.resolve(
            ctx.change(f"resolve|{question_id}"), question_id, trigger="resolved (extraction)", if_open=True
        )
        return closed is not None, None

    def _propose_aliases(
        self, ctx: MergeContext, target: Belief, aliases: list[str], denied: list[str], source: str
    ) -> list[str]:
        """Aliases the author may not add to ``target`` (it lives in ``denied`` scopes too): each
        new one (not an alias yet, not taken back by a person) becomes an alias-candidate review
        item for an admin, the one the flywheel files for that surface. Returns their ids."""
        removed = target.removed_aliases()
        wanted = [a for a in normalize_aliases(aliases, cap=None) if a not in target.aliases and a not in removed]
        reason = f"{source} for a belief in scopes its author may not write: {denied}"
        items = [alias_review_item(ctx, target, a, reason=reason, proposed={"source": source}) for a in wanted]
        for item in items:
            self.reviews.create(item)  # False: filed already (by the flywheel, or a re-run)
        return [item.review_id for item in items]

    def _queue_conflict(
        self,
        ctx: MergeContext,
        existing: Belief,
        *,
        key: str,
        reason: str,
        paper_outcome: str,
        proposed: dict[str, Any],
    ) -> str:
        review_id = ctx.derived_id("rv", "conflict", key)
        item = review_item(
            ctx, existing, "conflict", review_id, reason=reason, proposed=proposed, paper_outcome=paper_outcome
        )
        if self.reviews.create(item):
            self.lifecycle.record(
                ctx.change(review_id),
                AuditAction.REVIEW_FILE_CONFLICT,
                [existing.id],
                scopes=existing.scope,
                before=snapshot(existing),
                details={"review_id": review_id, "proposed": proposed},
            )
        return review_id

    def _scopes(self, ctx: MergeContext, proposed: list[str]) -> tuple[list[str], list[str]]:
        """Proposed scopes the author may write (personal ones, shared ones with a grant); the
        session's own scope when none were proposed."""
        wanted = proposed or list(ctx.session_scopes[:1])
        allowed = [s for s in wanted if ctx.principal.may_use_scope(s)]
        dropped = [s for s in wanted if s not in allowed]
        if proposed and not allowed and ctx.session_scopes:
            allowed = [ctx.session_scopes[0]] if ctx.principal.may_use_scope(ctx.session_scopes[0]) else []
        return scope_rules.normalize_scopes(allowed), dropped


def alias_review_id(principal: Principal, belief_id: str, surface: str) -> str:
    """The review item of an alias proposed for a belief, one per (author, belief, surface): the
    flywheel counts its sightings there, whichever path filed it."""
    raw = f"{principal.tenant_id}|{principal.user_id}|{belief_id}|{surface}"
    return f"rv-alias-{hashlib.sha256(raw.encode()).hexdigest()[:24]}"


def alias_review_item(
    ctx: MergeContext, belief: Belief, surface: str, *, reason: str, proposed: dict[str, Any]
) -> ReviewItem:
    """A new alias-candidate review item: ``surface`` proposed by the turn for ``belief``."""
    rid = alias_review_id(ctx.principal, belief.id, surface)
    return review_item(ctx, belief, "alias_candidate", rid, reason=reason, proposed=proposed, surface=surface)


def review_item(
    ctx: MergeContext,
    belief: Belief,
    kind: ReviewKind,
    review_id: str,
    *,
    reason: str,
    proposed: dict[str, Any],
    **more: Any,
) -> ReviewItem:
    """A new review item of the turn's author about ``belief`` (``more``: the kind's own fields)."""
    return ReviewItem(
        tenant_id=ctx.principal.tenant_id,
        review_id=review_id,
        kind=kind,
        owner_id=ctx.principal.user_id,
        scope=belief.scope,
        belief_id=belief.id,
        canonical_name=belief.canonical_name,
        reason=reason,
        proposed=proposed,
        session_id=ctx.session_id,
        turn_ids=[ctx.turn_id],
        **more,
    )


def _not_added(denied: list[str], queued: list[str]) -> str:
    return (
        f"aliases not added: the belief lives in scopes the turn's author may not write {denied}; for review: {queued}"
    )


def _proposed(nb: NewBelief, scopes: list[str]) -> dict[str, Any]:
    return {
        "type": nb.type.value,
        "subtype": nb.subtype.value if nb.subtype else None,
        "canonical_name": nb.canonical_name,
        "content": nb.content,
        "why_it_matters": nb.why_it_matters,
        "scope": scopes,
        "confidence": nb.confidence,
        "epistemic_status": nb.epistemic_status.value,
        "aliases": nb.aliases,
    }
