"""Provisioning: tenants, users, grants, API keys and development tokens.

Who may do what:
- operators (admins of the reserved ``system`` tenant, created by ``tenure bootstrap``) create
  tenants and may administer any tenant;
- a tenant admin administers users, grants and keys of their own tenant only;
- any user may revoke their own keys.
Everything is audited under the tenant it concerns. Key secrets are returned once and never stored.

Every account write bumps the tenant's accounts version (in ``AccountStore``), which makes every
process re-check the tenant's cached credentials at their next request: a revoked key, a disabled
user or tenant, a taken grant take effect at once everywhere (``service/auth/authenticator.py``).
A request that finds its change already made bumps again: its earlier attempt may have written
the change and failed to bump.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from service.auth import keys
from service.auth.actor import Actor
from service.auth.authenticator import Authenticator
from service.auth.tokens import TokenVerifier, dev_token_id, expiry, principal_from_claims
from service.config import AuthSettings, RetentionSettings
from service.domain.accounts import (
    SYSTEM_TENANT,
    ApiKeyRecord,
    Grants,
    TenantRecord,
    UserRecord,
    check_slug,
    effective_principal,
    is_operator,
)
from service.domain.belief import utcnow
from service.domain.principal import Principal, Role
from service.errors import Conflict, Forbidden, NotFound, StoreUnavailable, Unauthenticated, ValidationFailed
from service.outbox import RedisOutbox
from service.storage.accounts import AccountStore
from service.storage.audit import AuditEvent, AuditStore

log = logging.getLogger(__name__)

BOOTSTRAP_USER = "root"


@dataclass(frozen=True)
class IssuedKey:
    record: ApiKeyRecord
    plaintext: str


@dataclass(frozen=True)
class GrantChange:
    add_projects: list[str]
    remove_projects: list[str]
    add_teams: list[str]
    remove_teams: list[str]
    add_roles: list[Role]
    remove_roles: list[Role]


def _slug(value: str, what: str) -> str:
    try:
        return check_slug(value, what)
    except ValueError as exc:
        raise ValidationFailed(str(exc)) from exc


def _self(actor: Actor, tenant_id: str, user_id: str) -> bool:
    """Whether the user ``tenant_id``/``user_id`` is the actor's own."""
    return (actor.principal.tenant_id, actor.principal.user_id) == (tenant_id, user_id)


def _enabled(user: UserRecord) -> UserRecord:
    """New credentials for a disabled user would only fail at use: refuse them up front."""
    if user.disabled:
        raise Conflict(f"user {user.user_id!r} is disabled; enable it first")
    return user


class ProvisioningService:
    def __init__(
        self,
        accounts: AccountStore,
        audit: AuditStore,
        verifier: TokenVerifier,
        authenticator: Authenticator,
        settings: AuthSettings,
        outbox: RedisOutbox[AuditEvent] | None = None,
        retention: RetentionSettings | None = None,
    ):
        self.accounts = accounts
        # how long a revoked token's turns may still wait for extraction (None: kept for good)
        self.retention = retention
        self.audit = audit
        self.outbox = outbox  # where an event the audit index refused waits (the receipts' outbox)
        self.verifier = verifier
        self.authenticator = authenticator
        self.settings = settings

    # ----------------------------------------------------------- authority

    def acting_admin(self, principal: Principal, tenant_id: str) -> Principal:
        """The admin principal to act on ``tenant_id`` with, or 403. A tenant admin acts only on
        their own tenant; an operator acts on any existing tenant as its admin."""
        if principal.tenant_id == tenant_id and principal.is_admin:
            return principal
        if is_operator(principal):
            self.accounts.get_tenant(tenant_id)  # 404 for a tenant that does not exist
            return Principal(
                tenant_id=tenant_id,
                user_id=principal.user_id,
                roles=frozenset({Role.ADMIN, Role.MEMBER}),
            )
        raise Forbidden(f"no admin rights on tenant {tenant_id!r}")

    def _record(self, actor: Actor, tenant_id: str, action: str, details: dict[str, Any]) -> None:
        """Record a change already stored. Should the audit index not take its event, the event
        goes to the audit outbox (drained into the index by the beat task and before every audit
        read): answering 503 would lose it, since the client's retry finds the change made and
        records nothing (a revoke, a disable), or is refused as a duplicate (a creation)."""
        event = AuditEvent(
            tenant_id=tenant_id,
            action=action,
            actor_id=actor.principal.user_id,
            actor_kind=actor.kind,
            credential_id=actor.credential_id,
            request_id=actor.request_id,
            session_id=actor.session_id,
            details={"actor_tenant": actor.principal.tenant_id, **details},
        )
        try:
            self.audit.append(event)
        except StoreUnavailable as exc:
            if self.outbox is None or not self.outbox.put_if_reachable(event):
                raise
            log.warning("%s recorded in the audit outbox: the audit index refused it (%s)", action, exc.message)

    # -------------------------------------------------------------- tenants

    def create_tenant(self, actor: Actor, tenant_id: str, name: str) -> TenantRecord:
        if not is_operator(actor.principal):
            raise Forbidden("creating tenants needs an operator credential (see `tenure bootstrap`)")
        _slug(tenant_id, "tenant_id")
        if tenant_id == SYSTEM_TENANT:
            raise Conflict(f"tenant id {SYSTEM_TENANT!r} is reserved")
        tenant = TenantRecord(tenant_id=tenant_id, name=name, created_by=actor.principal.user_id)
        self.accounts.create_tenant(tenant)
        self._record(actor, tenant_id, "tenant.create", {"name": name})
        return tenant

    def list_tenants(self, actor: Actor, *, size: int = 500) -> list[TenantRecord]:
        """Operators only (the console's tenant switcher)."""
        if not is_operator(actor.principal):
            raise Forbidden("listing tenants needs an operator credential")
        return self.accounts.list_tenants(actor.principal, size=size)

    def get_tenant(self, actor: Actor, tenant_id: str) -> TenantRecord:
        self.acting_admin(actor.principal, tenant_id)
        return self.accounts.get_tenant(tenant_id)

    def set_tenant_disabled(self, actor: Actor, tenant_id: str, disabled: bool) -> TenantRecord:
        """Operators only: a tenant admin must not be able to re-enable a tenant an operator shut
        off. Disabling refuses every credential of the tenant (API keys and JWTs)."""
        if not is_operator(actor.principal):
            raise Forbidden("disabling or enabling a tenant needs an operator credential")
        if tenant_id == SYSTEM_TENANT and disabled:
            raise Conflict(f"the operators' tenant {SYSTEM_TENANT!r} cannot be disabled")
        for _ in range(3):
            tenant, seq, term = self.accounts.get_tenant_versioned(tenant_id)
            if tenant.disabled == disabled:
                self.accounts.bump_version(tenant_id)  # a retry after a failed bump: bump now
                return tenant  # already so: nothing changed, nothing to audit
            updated = tenant.model_copy(update={"disabled": disabled})
            try:
                self.accounts.replace_tenant(updated, (seq, term))
            except Conflict:
                continue
            self._record(actor, tenant_id, "tenant.disable" if disabled else "tenant.enable", {})
            return updated
        raise Conflict(f"tenant {tenant_id!r} was changed concurrently; retry")

    # ---------------------------------------------------------------- users

    def create_user(self, actor: Actor, tenant_id: str, user_id: str, grants: Grants) -> UserRecord:
        self.acting_admin(actor.principal, tenant_id)
        _slug(user_id, "user_id")
        self.accounts.get_tenant(tenant_id)
        user = UserRecord(
            tenant_id=tenant_id,
            user_id=user_id,
            created_by=actor.principal.user_id,
            **grants.model_dump(),
        )
        self.accounts.create_user(user)
        self._record(actor, tenant_id, "user.create", {"user_id": user_id, **grants.model_dump(mode="json")})
        return user

    def get_user(self, actor: Actor, tenant_id: str, user_id: str) -> UserRecord:
        self.acting_admin(actor.principal, tenant_id)
        return self.accounts.get_user(tenant_id, user_id)

    def list_users(
        self, actor: Actor, tenant_id: str, *, size: int, after: str | None = None
    ) -> tuple[list[UserRecord], str | None]:
        return self.accounts.list_users(self.acting_admin(actor.principal, tenant_id), size=size, after=after)

    def set_user_disabled(self, actor: Actor, tenant_id: str, user_id: str, disabled: bool) -> UserRecord:
        """Tenant admins (and operators) disable or re-enable a user; every key and token of a
        disabled user is refused. Nobody disables themselves: that would be a lock-out."""
        self.acting_admin(actor.principal, tenant_id)
        if disabled and _self(actor, tenant_id, user_id):
            raise Conflict("you cannot disable your own user; ask another admin")
        for _ in range(3):
            user, seq, term = self.accounts.get_user_versioned(tenant_id, user_id)
            if user.disabled == disabled:
                self.accounts.bump_version(tenant_id)  # a retry after a failed bump: bump now
                return user  # already so: nothing changed, nothing to audit
            updated = user.model_copy(update={"disabled": disabled})
            try:
                self.accounts.replace_user(updated, (seq, term))
            except Conflict:
                continue
            self._record(actor, tenant_id, "user.disable" if disabled else "user.enable", {"user_id": user_id})
            return updated
        raise Conflict(f"user {user_id!r} was changed concurrently; retry")

    def change_grants(self, actor: Actor, tenant_id: str, user_id: str, change: GrantChange) -> UserRecord:
        self.acting_admin(actor.principal, tenant_id)
        if Role.ADMIN in change.remove_roles and _self(actor, tenant_id, user_id):
            # a lock-out, as disabling oneself: the tenant could be left with no admin
            raise Conflict("you cannot remove your own admin role; ask another admin")
        for _ in range(3):
            user, seq, term = self.accounts.get_user_versioned(tenant_id, user_id)
            projects = (set(user.projects) | set(change.add_projects)) - set(change.remove_projects)
            teams = (set(user.teams) | set(change.add_teams)) - set(change.remove_teams)
            roles = (set(user.roles) | set(change.add_roles)) - set(change.remove_roles)
            updated = UserRecord.model_validate(
                {
                    **user.model_dump(),
                    "projects": sorted(projects),
                    "teams": sorted(teams),
                    "roles": sorted(roles, key=lambda r: r.value),
                }
            )
            if all(getattr(updated, name) == getattr(user, name) for name in Grants.model_fields):
                self.accounts.bump_version(tenant_id)  # a retry after a failed bump: bump now
                return user  # already so: nothing changed, nothing to audit
            try:
                self.accounts.replace_user(updated, (seq, term))
            except Conflict:
                continue
            self._record(
                actor,
                tenant_id,
                "grants.update",
                {
                    "user_id": user_id,
                    "before": user.model_dump(mode="json", include={"roles", "projects", "teams"}),
                    "after": updated.model_dump(mode="json", include={"roles", "projects", "teams"}),
                },
            )
            return updated
        raise Conflict(f"user {user_id!r} was changed concurrently; retry")

    # ----------------------------------------------------------------- keys

    def issue_key(
        self,
        actor: Actor,
        tenant_id: str,
        user_id: str,
        *,
        name: str = "",
        grants: Grants | None = None,
        expires_in_s: int | None = None,
    ) -> IssuedKey:
        """A new key bound to one user; its grants default to the user's and may only narrow."""
        self.acting_admin(actor.principal, tenant_id)
        user = self._issuable(tenant_id, user_id)
        chosen = grants or Grants(roles=user.roles, projects=user.projects, teams=user.teams)
        beyond = {
            "projects": sorted(set(chosen.projects) - set(user.projects)),
            "teams": sorted(set(chosen.teams) - set(user.teams)),
            "roles": sorted(r.value for r in set(chosen.roles) - set(user.roles)),
        }
        if any(beyond.values()):
            raise ValidationFailed("a key cannot carry grants its user does not hold", details=beyond)
        new = keys.generate()
        record = ApiKeyRecord(
            key_id=new.key_id,
            tenant_id=tenant_id,
            user_id=user_id,
            name=name,
            key_hash=keys.hash_key(new.plaintext, self.settings.api_key_pepper.get_secret_value()),
            created_by=actor.principal.user_id,
            expires_at=utcnow() + timedelta(seconds=expires_in_s) if expires_in_s else None,
            **chosen.model_dump(),
        )
        self.accounts.create_key(record)
        self._record(
            actor,
            tenant_id,
            "key.issue",
            {"key_id": record.key_id, "user_id": user_id, "name": name},
        )
        return IssuedKey(record=record, plaintext=new.plaintext)

    def revoke_key(self, actor: Actor, key_id: str) -> ApiKeyRecord:
        for _ in range(3):
            try:
                record, seq, term = self.accounts.get_key_versioned(key_id)
            except NotFound:
                raise NotFound(f"API key {key_id!r} not found") from None
            if not _self(actor, record.tenant_id, record.user_id):
                try:
                    self.acting_admin(actor.principal, record.tenant_id)
                except (Forbidden, NotFound):
                    raise NotFound(f"API key {key_id!r} not found") from None  # no oracle across tenants
            if record.revoked_at is not None:
                self.accounts.bump_version(record.tenant_id)  # a retry after a failed bump: bump now
                return record
            record.revoked_at = utcnow()
            try:
                self.accounts.replace_key(record, (seq, term))
            except Conflict:
                continue
            self._record(actor, record.tenant_id, "key.revoke", {"key_id": key_id, "user_id": record.user_id})
            return record
        raise Conflict(f"API key {key_id!r} was changed concurrently; retry")

    def _issuable(self, tenant_id: str, user_id: str) -> UserRecord:
        """The user new credentials are for. A disabled tenant's or user's would only fail at use:
        refused up front (409), so nobody hands out a key that cannot work."""
        if self.accounts.get_tenant(tenant_id).disabled:
            raise Conflict(f"tenant {tenant_id!r} is disabled; enable it first")
        return _enabled(self.accounts.get_user(tenant_id, user_id))

    def list_keys(
        self, actor: Actor, tenant_id: str, *, size: int, after: str | None = None
    ) -> tuple[list[ApiKeyRecord], str | None]:
        return self.accounts.list_keys(self.acting_admin(actor.principal, tenant_id), size=size, after=after)

    # ---------------------------------------------------------------- tokens

    def dev_token(self, actor: Actor, tenant_id: str, user_id: str, ttl_s: int | None) -> tuple[str, int]:
        self.acting_admin(actor.principal, tenant_id)
        if self.settings.jwt_hs256_secret is None:
            raise ValidationFailed("development tokens are disabled: set TENURE_AUTH_JWT_HS256_SECRET")
        user = self._issuable(tenant_id, user_id)
        jti = dev_token_id()  # in the audit event too: requests with the token are audited under it
        token, exp = self.verifier.issue_dev_token(effective_principal(user), ttl_s=ttl_s, jti=jti)
        self._record(actor, tenant_id, "token.issue", {"user_id": user_id, "jti": jti, "expires_at": exp})
        return token, exp

    def revoke_token(self, actor: Actor, token: str) -> dict[str, Any]:
        """Revoke a JWT by its ``jti`` until it expires. Allowed for the token's own user and for
        admins of its tenant; the token must verify (a forged one cannot be used to probe)."""
        try:
            claims = self.verifier.verify(token)
            subject = principal_from_claims(claims)
        except Unauthenticated as exc:
            # the body's token, not the caller's credential: a 401 would tell the client its own
            # credential failed (the CLI then asked the admin to check their key)
            raise ValidationFailed(
                f"the token to revoke does not verify: {exc.message}",
                details=[{"loc": ["body", "token"], "msg": exc.message}],
            ) from exc
        jti, exp = claims.get("jti"), expiry(claims)
        if not isinstance(jti, str) or exp is None:
            raise ValidationFailed("this token has no jti/exp claim, so it cannot be revoked")
        if not _self(actor, subject.tenant_id, subject.user_id):
            self.acting_admin(actor.principal, subject.tenant_id)
        self.authenticator.revoke_jti(subject, jti, exp, kept_after_s=self._turns_kept_s(subject.tenant_id))
        self._record(actor, subject.tenant_id, "token.revoke", {"jti": jti, "user_id": subject.user_id})
        return {"jti": jti, "revoked": True, "expires_at": exp}

    def _turns_kept_s(self, tenant_id: str) -> int | None:
        """How long past its expiry a token's revocation is kept: a turn the token recorded may
        wait for extraction (the sweep, an admin's retry of a failed turn) until the tenant's turn
        retention deletes it, and extraction must still find the token revoked. None (for good):
        turns kept for ever, or no retention known."""
        days = self.retention.for_tenant(tenant_id).turns_days if self.retention is not None else 0
        return days * 86_400 if days else None

    # ------------------------------------------------------------- bootstrap

    def bootstrap(self, user_id: str = BOOTSTRAP_USER) -> IssuedKey:
        """The first operator credential, written directly (no HTTP, no prior credential). Run by
        whoever can reach OpenSearch; idempotent except that each run issues a fresh key."""
        _slug(user_id, "user_id")
        with suppress(Conflict):  # bootstrapped before: reuse the tenant and the user
            self.accounts.create_tenant(TenantRecord(tenant_id=SYSTEM_TENANT, name="operators", created_by="bootstrap"))
        with suppress(Conflict):
            self.accounts.create_user(
                UserRecord(
                    tenant_id=SYSTEM_TENANT,
                    user_id=user_id,
                    roles=[Role.ADMIN, Role.MEMBER],
                    created_by="bootstrap",
                )
            )
        user = self.accounts.get_user(SYSTEM_TENANT, user_id)
        if user.disabled or Role.ADMIN not in user.roles:
            # its key would carry the user's grants as they are: no operator key at all
            state = "is disabled" if user.disabled else "no longer holds the admin role"
            raise Conflict(
                f"operator user {user_id!r} {state}: bootstrap another one (`tenure bootstrap --user <name>`)"
            )
        operator = Principal(tenant_id=SYSTEM_TENANT, user_id=user_id, roles=frozenset({Role.ADMIN, Role.MEMBER}))
        actor = Actor(principal=operator, kind="bootstrap")
        return self.issue_key(actor, SYSTEM_TENANT, user_id, name="bootstrap")
