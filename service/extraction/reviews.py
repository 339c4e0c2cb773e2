"""Resolving review-queue items (conflicts, alias candidates). Admins resolve for the tenant;
every resolution is a normal, audited belief change (a supersede or an alias addition)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from service.beliefs.lifecycle import BeliefLifecycle
from service.config import MemoryLoopSettings
from service.domain.audit import AuditAction
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import Conflict, ValidationFailed
from service.extraction.flywheel import AliasFlywheel
from service.extraction.merge import BeliefMerger, MergeContext
from service.storage.reviews import ReviewItem, ReviewStore

ACTOR_KIND = "admin"

Action = Literal["keep_existing", "accept_proposed", "apply_alias", "dismiss"]
ALLOWED: dict[str, tuple[str, ...]] = {
    "conflict": ("keep_existing", "accept_proposed", "dismiss"),
    "alias_candidate": ("apply_alias", "dismiss"),
}


class ReviewService:
    def __init__(self, lifecycle: BeliefLifecycle, reviews: ReviewStore, policy: MemoryLoopSettings):
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.reviews = reviews
        self.merger = BeliefMerger(lifecycle, reviews, policy)
        self.flywheel = AliasFlywheel(lifecycle, reviews, policy)

    def resolve(self, admin: Principal, review_id: str, action: Action) -> ReviewItem:
        item = self.reviews.get(admin, review_id, tenant_wide=True)
        if action not in ALLOWED[item.kind]:
            raise ValidationFailed(
                f"action {action!r} does not apply to a {item.kind} (use one of {ALLOWED[item.kind]})"
            )
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
            target = self.store.get(admin, item.belief_id, tenant_wide=True)
            if not target.is_live:
                raise Conflict(f"belief {target.id!r} is no longer live; resolve it by hand")
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
        elif action == "apply_alias" and item.belief_id and item.surface:
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
            details={"review_id": review_id, "kind": item.kind, "action": action},
        )
        return item
