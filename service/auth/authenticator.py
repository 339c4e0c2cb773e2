"""Bearer credential -> :class:`Identity` (a principal plus what authenticated it).

Two credential kinds share the ``Authorization: Bearer`` header: API keys (``tnr_...``) and JWTs.

API key revocation bound: a verified key is cached in-process for ``api_key_cache_s`` (default 5 s).
The process that handles a revoke drops its cache entry at once; every other process stops accepting
the key within that bound. Tenant/user disablement and grant changes follow the same bound.

Disabled accounts: an API key is refused when its user or tenant is disabled (checked when the key
is loaded). A JWT is refused when the account record of its subject or tenant is disabled: one
``mget``, cached per (tenant, user) for the same ``api_key_cache_s`` bound. If OpenSearch cannot
answer, the last known status is used, and with none known the token passes (logged): the
proxy must keep answering JWT callers without the store, and everything else needs OpenSearch
anyway.

JWT revocation: a token with a ``jti`` can be revoked; issuer + tenant + subject + jti are kept in
Redis until the token's own expiry and checked on every request (one Redis EXISTS), so it takes
effect at once everywhere.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import redis

from service import redis_keys
from service.auth import keys
from service.auth.tokens import TokenVerifier, principal_from_claims
from service.config import AuthSettings
from service.domain.accounts import ApiKeyRecord, effective_principal
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import InvalidCredential, NotFound, StoreUnavailable, Unauthenticated
from service.storage.accounts import AccountStore

log = logging.getLogger(__name__)

CredentialKind = Literal["api_key", "jwt"]
REJECTED_KEY = "invalid or revoked API key"


@dataclass(frozen=True)
class Identity:
    principal: Principal
    kind: CredentialKind
    credential_id: str | None = None  # the key id for API keys, the jti (if any) for JWTs
    expires_at: int | None = None  # a JWT's exp (epoch seconds): a console session never outlives it


@dataclass(frozen=True)
class _Cached:
    until: float
    key_hash: str
    identity: Identity


@dataclass(frozen=True)
class _Status:
    until: float
    disabled: bool


class Authenticator:
    def __init__(
        self,
        settings: AuthSettings,
        accounts: AccountStore,
        verifier: TokenVerifier,
        redis_client: redis.Redis[bytes],
        namespace: str,
    ):
        self.settings = settings
        self.accounts = accounts
        self.verifier = verifier
        self.redis = redis_client
        self.namespace = namespace
        self._cache: dict[str, _Cached] = {}
        self._status: dict[tuple[str, str], _Status] = {}
        self._bookkeeping = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-last-used")
        self._lock = threading.Lock()

    def authenticate(self, token: str) -> Identity:
        if keys.looks_like_key(token):
            return self._api_key(token)
        claims = self.verifier.verify(token)
        jti = claims.get("jti")
        jti = jti if isinstance(jti, str) else None
        principal = principal_from_claims(claims)
        if jti is not None and self._jti_revoked(principal, jti):
            raise Unauthenticated("this token has been revoked")
        if self._account_disabled(principal.tenant_id, principal.user_id):
            raise Unauthenticated("this account is disabled")
        exp = claims.get("exp")
        return Identity(principal, "jwt", jti, exp if isinstance(exp, int) else None)

    def revalidate(self, identity: Identity) -> Identity:
        """The identity a console session was opened with, checked again without its secret:
        an API key must still exist, be unrevoked and unexpired, and its user and tenant enabled
        (grant changes apply); a JWT must not be revoked and its account not disabled. The same
        in-process cache and bound (``api_key_cache_s``) as a bearer key, so a session learns of
        a revocation exactly when a REST call would. Raises :class:`Unauthenticated` otherwise."""
        if identity.kind == "api_key":
            if identity.credential_id is None:
                raise Unauthenticated(REJECTED_KEY)
            return self._key_by_id(identity.credential_id)
        if identity.credential_id is not None and self._jti_revoked(identity.principal, identity.credential_id):
            raise Unauthenticated("this token has been revoked")
        if self._account_disabled(identity.principal.tenant_id, identity.principal.user_id):
            raise Unauthenticated("this account is disabled")
        return identity

    # ----------------------------------------------------------------- JWTs

    def _revoked_key(self, principal: Principal, jti: str) -> str:
        """A ``jti`` is only unique per issuer and subject (RFC 7519 4.1.7): the revocation is
        keyed on issuer + tenant + subject + jti, so revoking a token of one tenant can never
        revoke another tenant's token that happens to carry the same id. Hashed: claims are
        any text."""
        parts = (self.settings.jwt_issuer, principal.tenant_id, principal.user_id, jti)
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
        return redis_keys.revoked_jwt(self.namespace, digest)

    def _jti_revoked(self, principal: Principal, jti: str) -> bool:
        """Revoked token ids live in Redis until the token would have expired anyway. Fails
        closed: if Redis cannot answer, the request is refused (503), not waved through."""
        # Revocations written before the key included the tenant and subject (``revoked-jti:``) are
        # honoured until they expire with their tokens; nothing writes them any more.
        legacy = redis_keys.legacy_revoked_jti(self.namespace, jti)
        try:
            return bool(self.redis.exists(self._revoked_key(principal, jti), legacy))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; cannot check token revocation") from exc

    def revoke_jti(self, principal: Principal, jti: str, expires_at: int) -> None:
        """Revoke the token ``jti`` of ``principal`` (its tenant and subject) until it expires."""
        ttl = max(1, expires_at - int(time.time()) + self.settings.jwt_leeway_s)
        try:
            self.redis.set(self._revoked_key(principal, jti), "1", ex=ttl)
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; the token was not revoked") from exc

    def forget_key(self, key_id: str) -> None:
        with self._lock:
            self._cache.pop(key_id, None)

    def forget_account(self, tenant_id: str, user_id: str | None = None) -> None:
        """Drop everything cached for a user (or, without ``user_id``, a whole tenant), so the
        process that disables an account enforces it at once; others follow within the bound."""

        def matches(tenant: str, user: str) -> bool:
            return tenant == tenant_id and (user_id is None or user == user_id)

        with self._lock:
            for key_id in [k for k, c in self._cache.items() if matches(*_owner(c.identity))]:
                del self._cache[key_id]
            for account in [a for a in self._status if matches(*a)]:
                del self._status[account]

    def _account_disabled(self, tenant_id: str, user_id: str) -> bool:
        account = (tenant_id, user_id)
        now = time.monotonic()
        with self._lock:
            known = self._status.get(account)
        if known is not None and known.until > now:
            return known.disabled
        try:
            disabled = self.accounts.is_disabled(tenant_id, user_id)
        except StoreUnavailable as exc:
            disabled = known.disabled if known is not None else False
            log.warning("account status of %s/%s unknown (%s); using %s", tenant_id, user_id, exc.message, disabled)
        if self.settings.api_key_cache_s > 0:
            # Also cached after a failure, so an outage does not cost every request a timeout.
            with self._lock:
                self._status[account] = _Status(now + self.settings.api_key_cache_s, disabled)
        return disabled

    # ------------------------------------------------------------- API keys

    def cached(self, token: str) -> Identity | None:
        """The identity of an API key verified within the cache bound, checked without any I/O
        (the event loop's fast path); None when only :meth:`authenticate` can tell."""
        key_id = keys.parse_key_id(token) if keys.looks_like_key(token) else None
        return self._cached_key(key_id, token) if key_id is not None else None

    def _cached_key(self, key_id: str, token: str) -> Identity | None:
        pepper = self.settings.api_key_pepper.get_secret_value()
        with self._lock:
            cached = self._cache.get(key_id)
        if cached and cached.until > time.monotonic() and keys.matches(token, cached.key_hash, pepper):
            return cached.identity
        return None

    def _api_key(self, token: str) -> Identity:
        key_id = keys.parse_key_id(token)
        if key_id is None:
            raise InvalidCredential("malformed API key")
        known = self._cached_key(key_id, token)
        if known is not None:
            return known
        pepper = self.settings.api_key_pepper.get_secret_value()
        identity, key_hash = self._load_key(key_id, token, pepper)
        self._remember(key_id, key_hash, identity)
        self._touch(key_id)
        return identity

    def _key_by_id(self, key_id: str) -> Identity:
        with self._lock:
            cached = self._cache.get(key_id)
        if cached and cached.until > time.monotonic():
            return cached.identity
        record = self._key_record(key_id)
        identity = self._usable_key(record)
        self._remember(key_id, record.key_hash, identity)
        return identity

    def _remember(self, key_id: str, key_hash: str, identity: Identity) -> None:
        if self.settings.api_key_cache_s > 0:
            with self._lock:
                self._cache[key_id] = _Cached(time.monotonic() + self.settings.api_key_cache_s, key_hash, identity)

    def _load_key(self, key_id: str, token: str, pepper: str) -> tuple[Identity, str]:
        record = self._key_record(key_id)
        if not keys.matches(token, record.key_hash, pepper):
            raise InvalidCredential(REJECTED_KEY)
        return self._usable_key(record), record.key_hash

    def _key_record(self, key_id: str) -> ApiKeyRecord:
        try:
            return self.accounts.get_key(key_id)
        except NotFound as exc:
            raise InvalidCredential(REJECTED_KEY) from exc

    def _usable_key(self, record: ApiKeyRecord) -> Identity:
        """The identity of a key whose secret has been checked (or, for a console session, was
        checked at sign-in): refused when revoked, expired, or its user or tenant is disabled."""
        if record.revoked_at is not None or (record.expires_at is not None and record.expires_at <= utcnow()):
            raise Unauthenticated(REJECTED_KEY)
        try:
            user, tenant = self.accounts.owner_records(record.tenant_id, record.user_id)
        except NotFound as exc:
            raise Unauthenticated(REJECTED_KEY) from exc
        if user.disabled or tenant.disabled:
            raise Unauthenticated(REJECTED_KEY)
        return Identity(effective_principal(user, record), "api_key", record.key_id)

    def _touch(self, key_id: str) -> None:
        """Write last_used_at at most once per interval per key, across all processes: a Redis
        SET NX with expiry elects the one request that writes. The write itself (an fsynced
        update, ~3 ms) runs on a background thread, off the request path."""
        gate = redis_keys.key_used(self.namespace, key_id)
        try:
            elected = self.redis.set(gate, "1", nx=True, ex=self.settings.last_used_interval_s)
        except redis.RedisError as exc:
            log.warning("could not record API key use for %s: %s", key_id, exc)
            return
        if elected:
            self._bookkeeping.submit(self._write_last_used, key_id, utcnow())

    def _write_last_used(self, key_id: str, when: datetime) -> None:
        try:
            self.accounts.touch_key(key_id, when)
        except StoreUnavailable as exc:
            # Last-used is bookkeeping: never fail an authenticated request over it.
            log.warning("could not record API key use for %s: %s", key_id, exc.message)


def _owner(identity: Identity) -> tuple[str, str]:
    return identity.principal.tenant_id, identity.principal.user_id
