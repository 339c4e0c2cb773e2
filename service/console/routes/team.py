"""Team: users and their grants, API keys (issue, revoke, last used), disable/enable; through
:class:`ProvisioningService`, exactly as the ``/v1/admin/tenants/...`` endpoints. Admins of the
tenant only; changes that take access away confirm first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import ValidationError

from service.api.deps import ProvisioningDep
from service.console.views import split_list
from service.console.web import PREFIX, AdminUser, ConsoleRoute, Form, Writer, confirm, confirmed, page, redirect
from service.domain.accounts import SLUG_RE, Grants
from service.domain.principal import Role
from service.errors import ValidationFailed
from service.provisioning.service import GrantChange

router = APIRouter(prefix=f"{PREFIX}/team", route_class=ConsoleRoute, include_in_schema=False)

UserId = Annotated[str, Path(pattern=SLUG_RE.pattern)]
KeyId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")]
MAX_LISTED = 500


@router.get("")
def team(request: Request, user: AdminUser, prov: ProvisioningDep) -> Response:
    tenant = user.principal.tenant_id
    users, more_users = prov.list_users(user.actor, tenant, size=MAX_LISTED)
    keys, more_keys = prov.list_keys(user.actor, tenant, size=MAX_LISTED)
    return page(
        request,
        "team.html",
        nav="team",
        users=users,
        keys=keys,
        truncated=bool(more_users or more_keys),
        roles=list(Role),
    )


def _roles(form: dict[str, str], field: str) -> list[Role]:
    try:
        return [Role(r) for r in split_list(form.get(field, ""))]
    except ValueError as exc:
        raise ValidationFailed(f"{field}: roles are {[r.value for r in Role]}") from exc


def _grants(roles: list[Role], projects: str, teams: str) -> Grants:
    """Projects and teams as typed (comma-separated), checked and normalised like the REST API's
    (lower-cased slugs): 422 before anything is confirmed or stored."""
    try:
        return Grants(roles=roles, projects=split_list(projects), teams=split_list(teams))
    except ValidationError as exc:
        raise ValidationFailed(f"invalid grants: {exc.errors()[0]['msg']}") from exc


@router.post("/users")
def create_user(user: Writer, form: Form, prov: ProvisioningDep) -> Response:
    grants = _grants(_roles(form, "roles") or [Role.MEMBER], form.get("projects", ""), form.get("teams", ""))
    created = prov.create_user(user.actor, user.principal.tenant_id, form.get("user_id", "").strip(), grants)
    return redirect("/team", notice=f"user {created.user_id} created", user=user)


def _grant_change(form: dict[str, str]) -> GrantChange:
    add = _grants(_roles(form, "add_roles"), form.get("add_projects", ""), form.get("add_teams", ""))
    remove = _grants(_roles(form, "remove_roles"), form.get("remove_projects", ""), form.get("remove_teams", ""))
    return GrantChange(
        add_projects=add.projects,
        remove_projects=remove.projects,
        add_teams=add.teams,
        remove_teams=remove.teams,
        add_roles=add.roles,
        remove_roles=remove.roles,
    )


USER_EFFECTS = {
    "disable": "Every API key, JWT and console session of {u} is refused from the next request.",
    "enable": "{u}'s keys and tokens work again.",
    "grants": (
        "Change {u}'s grants: {change}. A removed grant is taken from their keys at once; an added one "
        "reaches only keys issued from now on (a key's grants may only narrow the user's)."
    ),
}


@router.post("/users/{user_id}/{action}")
def change_user(
    request: Request,
    user_id: UserId,
    action: Annotated[str, Path(pattern="^(disable|enable|grants)$")],
    user: Writer,
    form: Form,
    prov: ProvisioningDep,
) -> Response:
    tenant = user.principal.tenant_id
    change = _grant_change(form) if action == "grants" else None
    if not confirmed(form):
        described = ", ".join(f"{k} {v}" for k, v in (change.__dict__ if change else {}).items() if v)
        return confirm(
            request,
            action=action,
            what=USER_EFFECTS[action].format(u=user_id, change=described or "nothing"),
            form=form,
            action_url=f"/team/users/{user_id}/{action}",
            cancel_url="/team",
            nav="team",
        )
    if change is not None:
        prov.change_grants(user.actor, tenant, user_id, change)
    else:
        prov.set_user_disabled(user.actor, tenant, user_id, action == "disable")
    return redirect("/team", notice=f"{user_id}: {action} done", user=user)


@router.post("/keys")
def issue_key(request: Request, user: Writer, form: Form, prov: ProvisioningDep) -> Response:
    days = form.get("expires_in_days", "").strip()
    try:
        expires_in_s = int(days) * 86_400 if days else None
    except ValueError as exc:
        raise ValidationFailed("expires in: a whole number of days") from exc
    if expires_in_s is not None and not 1 <= expires_in_s // 86_400 <= 5 * 365:
        raise ValidationFailed("expires in: between 1 and 1825 days")
    owner = form.get("user_id", "").strip()
    if not SLUG_RE.fullmatch(owner):
        raise ValidationFailed("choose a user")
    name = form.get("name", "")[:200]
    issued = prov.issue_key(user.actor, user.principal.tenant_id, owner, name=name, expires_in_s=expires_in_s)
    return page(request, "key_issued.html", nav="team", issued=issued)


@router.post("/keys/{key_id}/revoke")
def revoke_key(request: Request, key_id: KeyId, user: Writer, form: Form, prov: ProvisioningDep) -> Response:
    if not confirmed(form):
        return confirm(
            request,
            action="revoke",
            what=f"Revoke API key {key_id}: every request and console session using it is refused from now on.",
            form=form,
            action_url=f"/team/keys/{key_id}/revoke",
            cancel_url="/team",
            nav="team",
        )
    revoked = prov.revoke_key(user.actor, key_id)
    return redirect("/team", notice=f"key {revoked.key_id} of {revoked.user_id} revoked", user=user)
