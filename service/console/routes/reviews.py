"""Review queue: conflicts from extraction side by side with the existing belief, and alias
candidates; resolved through :class:`ReviewService` (the same as ``POST /v1/admin/reviews/{id}/
resolve``): accept the proposal (a supersede), reject it (keep the existing belief), or dismiss."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import BeliefsDep, ServicesDep
from service.api.state import Services
from service.console.web import PREFIX, AdminUser, ConsoleRoute, Form, Writer, confirm, confirmed, page, redirect
from service.domain.belief import Belief
from service.errors import NotFound, ValidationFailed
from service.extraction.reviews import ALLOWED, Action, ReviewService
from service.storage.reviews import ReviewItem, ReviewStatus

router = APIRouter(prefix=f"{PREFIX}/reviews", route_class=ConsoleRoute, include_in_schema=False)

ReviewId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_.:-]{1,200}$")]
# The console's words for the service's actions.
LABELS: dict[str, str] = {
    "accept_proposed": "accept",
    "keep_existing": "reject",
    "apply_alias": "apply alias",
    "dismiss": "dismiss",
}
EFFECTS: dict[str, str] = {
    "accept_proposed": "The proposal supersedes the existing belief (a new version; the old one stays in its history).",
    "keep_existing": "The existing belief stays as it is; the proposal is closed as rejected.",
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
    items = service.reviews.list(user.principal, status=status, tenant_wide=True, size=100)
    existing: dict[str, Belief | None] = {}
    for item in items:
        if item.belief_id and item.belief_id not in existing:
            try:
                existing[item.belief_id] = beliefs.get(user.actor, item.belief_id, tenant_wide=True)
            except NotFound:
                existing[item.belief_id] = None
    return page(
        request,
        "reviews.html",
        nav="reviews",
        items=items,
        existing=existing,
        status=status,
        allowed=ALLOWED,
        labels=LABELS,
    )


@router.post("/{review_id}")
def resolve(request: Request, review_id: ReviewId, user: Writer, form: Form, services: ServicesDep) -> Response:
    service = review_service(services)
    item: ReviewItem = service.reviews.get(user.principal, review_id, tenant_wide=True)
    action = form.get("action", "")
    if action not in ALLOWED[item.kind]:
        raise ValidationFailed(f"{action!r} does not apply to a {item.kind} (use one of {ALLOWED[item.kind]})")
    if not confirmed(form):
        subject = item.canonical_name or item.belief_id or review_id
        return confirm(
            request,
            action=LABELS[action],
            what=f"{LABELS[action].capitalize()} the {item.kind.replace('_', ' ')} on '{subject}'. {EFFECTS[action]}",
            form=form,
            action_url=f"/reviews/{review_id}",
            cancel_url="/reviews",
            nav="reviews",
        )
    done = service.resolve(user.principal, review_id, cast(Action, action))  # checked against ALLOWED above
    note = f"{LABELS[action]}: {done.kind.replace('_', ' ')} {review_id}"
    if done.result_belief_id:
        return redirect(f"/beliefs/{done.result_belief_id}", notice=note)
    return redirect("/reviews", notice=note)
