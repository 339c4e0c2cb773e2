"""Review queue: conflicts from extraction side by side with the existing belief, and alias
candidates; resolved through :class:`ReviewService` (the same as ``POST /v1/admin/reviews/{id}/
resolve``): accept the proposal (a supersede), reject it (keep the existing belief), merge it into
the existing belief (content and why-it-matters chosen per field, aliases united), or dismiss."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import BeliefsDep, ServicesDep
from service.api.state import Services
from service.beliefs.api_service import BeliefService
from service.console.web import (
    PREFIX,
    AdminUser,
    ConsoleRoute,
    ConsoleUser,
    Form,
    Writer,
    confirm,
    confirmed,
    page,
    redirect,
)
from service.domain.belief import Belief
from service.errors import NotFound, Unreadable, ValidationFailed
from service.extraction.reviews import ALLOWED, Action, MergeChoice, ReviewService, Side, merged_proposal
from service.storage.reviews import ReviewItem, ReviewStatus

router = APIRouter(prefix=f"{PREFIX}/reviews", route_class=ConsoleRoute, include_in_schema=False)

QUEUE_SIZE = 100  # items listed, newest first
ReviewId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:-]{1,200}$")]
# The console's words for the service's actions.
LABELS: dict[str, str] = {
    "accept_proposed": "accept",
    "keep_existing": "reject",
    "merge": "merge",
    "apply_alias": "apply alias",
    "dismiss": "dismiss",
}
EFFECTS: dict[str, str] = {
    "accept_proposed": "The proposal supersedes the existing belief (a new version; the old one stays in its history).",
    "keep_existing": "The existing belief stays as it is; the proposal is closed as rejected.",
    "merge": (
        "A new version of the existing belief keeps its name and scopes and gains the proposal's aliases; "
        "the old version stays in its history."
    ),
    "apply_alias": "The surface form becomes an alias of the belief, so recall finds it by that name.",
    "dismiss": "The item is closed without any change to a belief.",
}


def review_service(services: Services) -> ReviewService:
    return services.reviews


@router.get("")
def queue(
    request: Request,
    user: AdminUser,
    services: ServicesDep,
    beliefs: BeliefsDep,
    status: Annotated[ReviewStatus, Query()] = "open",
) -> Response:
    service = review_service(services)
    listed = service.reviews.list(user.principal, status=status, tenant_wide=True, size=QUEUE_SIZE + 1)
    items, truncated = listed[:QUEUE_SIZE], len(listed) > QUEUE_SIZE  # one more: are there older ones?
    existing: dict[str, Belief | None] = {}
    for item in items:
        if item.belief_id and item.belief_id not in existing:
            try:
                existing[item.belief_id] = beliefs.get(user.actor, item.belief_id, tenant_wide=True)
            except (NotFound, Unreadable):  # erased since, or stored in a form that cannot be loaded
                existing[item.belief_id] = None
    return page(
        request,
        "reviews.html",
        nav="reviews",
        items=items,
        existing=existing,
        status=status,
        truncated=truncated,
        queue_size=QUEUE_SIZE,
        allowed=ALLOWED,
        labels=LABELS,
    )


def _side(form: dict[str, str], field: str) -> Side:
    value = form.get(field, "existing")
    if value not in ("existing", "proposed"):
        raise ValidationFailed(f"{field}: choose existing or proposed")
    return cast(Side, value)


def merge_choice(form: dict[str, str]) -> MergeChoice:
    """The merge form: for content and why-it-matters, a side, or text written anew."""
    return MergeChoice(
        content=_side(form, "merge_content"),
        why_it_matters=_side(form, "merge_why_it_matters"),
        edited_content=form.get("merge_edited_content", "").strip() or None,
        edited_why_it_matters=form.get("merge_edited_why_it_matters", "").strip() or None,
    )


def _merge_verdict(user: ConsoleUser, beliefs: BeliefService, item: ReviewItem, choice: MergeChoice) -> str:
    """What the merge will store, spelled out (422 here already when the choice is impossible)."""
    target = beliefs.get(user.actor, item.belief_id or "", tenant_wide=True)
    merged = merged_proposal(item, target, choice, new_id="preview")
    added = [a for a in merged.aliases if a not in target.aliases]
    return (
        f"Merge the proposal into '{target.canonical_name}'. {EFFECTS['merge']} The new version's content: "
        f"{merged.content!r}; why it matters: {merged.why_it_matters!r}; aliases added: {added or 'none'}."
    )


@router.post("/{review_id}")
def resolve(
    request: Request, review_id: ReviewId, user: Writer, form: Form, services: ServicesDep, beliefs: BeliefsDep
) -> Response:
    service = review_service(services)
    item: ReviewItem = service.reviews.get(user.principal, review_id, tenant_wide=True)
    action = form.get("action", "")
    if action not in ALLOWED[item.kind]:
        raise ValidationFailed(f"{action!r} does not apply to a {item.kind} (use one of {ALLOWED[item.kind]})")
    choice = merge_choice(form) if action == "merge" else None
    if not confirmed(form):
        subject = item.canonical_name or item.belief_id or review_id
        what = f"{LABELS[action].capitalize()} the {item.kind.replace('_', ' ')} on '{subject}'. {EFFECTS[action]}"
        if choice is not None:
            what = _merge_verdict(user, beliefs, item, choice)
        return confirm(
            request,
            action=LABELS[action],
            what=what,
            form=form,
            action_url=f"/reviews/{review_id}",
            cancel_url="/reviews",
            nav="reviews",
        )
    # the action was checked against ALLOWED above
    done = service.resolve(user.principal, review_id, cast(Action, action), choice)
    note = f"{LABELS[action]}: {done.kind.replace('_', ' ')} {review_id}"
    if done.result_belief_id:
        return redirect(f"/beliefs/{done.result_belief_id}", notice=note, user=user)
    return redirect("/reviews", notice=note, user=user)
