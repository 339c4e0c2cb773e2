"""Provisioning endpoints: tenants, users, grants, API keys, development tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, status
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import CurrentActor, CurrentIdentity, ProvisioningDep
from service.domain.accounts import SLUG_RE, ApiKeyRecord, Grants, TenantRecord, UserRecord
from service.domain.principal import Role
from service.provisioning.service import GrantChange

router = APIRouter(prefix="/v1", tags=["admin"])

TenantPath = Annotated[str, Path(pattern=SLUG_RE.pattern)]
UserPath = Annotated[str, Path(pattern=SLUG_RE.pattern)]
KeyPath = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")]
Slug = Annotated[str, Field(pattern=SLUG_RE.pattern)]
GrantSlug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: Slug
    name: str = Field("", max_length=200)


class TenantOut(BaseModel):
    tenant_id: str
    name: str
    disabled: bool
    created_at: datetime


Limit = Annotated[int, Query(ge=1, le=500, description="Page size")]
Cursor = Annotated[str | None, Query(max_length=2000, description="next_cursor of the previous page")]


class UserIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: Slug
    roles: list[Role] = Field(default_factory=lambda: [Role.MEMBER], max_length=4)
    projects: list[GrantSlug] = Field(default_factory=list, max_length=256)
    teams: list[GrantSlug] = Field(default_factory=list, max_length=256)


class UserOut(BaseModel):
    tenant_id: str
    user_id: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    disabled: bool
    created_at: datetime
    updated_at: datetime


class UserPage(BaseModel):
    items: list[UserOut]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null at the end")


class GrantsPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    add_projects: list[GrantSlug] = Field(default_factory=list, max_length=256)
    remove_projects: list[GrantSlug] = Field(default_factory=list, max_length=256)
    add_teams: list[GrantSlug] = Field(default_factory=list, max_length=256)
    remove_teams: list[GrantSlug] = Field(default_factory=list, max_length=256)
    add_roles: list[Role] = Field(default_factory=list, max_length=4)
    remove_roles: list[Role] = Field(default_factory=list, max_length=4)


class KeyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("", max_length=200)
    roles: list[Role] | None = Field(None, max_length=4, description="Defaults to the user's roles; may only narrow")
    projects: list[GrantSlug] | None = Field(
        None, max_length=256, description="Defaults to the user's projects; may only narrow"
    )
    teams: list[GrantSlug] | None = Field(
        None, max_length=256, description="Defaults to the user's teams; may only narrow"
    )
    expires_in_s: int | None = Field(None, ge=60, le=5 * 365 * 86_400)


class KeyOut(BaseModel):
    key_id: str
    tenant_id: str
    user_id: str
    name: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


class KeyPage(BaseModel):
    items: list[KeyOut]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null at the end")


class IssuedKeyOut(KeyOut):
    key: str = Field(description="The secret API key. Shown once: it is stored only as a hash")


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: int | None = Field(None, ge=60, le=30 * 86_400)


class TokenRevokeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(..., min_length=1, max_length=8192, description="The JWT to revoke")


class TokenRevokedOut(BaseModel):
    jti: str
    revoked: bool
    expires_at: int


class TokenOut(BaseModel):
    token: str
    token_type: str = "Bearer"  # noqa: S105 - the OAuth token type, not a secret
    expires_at: int


class WhoAmI(BaseModel):
    tenant_id: str
    user_id: str
    roles: list[Role]
    projects: list[str]
    teams: list[str]
    credential: str
    credential_id: str | None


def _tenant(t: TenantRecord) -> TenantOut:
    return TenantOut(tenant_id=t.tenant_id, name=t.name, disabled=t.disabled, created_at=t.created_at)


def _user(u: UserRecord) -> UserOut:
    return UserOut(**u.model_dump(include=set(UserOut.model_fields)))


def _key(k: ApiKeyRecord) -> KeyOut:
    return KeyOut(**k.model_dump(include=set(KeyOut.model_fields)))


@router.get("/whoami", response_model=WhoAmI, tags=["auth"], summary="The principal behind the credential")
def whoami(identity: CurrentIdentity) -> WhoAmI:
    p = identity.principal
    return WhoAmI(
        tenant_id=p.tenant_id,
        user_id=p.user_id,
        roles=sorted(p.roles, key=lambda r: r.value),
        projects=sorted(p.projects),
        teams=sorted(p.teams),
        credential=identity.kind,
        credential_id=identity.credential_id,
    )


@router.post(
    "/admin/tenants",
    response_model=TenantOut,
    status_code=status.HTTP_201_CREATED,
    summary="Create a tenant (operators)",
)
def create_tenant(body: TenantIn, actor: CurrentActor, prov: ProvisioningDep) -> TenantOut:
    return _tenant(prov.create_tenant(actor, body.tenant_id, body.name))


@router.get("/admin/tenants/{tenant_id}", response_model=TenantOut, summary="Get a tenant")
def get_tenant(tenant_id: TenantPath, actor: CurrentActor, prov: ProvisioningDep) -> TenantOut:
    return _tenant(prov.get_tenant(actor, tenant_id))


@router.post(
    "/admin/tenants/{tenant_id}/disable",
    response_model=TenantOut,
    summary="Disable a tenant: every credential of it is refused (operators)",
)
def disable_tenant(tenant_id: TenantPath, actor: CurrentActor, prov: ProvisioningDep) -> TenantOut:
    return _tenant(prov.set_tenant_disabled(actor, tenant_id, True))


@router.post("/admin/tenants/{tenant_id}/enable", response_model=TenantOut, summary="Re-enable a tenant (operators)")
def enable_tenant(tenant_id: TenantPath, actor: CurrentActor, prov: ProvisioningDep) -> TenantOut:
    return _tenant(prov.set_tenant_disabled(actor, tenant_id, False))


@router.post(
    "/admin/tenants/{tenant_id}/users",
    response_model=UserOut,
    status_code=status.HTTP_201_CREATED,
    summary="Create a user",
)
def create_user(tenant_id: TenantPath, body: UserIn, actor: CurrentActor, prov: ProvisioningDep) -> UserOut:
    grants = Grants(roles=body.roles, projects=body.projects, teams=body.teams)
    return _user(prov.create_user(actor, tenant_id, body.user_id, grants))


@router.get("/admin/tenants/{tenant_id}/users", response_model=UserPage, summary="List users (cursor pagination)")
def list_users(
    tenant_id: TenantPath, actor: CurrentActor, prov: ProvisioningDep, limit: Limit = 100, cursor: Cursor = None
) -> UserPage:
    users, next_cursor = prov.list_users(actor, tenant_id, size=limit, after=cursor)
    return UserPage(items=[_user(u) for u in users], next_cursor=next_cursor)


@router.get("/admin/tenants/{tenant_id}/users/{user_id}", response_model=UserOut, summary="Get a user")
def get_user(tenant_id: TenantPath, user_id: UserPath, actor: CurrentActor, prov: ProvisioningDep) -> UserOut:
    return _user(prov.get_user(actor, tenant_id, user_id))


@router.post(
    "/admin/tenants/{tenant_id}/users/{user_id}/disable",
    response_model=UserOut,
    summary="Disable a user: all their keys and tokens are refused (tenant admins)",
)
def disable_user(tenant_id: TenantPath, user_id: UserPath, actor: CurrentActor, prov: ProvisioningDep) -> UserOut:
    return _user(prov.set_user_disabled(actor, tenant_id, user_id, True))


@router.post(
    "/admin/tenants/{tenant_id}/users/{user_id}/enable",
    response_model=UserOut,
    summary="Re-enable a user (tenant admins)",
)
def enable_user(tenant_id: TenantPath, user_id: UserPath, actor: CurrentActor, prov: ProvisioningDep) -> UserOut:
    return _user(prov.set_user_disabled(actor, tenant_id, user_id, False))


@router.patch(
    "/admin/tenants/{tenant_id}/users/{user_id}/grants",
    response_model=UserOut,
    summary="Grant or revoke projects, teams, roles",
)
def change_grants(
    tenant_id: TenantPath,
    user_id: UserPath,
    body: GrantsPatch,
    actor: CurrentActor,
    prov: ProvisioningDep,
) -> UserOut:
    change = GrantChange(**body.model_dump())
    return _user(prov.change_grants(actor, tenant_id, user_id, change))


@router.post(
    "/admin/tenants/{tenant_id}/users/{user_id}/keys",
    response_model=IssuedKeyOut,
    status_code=status.HTTP_201_CREATED,
    summary="Issue an API key (the secret is in the response, once)",
)
def issue_key(
    tenant_id: TenantPath,
    user_id: UserPath,
    body: KeyIn,
    actor: CurrentActor,
    prov: ProvisioningDep,
) -> IssuedKeyOut:
    grants = None
    if body.roles is not None or body.projects is not None or body.teams is not None:
        user = prov.get_user(actor, tenant_id, user_id)
        grants = Grants(
            roles=body.roles if body.roles is not None else user.roles,
            projects=body.projects if body.projects is not None else user.projects,
            teams=body.teams if body.teams is not None else user.teams,
        )
    issued = prov.issue_key(actor, tenant_id, user_id, name=body.name, grants=grants, expires_in_s=body.expires_in_s)
    return IssuedKeyOut(**_key(issued.record).model_dump(), key=issued.plaintext)


@router.get(
    "/admin/tenants/{tenant_id}/keys",
    response_model=KeyPage,
    summary="List API keys, never their secrets (cursor pagination)",
)
def list_keys(
    tenant_id: TenantPath, actor: CurrentActor, prov: ProvisioningDep, limit: Limit = 100, cursor: Cursor = None
) -> KeyPage:
    keys, next_cursor = prov.list_keys(actor, tenant_id, size=limit, after=cursor)
    return KeyPage(items=[_key(k) for k in keys], next_cursor=next_cursor)


@router.delete(
    "/admin/keys/{key_id}",
    response_model=KeyOut,
    summary="Revoke an API key (admins, or the key's own user)",
)
def revoke_key(key_id: KeyPath, actor: CurrentActor, prov: ProvisioningDep) -> KeyOut:
    return _key(prov.revoke_key(actor, key_id))


@router.post(
    "/admin/tenants/{tenant_id}/users/{user_id}/tokens",
    response_model=TokenOut,
    status_code=status.HTTP_201_CREATED,
    summary="Issue a development JWT (HS256; only when a development secret is configured)",
)
def dev_token(
    tenant_id: TenantPath,
    user_id: UserPath,
    actor: CurrentActor,
    prov: ProvisioningDep,
    body: TokenIn | None = None,
) -> TokenOut:
    token, exp = prov.dev_token(actor, tenant_id, user_id, body.ttl_s if body else None)
    return TokenOut(token=token, expires_at=exp)


@router.post(
    "/admin/tokens/revoke",
    response_model=TokenRevokedOut,
    summary="Revoke a JWT (by its jti) until it expires (its own user, or an admin of its tenant)",
)
def revoke_token(body: TokenRevokeIn, actor: CurrentActor, prov: ProvisioningDep) -> TokenRevokedOut:
    return TokenRevokedOut(**prov.revoke_token(actor, body.token))
