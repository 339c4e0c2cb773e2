"""Console sessions: a sign-in exchanges a verified credential for a random session id kept in an
HttpOnly cookie; the session itself lives in Redis under the deployment's namespace, so signing out
(or an operator deleting the key) revokes it at once, everywhere.

Only a hash of the session id is used as the Redis key, so a Redis dump does not hold usable
cookies. The credential's secret is never stored: each request re-validates the credential by its
id (:meth:`Authenticator.revalidate`), so revoking the key, revoking the JWT or disabling the account
ends the session too. Each session carries its own CSRF token, checked on every form post.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass, replace

import redis

from service import redis_keys
from service.auth.authenticator import CredentialKind, Identity
from service.domain.principal import Principal, Role
from service.errors import StoreUnavailable

COOKIE = "tenure_console"
LOGIN_CSRF_COOKIE = "tenure_console_login"


@dataclass(frozen=True)
class ConsoleSession:
    session_id: str
    csrf_token: str
    tenant_id: str
    user_id: str
    kind: CredentialKind
    credential_id: str | None
    roles: tuple[str, ...]
    projects: tuple[str, ...]
    teams: tuple[str, ...]
    created_at: float
    expires_at: float  # absolute end, whatever the activity
    # An operator's choice of the tenant the console shows (None: the credential's own). Honoured
    # only while the re-validated credential is still an operator's (:func:`console_user`).
    viewing_tenant: str | None = None
    # A development token of this service: roles/projects/teams above are its claims, narrowed to
    # its user's grants on every request (Authenticator.revalidate)
    issued_here: bool = False

    def identity(self) -> Identity:
        """The identity as signed in; :meth:`Authenticator.revalidate` refreshes it per request."""
        principal = Principal(
            tenant_id=self.tenant_id,
            user_id=self.user_id,
            roles=frozenset(Role(r) for r in self.roles),
            projects=frozenset(self.projects),
            teams=frozenset(self.teams),
        )
        if self.issued_here:
            return Identity(principal, self.kind, self.credential_id, issued_here=True, claimed=principal)
        return Identity(principal, self.kind, self.credential_id)

    def csrf_ok(self, submitted: str | None) -> bool:
        return bool(submitted) and same_token(self.csrf_token, str(submitted))

    def notice_mac(self, notice: str) -> str:
        """The signature of a notice the console puts in its own redirect (``?notice=…&sig=…``),
        keyed by this session's secret token: a notice in anyone else's link is not shown."""
        message = b"notice\0" + notice.encode("utf-8", "surrogatepass")
        return hmac.new(self.csrf_token.encode(), message, hashlib.sha256).hexdigest()

    def notice_ok(self, notice: str, mac: str) -> bool:
        return same_token(self.notice_mac(notice), mac)


def same_token(expected: str, submitted: str) -> bool:
    """Constant-time comparison of a CSRF token with what a form posted. As bytes: compare_digest
    raises TypeError on a str that is not ASCII (a posted ``é`` answered 500, not 403)."""
    encoded = [value.encode("utf-8", "surrogatepass") for value in (expected, submitted)]
    return hmac.compare_digest(*encoded)


class SessionStore:
    def __init__(self, redis_client: redis.Redis[bytes], namespace: str, *, idle_s: int, max_s: int):
        self.redis = redis_client
        self.namespace = namespace
        self.idle_s = idle_s
        self.max_s = max_s

    def _key(self, session_id: str) -> str:
        digest = hashlib.sha256(session_id.encode()).hexdigest()
        return redis_keys.console_session(self.namespace, digest)

    def open(self, identity: Identity) -> ConsoleSession:
        now = time.time()
        end = now + self.max_s
        if identity.expires_at is not None:
            end = min(end, float(identity.expires_at))
        p = identity.claimed or identity.principal  # the claims: each request narrows them again
        session = ConsoleSession(
            session_id=secrets.token_urlsafe(32),
            csrf_token=secrets.token_urlsafe(32),
            tenant_id=p.tenant_id,
            user_id=p.user_id,
            kind=identity.kind,
            credential_id=identity.credential_id,
            roles=tuple(sorted(r.value for r in p.roles)),
            projects=tuple(sorted(p.projects)),
            teams=tuple(sorted(p.teams)),
            created_at=now,
            expires_at=end,
            issued_here=identity.issued_here,
        )
        self._write(session, now)
        return session

    def load(self, session_id: str) -> ConsoleSession | None:
        """The live session for a cookie value, its idle timer restarted; None if unknown or over."""
        if not session_id or len(session_id) > 200:
            return None
        key = self._key(session_id)
        try:
            raw = self.redis.get(key)
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; console sessions cannot be checked") from exc
        if raw is None:
            return None
        data = json.loads(raw)
        data["roles"], data["projects"], data["teams"] = (tuple(data[k]) for k in ("roles", "projects", "teams"))
        session = ConsoleSession(**data)
        now = time.time()
        if session.expires_at <= now:
            self.revoke(session_id)
            return None
        self._write(session, now)
        return session

    def view_tenant(self, session: ConsoleSession, tenant_id: str | None) -> ConsoleSession:
        """The same session, showing ``tenant_id`` from now on (None: the credential's own)."""
        changed = replace(session, viewing_tenant=tenant_id)
        self._write(changed, time.time())
        return changed

    def revoke(self, session_id: str) -> None:
        try:
            self.redis.delete(self._key(session_id))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; the session was not revoked") from exc

    def _write(self, session: ConsoleSession, now: float) -> None:
        ttl = max(1, int(min(self.idle_s, session.expires_at - now)))
        try:
            self.redis.set(self._key(session.session_id), json.dumps(asdict(session)), ex=ttl)
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; cannot open a console session") from exc
