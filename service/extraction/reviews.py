"""Resolving review-queue items (conflicts, alias candidates). Admins resolve for the tenant;
every resolution is a normal, audited belief change (a supersede, a merge or an alias addition).

A conflict can be settled four ways: keep the existing belief, accept the proposal (it supersedes
the belief), merge it into the belief (a new version keeping the belief's name and scopes, with
the union of aliases and the content and why-it-matters the admin chose from either side, or
written anew), or dismiss it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from service.beliefs.lifecycle import BeliefLifecycle, MergedProposal, spoken_name
from service.config import MemoryLoopSettings
from service.domain.audit import AuditAction
from service.domain.belief import Belief, utcnow
from service.domain.principal import Principal
from service.errors import Conflict, ValidationFailed
from service.extraction.flywheel import AliasFlywheel
from service.extraction.merge import BeliefMerger, MergeContext
from service.storage.reviews import ReviewItem, ReviewStore

ACTOR_KIND = "admin"

Action = Literal["keep_existing", "accept_proposed", "merge", "apply_alias", "dismiss"]
ALLOWED: dict[str, tuple[str, ...]] = {
    "conflict": ("keep_existing", "accept_proposed", "merge", "dismiss"),
    "alias_candidate": ("apply_alias", "dismiss"),
}


Side = Literal["existing", "proposed"]


@dataclass(frozen=True)
class MergeChoice:
    """How a conflict's proposal is merged into the existing belief: content and why-it-matters
    each taken from one side, or written anew (``edited_*``, which wins over the side)."""

    content: Side = "existing"
    why_it_matters: Side = "existing"
    edited_content: str | None = None
    edited_why_it_matters: str | None = None

    def audit(self) -> dict[str, str]:
        """Where each field came from, for the audit trail (never the text itself: erasure must
        find every copy of a statement in the belief payloads)."""
        return {
            "content_from": "edited" if self.edited_content else self.content,
            "why_it_matters_from": "edited" if self.edited_why_it_matters else self.why_it_matters,
        }


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def merged_proposal(item: ReviewItem, target: Belief, choice: MergeChoice, *, new_id: str) -> MergedProposal:
    """The merge of ``item``'s proposal into ``target`` as ``choice`` says (422 when it picks a
    field the proposal does not have)."""
    proposed = item.proposed or {}

    def pick(field: str, side: Side, edited: str | None, existing: str) -> str:
        if edited is not None and edited.strip():
            return edited
        if side == "existing":
            return existing
        value = _text(proposed.get(field))
        if value is None:
            raise ValidationFailed(f"the proposal has no {field.replace('_', '-')} to take; keep the existing one")
        return value

    aliases = [a for a in proposed.get("aliases") or [] if isinstance(a, str)]
    name = _text(proposed.get("canonical_name"))
    if name and name != target.canonical_name:
        aliases.append(spoken_name(name))  # the name the proposal used still finds the belief
    return MergedProposal(
        review_id=item.review_id,
        content=pick("content", choice.content, choice.edited_content, target.content),
        why_it_matters=pick(
            "why_it_matters", choice.why_it_matters, choice.edited_why_it_matters, target.why_it_matters
        ),
        aliases=aliases,
        choices=choice.audit(),
        id=new_id,
    )


class ReviewService:
    def __init__(self, lifecycle: BeliefLifecycle, reviews: ReviewStore, policy: MemoryLoopSettings):
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.reviews = reviews
        self.merger = BeliefMerger(lifecycle, reviews, policy)
        self.flywheel = AliasFlywheel(lifecycle, reviews, policy)

    def resolve(self, admin: Principal, review_id: str, action: Action, merge: MergeChoice | None = None) -> ReviewItem:
        item = self.reviews.get(admin, review_id, tenant_wide=True)
        if action not in ALLOWED[item.kind]:
            raise ValidationFailed(
                f"action {action!r} does not apply to a {item.kind} (use one of {ALLOWED[item.kind]})"
            )
        if merge is not None and action != "merge":
            raise ValidationFailed("merge choices are given only with the action 'merge'")
        if item.status != "open":
            raise Conflict(f"review item {review_id!r} is already {item.status}")
        loaded = self.reviews.load(admin.tenant_id, review_id)
        if loaded is None:  # pragma: no cover - just read it
            raise Conflict("review item vanished")
        item, seq, term = loaded
        ctx = MergeContext(
            principal=admin,
            session_id=item.session_id or "review",
            turn_id=f"review:{review_id}",
            source_model=None,
            session_scopes=item.scope,
            actor_kind=ACTOR_KIND,
        )
        result_id: str | None = None
        if action == "accept_proposed" and item.belief_id:
            target = self._live_target(admin, item.belief_id)
            proposed = item.proposed or {}
            content = proposed.get("content")
            name = proposed.get("canonical_name")
            replacement = self.merger.supersede(
                ctx,
                target,
                new_content=content if isinstance(content, str) and content else None,
                new_name=name if isinstance(name, str) and name else None,
                key="accept",
                trigger="conflict resolved by admin: supersedes",
            )
            result_id = replacement.id
        elif action == "merge" and item.belief_id:
            result_id = self._merge(ctx, item, merge or MergeChoice())
        elif action == "apply_alias" and item.belief_id and item.surface:
            # on a version no longer live the alias would reach no recall: refused like the others
            self._live_target(admin, item.belief_id)
            result_id = self.flywheel.apply(
                ctx, item.belief_id, item.surface, trigger="alias candidate approved by admin"
            ).id
        item.status = "dismissed" if action == "dismiss" else "resolved"
        item.resolution = action
        item.resolved_at = utcnow()
        item.resolved_by = admin.user_id
        item.result_belief_id = result_id
        self.reviews.save(item, seq_no=seq, primary_term=term)
        self.lifecycle.record(
            replace(ctx.change(action), key=f"{review_id}|{action}", details={}),
            AuditAction.REVIEW_RESOLVE,
            [i for i in (item.belief_id, result_id) if i],
            scopes=item.scope,
            details={
                "review_id": review_id,
                "kind": item.kind,
                "action": action,
                **((merge or MergeChoice()).audit() if action == "merge" else {}),
            },
        )
        return item

    def _live_target(self, admin: Principal, belief_id: str) -> Belief:
        """The belief a review item is about, which must still be live to be changed by it."""
        target = self.store.get(admin, belief_id, tenant_wide=True)
        if not target.is_live:
            raise Conflict(f"belief {target.id!r} is no longer live; resolve it by hand")
        return target

    def _merge(self, ctx: MergeContext, item: ReviewItem, choice: MergeChoice) -> str:
        target = self._live_target(ctx.principal, item.belief_id or "")
        proposal = merged_proposal(item, target, choice, new_id=ctx.derived_id("b", "merge", target.id))
        change = ctx.change(f"merge|{target.id}")
        change = replace(change, details={**change.details, "trigger": "conflict merged by admin"})
        _, merged = self.lifecycle.merge_proposal(change, target, proposal, tenant_wide=True)
        return merged.id
