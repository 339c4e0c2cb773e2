"""Accounts: tenants, users with grants, and API keys (records only; storage is elsewhere).

A tenant is an isolation wall; a user belongs to exactly one tenant and holds roles plus project and
team grants. An API key is bound to one tenant and user and carries its own explicit grants, which
are intersected with the user's current grants on every use (revoking a user's grant narrows their
keys at once). The reserved tenant ``system`` holds the operators created by ``tenure bootstrap``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.domain.belief import utcnow
from service.domain.principal import Principal, Role

SYSTEM_TENANT = "system"
# Which kind of credential authenticated a request (a turn records it): each resolves grants its own
# way on every request (docs/api.md, "Authentication"), and extraction follows the same rule
# (:func:`author_at_extraction`). ``service_token``: a development JWT this service issued;
# ``idp_token``: any other JWT, an identity provider's.
Credential = Literal["api_key", "service_token", "idp_token"]
SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
GRANT_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
Slug = str


def check_slug(value: str, what: str) -> str:
    if not SLUG_RE.fullmatch(value):  # not match: its "$" also passes a final newline
        raise ValueError(f"{what} must match {SLUG_RE.pattern} (lower-case letters, digits, '_', '-', '.')")
    return value


def _grants(values: list[str]) -> list[str]:
    out: list[str] = []
    for raw in values:
        value = raw.strip().lower()
        if not GRANT_RE.match(value):
            raise ValueError(f"invalid grant {raw!r}: expected a slug like 'payments' (no 'project:' prefix)")
        if value not in out:
            out.append(value)
    return sorted(out)


class TenantRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    name: str = Field("", max_length=200)
    disabled: bool = False
    created_by: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Grants(BaseModel):
    model_config = ConfigDict(extra="forbid")

    roles: list[Role] = Field(default_factory=lambda: [Role.MEMBER])
    projects: list[str] = Field(default_factory=list, max_length=256)
    teams: list[str] = Field(default_factory=list, max_length=256)

    _norm = field_validator("projects", "teams")(_grants)

    @field_validator("roles")
    @classmethod
    def _roles(cls, values: list[Role]) -> list[Role]:
        return sorted(set(values) | {Role.MEMBER}, key=lambda r: r.value)


class UserRecord(Grants):
    tenant_id: str
    user_id: str
    disabled: bool = False
    created_by: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class ApiKeyRecord(Grants):
    key_id: str
    tenant_id: str
    user_id: str
    name: str = Field("", max_length=200)
    key_hash: str
    created_by: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


def effective_principal(user: UserRecord, grants: Grants | None = None) -> Principal:
    """The principal a credential acts as: the user's grants, narrowed by the key's if any."""
    roles = set(user.roles)
    projects = set(user.projects)
    teams = set(user.teams)
    if grants is not None:
        roles &= set(grants.roles)
        projects &= set(grants.projects)
        teams &= set(grants.teams)
    return Principal(
        tenant_id=user.tenant_id,
        user_id=user.user_id,
        roles=frozenset(roles | {Role.MEMBER}),
        projects=frozenset(projects),
        teams=frozenset(teams),
    )


def narrowed(principal: Principal, grants: Grants) -> Principal:
    """``principal`` limited to what ``grants`` allow now: a credential that copied its user's
    grants when it was issued (a development token) holds no more than the user still has."""
    return Principal(
        tenant_id=principal.tenant_id,
        user_id=principal.user_id,
        roles=frozenset((principal.roles & set(grants.roles)) | {Role.MEMBER}),
        projects=principal.projects & frozenset(grants.projects),
        teams=principal.teams & frozenset(grants.teams),
    )


def is_operator(principal: Principal) -> bool:
    """An admin of the reserved system tenant: may provision any tenant."""
    return principal.tenant_id == SYSTEM_TENANT and principal.is_admin


def author_at_extraction(
    recorded: Principal, credential: Credential | None, disabled: bool, grants: Grants | None
) -> Principal | None:
    """Who writes a turn's beliefs when its extraction runs, by the rule a request of the same
    credential would meet now (``service/auth/authenticator.py``): ``recorded`` is the author with
    the grants the turn was authenticated with, ``disabled`` and ``grants`` the account records as
    they are now (the tenant's or user's disabled flag, the user's grants; None: no user record).
    None: that request would be refused, so the turn writes nothing.

    - a disabled tenant or user refuses every credential;
    - an identity provider's token keeps its own claims: a user record here only disables it;
    - an API key or a development token acts with the grants it carried that the user still holds,
      and is refused once the user's record is gone;
    - a turn recorded before turns named their credential (None) keeps the rule those turns always
      had: narrowed to the user's record when there is one, as recorded without one.
    """
    if disabled:
        return None
    if credential == "idp_token":
        return recorded
    if grants is None:
        return recorded if credential is None else None
    return narrowed(recorded, grants)
