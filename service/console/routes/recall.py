"""Recall playground: a message as a chosen user and scope set; the four tiers, the rendered
injection block and the explain view, from :meth:`RecallService.preview` (the same builder and
renderer as ``POST /v1/recall``; recorded as a ``recall.preview`` audit event, never as an
injection)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from service.api.deps import ProvisioningDep, RecallDep
from service.console.views import split_list
from service.console.web import PREFIX, ConsoleRoute, CurrentUser, Form, page
from service.domain import scopes as scope_rules
from service.domain.accounts import effective_principal
from service.domain.principal import Principal
from service.errors import ValidationFailed
from service.provisioning.service import ProvisioningService
from service.recall.context import RecallBudget

router = APIRouter(prefix=f"{PREFIX}/recall", route_class=ConsoleRoute, include_in_schema=False)
MAX_MESSAGE = 20_000
USER_CHOICES = 500  # users the picker lists (a tenant's first page of them)


def _users(user: CurrentUser, prov: ProvisioningService, chosen: str) -> list[str]:
    """The picker's users, the chosen one always among them: a browser preselects the first option
    of a select whose value is missing, so a re-run link for a user past the first page would
    otherwise preview as someone else."""
    if not user.is_admin:
        return [user.principal.user_id]
    users, _ = prov.list_users(user.actor, user.principal.tenant_id, size=USER_CHOICES)
    listed = [u.user_id for u in users]
    return listed if chosen in listed else [*listed, chosen]


@router.get("")
def playground(
    request: Request,
    user: CurrentUser,
    prov: ProvisioningDep,
    as_user: Annotated[str, Query(max_length=200)] = "",
    scopes: Annotated[str, Query(max_length=2000)] = "",
    message: Annotated[str, Query(max_length=MAX_MESSAGE)] = "",
) -> Response:
    chosen = _as_principal(user, prov, as_user.strip()).user_id  # 404 for no such user, 403 for a member
    form = {"as_user": chosen, "scopes": scopes, "message": message, "min_score": ""}
    return page(request, "recall.html", nav="recall", users=_users(user, prov, chosen), form=form, done=None)


def _as_principal(user: CurrentUser, prov: ProvisioningService, as_user: str) -> Principal:
    if not as_user or as_user == user.principal.user_id:
        return user.principal  # as oneself: the credential's own (possibly narrowed) grants
    record = prov.get_user(user.actor, user.principal.tenant_id, as_user)  # admins only (403 otherwise)
    return effective_principal(record)


def _threshold(raw: str) -> float | None:
    """An optional relevance threshold to try instead of the deployment's (what would surface at
    another ``min_score``; the same budget override as ``POST /v1/recall``)."""
    if not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValidationFailed("threshold: a number") from exc
    if not 0 <= value <= 1000:
        raise ValidationFailed("threshold: between 0 and 1000")
    return value


@router.post("")
def run(request: Request, user: CurrentUser, form: Form, service: RecallDep, prov: ProvisioningDep) -> Response:
    message = form.get("message", "")
    if len(message) > MAX_MESSAGE:
        raise ValidationFailed(f"the message is longer than {MAX_MESSAGE} characters")
    try:
        scopes = scope_rules.normalize_scopes(split_list(form.get("scopes", "")))
    except scope_rules.InvalidScope as exc:
        raise ValidationFailed(str(exc)) from exc
    as_principal = _as_principal(user, prov, form.get("as_user", "").strip())
    min_score = _threshold(form.get("min_score", ""))
    budget = RecallBudget(min_score=min_score) if min_score is not None else None
    done = service.preview(user.actor, as_principal, scopes, message, budget=budget, explain=True)
    shown = {
        "as_user": as_principal.user_id,
        "scopes": ", ".join(scopes),
        "message": message,
        "min_score": form.get("min_score", "").strip(),
    }
    threshold = f"{min_score if min_score is not None else service.builder.defaults.min_score:g}"
    return page(
        request,
        "recall.html",
        nav="recall",
        users=_users(user, prov, as_principal.user_id),
        form=shown,
        done=done,
        threshold=threshold,
    )
