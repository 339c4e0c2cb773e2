"""Revoked credentials, as every check of them reads them: the request path
(:class:`service.auth.authenticator.Authenticator`) and the memory loop's extraction, which must not
write a turn whose credential was revoked while the turn waited (:class:`CredentialRevocations`).

An API key's revocation is its record's ``revoked_at`` (kept for good: keys are never deleted). A
JWT's is a Redis entry keyed on issuer + tenant + subject + ``jti`` (:class:`JtiRevocations`), kept
until the token's expiry plus however long a turn it recorded may still wait for extraction (the
tenant's turn retention): past the token's expiry no request needs it, but a waiting turn does.
"""

from __future__ import annotations

import hashlib
import time

import redis

from service import redis_keys
from service.domain.accounts import Credential
from service.errors import NotFound, StoreUnavailable
from service.storage.accounts import AccountStore

# A revocation outliving its token's expiry is kept without one past this (Redis refuses an
# expiry beyond ~2^63 ms as "invalid expire time"; a token valid for centuries is revoked for good)
MAX_REVOCATION_TTL_S = 100 * 366 * 86_400
KEY_REVOKED = "the API key that recorded the turn has been revoked"
KEY_GONE = "the API key that recorded the turn no longer exists"
TOKEN_REVOKED = "the token that recorded the turn has been revoked"  # noqa: S105 - a reason, no secret


class JtiRevocations:
    """Revoked JWT ids in Redis. A ``jti`` is only unique per issuer and subject (RFC 7519 4.1.7):
    the entry is keyed on issuer + tenant + subject + jti, so revoking a token of one tenant can
    never revoke another tenant's token that happens to carry the same id. Hashed: claims are any
    text."""

    def __init__(self, redis_client: redis.Redis[bytes], namespace: str, issuer: str, leeway_s: int):
        self.redis = redis_client
        self.namespace = namespace
        self.issuer = issuer
        self.leeway_s = leeway_s

    def key(self, tenant_id: str, user_id: str, jti: str) -> str:
        digest = hashlib.sha256("\0".join((self.issuer, tenant_id, user_id, jti)).encode()).hexdigest()
        return redis_keys.revoked_jwt(self.namespace, digest)

    def revoked(self, tenant_id: str, user_id: str, jti: str) -> bool:
        """Whether the token ``jti`` of that subject is revoked. Fails closed: if Redis cannot
        answer, :class:`StoreUnavailable` (a request answers 503, extraction tries again later)."""
        # Revocations written before the key included the tenant and subject (``revoked-jti:``) are
        # honoured until they expire with their tokens; nothing writes them any more.
        legacy = redis_keys.legacy_revoked_jti(self.namespace, jti)
        try:
            return bool(self.redis.exists(self.key(tenant_id, user_id, jti), legacy))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; cannot check token revocation") from exc

    def revoke(self, tenant_id: str, user_id: str, jti: str, expires_at: int, kept_after_s: int | None) -> None:
        """Revoke the token until ``kept_after_s`` past its expiry (None: for good; so too when that
        lies past what Redis can time, or centuries away)."""
        if kept_after_s is None:
            ttl: int | None = None
        else:
            ttl = max(1, expires_at - int(time.time()) + self.leeway_s + kept_after_s)
            ttl = ttl if ttl <= MAX_REVOCATION_TTL_S else None
        try:
            self.redis.set(self.key(tenant_id, user_id, jti), "1", ex=ttl)
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable; the token was not revoked") from exc


class CredentialRevocations:
    """Whether the one credential a turn was recorded with has been revoked since, by the check a
    request with it meets (the key's record, the token's Redis entry). Only explicit revocation
    counts: a key or token that merely expired after the turn was recorded authenticated the turn
    while it was valid, and its turn is extracted (``docs/memory-loop.md``, "Merge rules")."""

    def __init__(self, accounts: AccountStore, jtis: JtiRevocations):
        self.accounts = accounts
        self.jtis = jtis

    def refusal(
        self, tenant_id: str, user_id: str, credential: Credential | None, credential_id: str | None
    ) -> str | None:
        """Why the turn's credential refuses it now (None: it does not, or the turn names no
        credential that can be revoked: recorded before turns named it, or a token without a
        ``jti``). Raises :class:`StoreUnavailable` when the store or Redis cannot answer."""
        if credential is None or credential_id is None:
            return None
        if credential == "api_key":
            try:
                key = self.accounts.get_key(credential_id)
            except NotFound:
                return KEY_GONE  # refused by every request, as a revoked one
            if (key.tenant_id, key.user_id) != (tenant_id, user_id):
                return KEY_GONE  # not this author's key: never recorded so, refused as a request would be
            return KEY_REVOKED if key.revoked_at is not None else None
        return TOKEN_REVOKED if self.jtis.revoked(tenant_id, user_id, credential_id) else None
