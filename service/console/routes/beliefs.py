"""Beliefs: search and filters, the belief page (chain timeline, change log), and the lifecycle
actions. Every action is a form posted twice: the first post shows what will happen, the second
(``confirmed=yes``) does it through :class:`BeliefService`, exactly as the REST endpoint would."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import BeliefsDep
from service.beliefs.api_service import ErasureReceipt, SupersedeIn
from service.console.views import (
    aliases_outcome,
    belief_actions,
    change_log_rows,
    checked_aliases,
    parse_list_filter,
    split_list,
    verdict,
)
from service.console.web import PREFIX, ConsoleRoute, CurrentUser, Form, Writer, confirm, confirmed, page, redirect
from service.domain.belief import ID_RE, BeliefType, Lifecycle
from service.errors import NotFound, ValidationFailed

router = APIRouter(prefix=f"{PREFIX}/beliefs", route_class=ConsoleRoute, include_in_schema=False)

BeliefId = Annotated[str, Path(pattern=ID_RE.pattern)]
Repeated = Annotated[list[str], Query(max_length=32)]
PAGE_SIZE = 50


@router.get("")
def list_beliefs(
    request: Request,
    user: CurrentUser,
    beliefs: BeliefsDep,
    q: Annotated[str, Query(max_length=1000)] = "",
    type_: Annotated[list[BeliefType], Query(alias="type")] = [],  # noqa: B006 - FastAPI copies defaults
    status_: Annotated[list[Lifecycle], Query(alias="status")] = [],  # noqa: B006
    scope: Repeated = [],  # noqa: B006
    owner: Annotated[str, Query(max_length=200)] = "",
    pinned: Annotated[str, Query(pattern="^(|yes|no)$")] = "",
    mine: bool = False,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> Response:
    narrow = parse_list_filter(q, type_, status_, scope, owner, pinned)
    tenant_wide = user.is_admin and not mine
    items, next_cursor = beliefs.list_beliefs(user.actor, narrow, size=PAGE_SIZE, after=cursor, tenant_wide=tenant_wide)
    return page(
        request,
        "beliefs.html",
        nav="beliefs",
        items=items,
        next_cursor=next_cursor,
        tenant_wide=tenant_wide,
        types=list(BeliefType),
        lifecycles=list(Lifecycle),
        form={
            "q": q,
            "type": [t.value for t in type_],
            "status": [s.value for s in status_],
            "scope": ", ".join(scope),
            "owner": owner,
            "pinned": pinned,
            "mine": mine,
        },
    )


@router.get("/{belief_id}")
def belief_page(request: Request, belief_id: BeliefId, user: CurrentUser, beliefs: BeliefsDep) -> Response:
    history = beliefs.history(user.actor, belief_id, tenant_wide=user.is_admin)
    current = next(b for b in history.chain if b.id == belief_id)
    return page(
        request,
        "belief.html",
        nav="beliefs",
        belief=current,
        chain=history.chain,
        change_log=change_log_rows(history.chain),
        actions=belief_actions(user, current, beliefs),
    )


@router.post("/{belief_id}/{action}")
def act(
    request: Request,
    belief_id: BeliefId,
    action: Annotated[str, Path(pattern="^(supersede|pin|unpin|alias|unalias|retract|erase)$")],
    user: Writer,
    form: Form,
    beliefs: BeliefsDep,
) -> Response:
    target = beliefs.get(user.actor, belief_id, tenant_wide=True)
    if not confirmed(form):
        return confirm(
            request,
            action=action,
            what=verdict(action, target, form),
            form=form,
            action_url=f"/beliefs/{belief_id}/{action}",
            cancel_url=f"/beliefs/{belief_id}",
            nav="beliefs",
        )
    actor = user.actor
    if action == "supersede":
        body = _supersede_body(form)
        _, new = beliefs.supersede(actor, belief_id, body)
        return redirect(f"/beliefs/{new.id}", notice=f"{belief_id} superseded by {new.id}", user=user)
    if action in ("pin", "unpin"):
        beliefs.set_pinned(actor, belief_id, action == "pin")
        return redirect(f"/beliefs/{belief_id}", notice=f"{action}ned", user=user)
    if action == "alias":
        aliases = split_list(form.get("aliases", ""))
        if not aliases:
            raise ValidationFailed("give at least one alias")
        updated = beliefs.add_aliases(actor, belief_id, aliases)
        return redirect(f"/beliefs/{belief_id}", notice=aliases_outcome(target, updated, aliases), user=user)
    if action == "unalias":
        beliefs.remove_aliases(actor, belief_id, checked_aliases(form))
        return redirect(f"/beliefs/{belief_id}", notice="aliases removed", user=user)
    if action == "retract":
        beliefs.retract(actor, belief_id, form.get("reason") or None)
        return redirect(f"/beliefs/{belief_id}", notice="retracted: it will never be injected again", user=user)
    if action == "erase":
        receipt: ErasureReceipt = beliefs.erase(actor, belief_id, expunge=form.get("expunge") == "yes")
        return page(request, "erased.html", nav="beliefs", receipt=receipt)
    raise NotFound(f"no action {action!r}")  # pragma: no cover - the path pattern lists them


def _supersede_body(form: dict[str, str]) -> SupersedeIn:
    aliases = [a.strip() for a in form.get("aliases", "").split(",") if a.strip()]
    try:
        return SupersedeIn(
            content=form.get("content", ""),
            why_it_matters=form.get("why_it_matters") or None,
            canonical_name=form.get("canonical_name") or None,
            aliases=aliases,
            reason=form.get("reason") or None,
        )
    except ValueError as exc:
        raise ValidationFailed(f"invalid replacement: {exc}") from exc
