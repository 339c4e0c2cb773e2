"""Bearer credential -> :class:`Identity` (a principal plus what authenticated it).

Two credential kinds share the ``Authorization: Bearer`` header: API keys (``tnr_...``) and JWTs.

**Version-validated cache.** A verified API key (and, for JWTs, an account's disabled status) is
cached in-process, tagged with its tenant's **accounts version** (:mod:`service.write_versions`)
as read *before* its records were loaded. Every write of a tenant's account records (key issue and
revoke, user and tenant disable/enable, grant changes, creations) bumps that version before and
after the write, in ``AccountStore`` (the only writer). A request reads the version in its one Redis
round trip, the rate limit's (``RateLimiter.acharge``), and is served by the cached entry only if
that version is still the one the entry was verified at; otherwise the credential is verified
again against the records as they are now (:meth:`Authenticator.verify` with that version) before
the request goes on (``service/api/deps.py:authenticate``). So a warm credential costs no
OpenSearch request and no extra Redis call, and a change takes effect **at once in every
process**: a request that starts after a revoke (or disable, or grant change) has returned reads
a version newer than that of any entry verified before the change was visible, and is re-checked.
Standalone callers (:meth:`Authenticator.authenticate`, :meth:`Authenticator.revalidate`: console
sign-in and sessions, scripts) read the version themselves (one Redis GET).

**A key's first use on the event loop.** A key met for the first time in the process is read on
the event loop (:meth:`Authenticator.averify`: the key by id, its secret checked, then key, user
and tenant in one ``mget``) when the process has read the tenant's accounts version before (in
any earlier request's round trip, :meth:`Authenticator.confirm` remembers it): the records are
tagged with that version, which was read before they were loaded, so the rule above holds; if it
is older than the request's own, the request re-checks them as for any changed tenant. Anything
else (a tenant not seen yet, a refusal, a store error) goes to :meth:`Authenticator.verify` on a
worker thread, which decides and counts refusals (``TENURE_AUTH_VERIFY_KEYS_ON_LOOP``).

Bounds: an LRU of ``credential_cache_entries`` keys (and as many JWT subjects), and a maximum age,
``credential_cache_max_age_s`` (or an API key's own expiry, if sooner), after which an entry is
re-loaded even at the same version: the safety net if Redis loses its counters, which then restart
from 0 and could climb back to an entry's version (as in :mod:`service.recall.tier_cache`). If
Redis cannot answer, the version is unknown and an entry is trusted only within ``api_key_cache_s``
(5 s) of its load, the bound this cache always had; a credential verified without a version is
re-checked as soon as Redis answers again.

Disabled accounts: an API key is refused when its user or tenant is disabled (checked when the key
is loaded, in the same ``mget`` as the key). A JWT is refused when the account record of its
subject or tenant is disabled: one ``mget``, cached per (tenant, user) as above. If OpenSearch
cannot answer, the last known status is used, and with none known the token passes (logged),
either for ``api_key_cache_s`` only: the proxy must keep answering JWT callers without the store,
and everything else needs OpenSearch anyway.

JWT revocation: a token with a ``jti`` can be revoked; issuer + tenant + subject + jti are kept in
Redis (:mod:`service.auth.revocations`) until the token's own expiry plus the tenant's turn
retention (a turn the token recorded may wait that long for extraction, which checks it too) and
checked on every request (one Redis EXISTS), so it takes effect at once everywhere.

``last_used_at``: each process asks at most once per ``last_used_interval_s`` per key (an
in-process deadline, so a warm key costs no Redis call for it), off the request path, and a Redis
SET NX elects the one process that writes it; the asks of a short window are recorded together
(:mod:`service.auth.last_used`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final, Literal

import redis
from opensearchpy import AsyncOpenSearch

from service.auth import keys
from service.auth.last_used import LastUsedRecorder
from service.auth.revocations import JtiRevocations
from service.auth.tokens import DEV_TOKEN_PREFIX, TokenVerifier, expiry, principal_from_claims
from service.config import AuthSettings
from service.domain.accounts import (
    ApiKeyRecord,
    Credential,
    Grants,
    TenantRecord,
    UserRecord,
    effective_principal,
    narrowed,
)
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import InvalidCredential, NotFound, StoreUnavailable, TenureError, Unauthenticated
from service.loops import LoopBound, on_loop
from service.lru import BoundedLru
from service.storage import calls
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
    issued_here: bool = False  # a development token of this service: its grants follow the user's
    claimed: Principal | None = None  # such a token's own claims, the bound its grants never pass

    @property
    def credential(self) -> Credential:
        """Which of the three kinds resolves this identity's grants (recorded on its turns, so
        extraction follows the same rule): an API key, a development token of this service, or
        an identity provider's token."""
        if self.kind == "api_key":
            return "api_key"
        return "service_token" if self.issued_here else "idp_token"


@dataclass(frozen=True)
class Verified:
    """An identity and what it was verified against: the tenant's accounts version read before its
    records were loaded (None: Redis did not answer; only the time bound applies), when (monotonic
    seconds), and the moment it must be re-loaded whatever the version (the maximum age, or an
    API key's own expiry if sooner)."""

    identity: Identity
    accounts_version: int | None
    loaded_at: float
    until: float


class _Unread(Enum):
    UNREAD = "unread"


# verify()'s default: the caller has not read the tenant's accounts version, so verify reads it
UNREAD: Final = _Unread.UNREAD
VersionRead = int | None | _Unread


@dataclass
class _CachedKey:
    verified: Verified
    key_hash: str
    touch_due: float = 0.0  # monotonic: when this process may next ask to record last_used_at


@dataclass(frozen=True)
class _Status:
    disabled: bool
    accounts_version: int | None
    loaded_at: float
    until: float
    grants: Grants | None = None  # the user record's, when the user is provisioned here
    grants_known: bool = True  # False: the store did not answer and nothing was known before


class Authenticator:
    def __init__(
        self,
        settings: AuthSettings,
        accounts: AccountStore,
        verifier: TokenVerifier,
        redis_client: redis.Redis[bytes],
        namespace: str,
        async_opensearch: LoopBound[AsyncOpenSearch] | None = None,
    ):
        self.settings = settings
        self.async_opensearch = async_opensearch  # averify's; without it every first use is verify's
        self.accounts = accounts
        self.verifier = verifier
        self.redis = redis_client
        self.namespace = namespace
        self.revocations = JtiRevocations(redis_client, namespace, settings.jwt_issuer, settings.jwt_leeway_s)
        self._keys: BoundedLru[str, _CachedKey] = BoundedLru(settings.credential_cache_entries)
        self._status: BoundedLru[tuple[str, str], _Status] = BoundedLru(settings.credential_cache_entries)
        # each tenant's accounts version as this process last read it (averify's tag)
        self._accounts_seen: BoundedLru[str, int] = BoundedLru(settings.credential_cache_entries)
        self._last_used = LastUsedRecorder(
            redis_client,
            accounts,
            namespace,
            interval_s=settings.last_used_interval_s,
            flush_s=settings.last_used_flush_s,
        )
        self._lock = threading.Lock()

    # ------------------------------------------------------- the request path

    def cached(self, token: str) -> Verified | None:
        """An API key verified earlier in this process, found without any I/O (the event loop's
        fast path): its secret matches and it is within its maximum age. Whether it is still
        current is for :meth:`confirm` to say with the accounts version the request's Redis round
        trip read; None: :meth:`verify` (on a worker thread)."""
        key_id = keys.parse_key_id(token) if keys.looks_like_key(token) else None
        entry = self._keys.get(key_id) if key_id is not None else None
        if entry is None or entry.verified.until <= time.monotonic():
            return None
        pepper = self.settings.api_key_pepper.get_secret_value()
        return entry.verified if keys.matches(token, entry.key_hash, pepper) else None

    def confirm(self, verified: Verified, accounts_version: int | None) -> bool:
        """Whether ``verified`` may serve a request whose round trip read ``accounts_version``
        (None: Redis did not answer): the tenant's accounts are unchanged since it was verified
        (with Redis down: it was verified within ``api_key_cache_s``), within its maximum age.
        False: verify it again with that version. No I/O."""
        self._seen(verified.identity.principal.tenant_id, accounts_version)
        if not self._trusted(verified.accounts_version, verified.loaded_at, verified.until, accounts_version):
            return False
        if verified.identity.kind == "api_key" and verified.identity.credential_id is not None:
            self._note_use(verified.identity.credential_id)
        return True

    def verify(self, token: str, accounts_version: VersionRead = UNREAD) -> Verified:
        """Verify ``token`` against the stores (I/O: a worker thread's job). ``accounts_version``
        is the tenant's version the caller read before this call (the request's round trip, after
        :meth:`confirm` said no); by default it is read here, before the records are loaded, so a
        result is never tagged with a version newer than the records it saw. Raises
        :class:`Unauthenticated` (:class:`InvalidCredential` when the credential can never
        become valid)."""
        if keys.looks_like_key(token):
            return self._verify_key(token, accounts_version)
        return self._verify_jwt(token, accounts_version)

    async def averify(self, token: str) -> Verified | None:
        """:meth:`verify` of an API key on the event loop, when it can be done there: the key
        read (one awaited GET, unless this process knows the key's owner), its secret checked, then
        the key, its user and its tenant read (one awaited ``mget``) and tagged with the tenant's
        accounts version as this process last read it (any version read before the records were
        loaded is a safe tag: an older one only means the next request re-checks them). None
        whenever that is not a success (no client on this loop, a tenant whose version this process
        has not read, a wrong secret, a refusal, a store that did not answer): :meth:`verify`, on a
        worker thread, then decides, and a refusal is counted there (:class:`AuthGuard`)."""
        client = on_loop(self.async_opensearch) if self.async_opensearch is not None else None
        key_id = keys.parse_key_id(token) if keys.looks_like_key(token) else None
        if client is None or key_id is None or not self.settings.verify_keys_on_loop:
            return None
        pepper = self.settings.api_key_pepper.get_secret_value()
        try:
            known = self._keys.get(key_id)
            if known is not None and keys.matches(token, known.key_hash, pepper):
                owner = _owner(known.verified.identity)
            else:
                record = await calls.arun(client, self.accounts.key_reads(key_id))
                if not keys.matches(token, record.key_hash, pepper):
                    return None
                owner = (record.tenant_id, record.user_id)
            version = self._accounts_seen.get(owner[0])
            if version is None:
                return None
            loaded_at = time.monotonic()
            records = await calls.arun(client, self.accounts.key_and_owner_reads(key_id, *owner))
            return self._loaded(records, version, loaded_at)
        except TenureError:
            return None

    def _seen(self, tenant_id: str, accounts_version: int | None) -> None:
        """Remember the tenant's accounts version as just read (for :meth:`averify`)."""
        if accounts_version is not None:
            self._accounts_seen.put(tenant_id, accounts_version)

    def authenticate(self, token: str) -> Identity:
        """The whole check in one call, for callers without the request's round trip (console
        sign-in, scripts): what :meth:`cached` or :meth:`verify` found, confirmed against the
        tenant's accounts version read here (one Redis GET)."""
        verified = self.cached(token) or self.verify(token)
        current = self.accounts.versions.current(verified.identity.principal.tenant_id)
        if self.confirm(verified, current):
            return verified.identity
        return self.verify(token, current).identity

    def revalidate(self, identity: Identity) -> Identity:
        """The identity a console session was opened with, checked again without its secret:
        an API key must still exist, be unrevoked and unexpired, and its user and tenant enabled
        (grant changes apply); a JWT must not be revoked and its account not disabled (a development
        token of this service narrowed to its user's grants as they are now). The same
        cache and accounts version as a bearer credential, read here, so a session learns of a
        change at once. Raises :class:`Unauthenticated` otherwise."""
        current = self.accounts.versions.current(identity.principal.tenant_id)
        if identity.kind == "api_key":
            if identity.credential_id is None:
                raise Unauthenticated(REJECTED_KEY)
            known = self._keys.get(identity.credential_id)
            if known is not None and self.confirm(known.verified, current):
                return known.verified.identity
            return self._load_key(identity.credential_id, _owner(identity), current).identity
        if identity.credential_id is not None and self._jti_revoked(identity.principal, identity.credential_id):
            raise Unauthenticated("this token has been revoked")
        status = self._status_of(identity.principal.tenant_id, identity.principal.user_id, current)
        if status.disabled:
            raise Unauthenticated("this account is disabled")
        if identity.issued_here:  # narrowed again from its claims: a grant changed since sign-in applies
            claims = identity.claimed or identity.principal
            return replace(identity, principal=self._as_provisioned_now(claims, status), claimed=claims)
        return identity

    def cached_keys(self) -> int:
        """How many API keys this process holds verified (the cache bound's test reads it)."""
        return len(self._keys)

    def _trusted(self, version_at: int | None, loaded_at: float, until: float, current: int | None) -> bool:
        now = time.monotonic()
        if now >= until:
            return False
        if current is None:  # Redis did not answer: the time bound
            return now - loaded_at <= self.settings.api_key_cache_s
        return version_at == current

    def _until(self, loaded_at: float) -> float:
        return loaded_at + self.settings.credential_cache_max_age_s

    # ----------------------------------------------------------------- JWTs

    def _verify_jwt(self, token: str, accounts_version: VersionRead) -> Verified:
        claims = self.verifier.verify(token)
        jti = claims.get("jti")
        jti = jti if isinstance(jti, str) else None
        principal = principal_from_claims(claims)
        if jti is not None and self._jti_revoked(principal, jti):
            raise Unauthenticated("this token has been revoked")
        status = self._status_of(principal.tenant_id, principal.user_id, accounts_version)
        if status.disabled:
            raise Unauthenticated("this account is disabled")
        expires_at = expiry(claims)
        if self._issued_here(claims, jti):
            narrowed_now = self._as_provisioned_now(principal, status)
            identity = Identity(narrowed_now, "jwt", jti, expires_at, issued_here=True, claimed=principal)
        else:
            identity = Identity(principal, "jwt", jti, expires_at)
        return Verified(identity, status.accounts_version, status.loaded_at, status.until)

    def _issued_here(self, claims: dict[str, Any], jti: str | None) -> bool:
        """A development token this service issued (``tenure dev-token``): its claims copy the
        user's grants at issue time, so they are only an upper bound. An identity provider's
        token is its own authority over what it grants."""
        return jti is not None and jti.startswith(DEV_TOKEN_PREFIX) and claims.get("iss") == self.settings.jwt_issuer

    @staticmethod
    def _as_provisioned_now(principal: Principal, status: _Status) -> Principal:
        """A development token's principal narrowed to its user's grants as they are now, as an
        API key's is: a grant taken back applies at once, not when the token expires (up to 30
        days). Its user removed, the token is refused. With the store unreachable and nothing known
        of the user, the claims serve as they are, as the disabled check passes then (the proxy
        keeps answering without the store)."""
        if not status.grants_known:
            return principal
        if status.grants is None:
            raise Unauthenticated("this token's user no longer exists")
        return narrowed(principal, status.grants)

    def _jti_revoked(self, principal: Principal, jti: str) -> bool:
        """Revoked token ids live in Redis (:class:`JtiRevocations`). Fails closed: if Redis
        cannot answer, the request is refused (503), not waved through."""
        return self.revocations.revoked(principal.tenant_id, principal.user_id, jti)

    def revoke_jti(self, principal: Principal, jti: str, expires_at: int, *, kept_after_s: int | None = 0) -> None:
        """Revoke the token ``jti`` of ``principal`` (its tenant and subject) until ``kept_after_s``
        past its expiry (None: for good): past the expiry no request needs it, but a turn the
        token recorded may still wait for extraction, which checks it too."""
        self.revocations.revoke(principal.tenant_id, principal.user_id, jti, expires_at, kept_after_s)

    def _status_of(self, tenant_id: str, user_id: str, accounts_version: VersionRead) -> _Status:
        """The account's disabled status. A cached one serves when it is trusted at
        ``accounts_version``; unread, an enabled status within its age serves as it is (the
        request's round trip confirms its version afterwards), while a cached refusal is checked
        against the version read here, so re-enabling takes effect at once too."""
        account = (tenant_id, user_id)
        known = self._status.get(account)
        if known is not None and known.until > time.monotonic():
            if accounts_version is UNREAD and not known.disabled:
                return known
            if accounts_version is UNREAD:
                accounts_version = self.accounts.versions.current(tenant_id)
            if self._trusted(known.accounts_version, known.loaded_at, known.until, accounts_version):
                return known
        if accounts_version is UNREAD:
            accounts_version = self.accounts.versions.current(tenant_id)
        loaded_at = time.monotonic()
        try:
            disabled, grants = self.accounts.account_status(tenant_id, user_id)
            status = _Status(disabled, accounts_version, loaded_at, self._until(loaded_at), grants)
        except StoreUnavailable as exc:
            # Also cached (so an outage does not cost every request a timeout), but only for the
            # time bound: the store is asked again soon.
            disabled = known.disabled if known is not None else False
            grants = known.grants if known is not None else None
            log.warning("account status of %s/%s unknown (%s); using %s", tenant_id, user_id, exc.message, disabled)
            until = loaded_at + self.settings.api_key_cache_s
            grants_known = known is not None and known.grants_known
            status = _Status(disabled, accounts_version, loaded_at, until, grants, grants_known=grants_known)
        if accounts_version is not None or self.settings.api_key_cache_s > 0:
            self._status.put(account, status)
        return status

    # ------------------------------------------------------------- API keys

    def _verify_key(self, token: str, accounts_version: VersionRead) -> Verified:
        key_id = keys.parse_key_id(token)
        if key_id is None:
            raise InvalidCredential("malformed API key")
        pepper = self.settings.api_key_pepper.get_secret_value()
        known = self._keys.get(key_id)
        if known is not None and keys.matches(token, known.key_hash, pepper):
            owner = _owner(known.verified.identity)  # a key's owner never changes
        else:  # first sight: whose key is it (one GET), and is the secret right?
            record = self._key_record(key_id)
            if not keys.matches(token, record.key_hash, pepper):
                raise InvalidCredential(REJECTED_KEY)
            owner = (record.tenant_id, record.user_id)
        return self._load_key(key_id, owner, accounts_version)

    def _key_record(self, key_id: str) -> ApiKeyRecord:
        try:
            return self.accounts.get_key(key_id)
        except NotFound as exc:
            raise InvalidCredential(REJECTED_KEY) from exc

    def _load_key(self, key_id: str, owner: tuple[str, str], accounts_version: VersionRead) -> Verified:
        """The key, its user and its tenant as they are now (one ``mget``, after the tenant's
        accounts version was read), as a cached :class:`Verified`; refused (and forgotten) when
        the key is revoked or expired, or its user or tenant disabled or gone. The secret has been
        checked by the caller (or, for a console session, at sign-in)."""
        tenant_id, user_id = owner
        if accounts_version is UNREAD:
            accounts_version = self.accounts.versions.current(tenant_id)
            self._seen(tenant_id, accounts_version)
        loaded_at = time.monotonic()
        try:
            records = self.accounts.key_and_owner(key_id, tenant_id, user_id)
        except NotFound as exc:
            self._keys.pop(key_id)
            raise Unauthenticated(REJECTED_KEY) from exc
        return self._loaded(records, accounts_version, loaded_at)

    def _loaded(
        self, records: tuple[ApiKeyRecord, UserRecord, TenantRecord], accounts_version: int | None, loaded_at: float
    ) -> Verified:
        """A key's records as loaded at ``loaded_at``, after ``accounts_version`` was read: the
        cached :class:`Verified`, or refused (and forgotten) as :meth:`_load_key` says."""
        record, user, tenant = records
        key_id = record.key_id
        left_s = (record.expires_at - utcnow()).total_seconds() if record.expires_at is not None else math.inf
        if record.revoked_at is not None or left_s <= 0 or user.disabled or tenant.disabled:
            self._keys.pop(key_id)
            raise Unauthenticated(REJECTED_KEY)
        identity = Identity(effective_principal(user, record), "api_key", record.key_id)
        until = min(self._until(loaded_at), loaded_at + left_s)
        verified = Verified(identity, accounts_version, loaded_at, until)
        self._remember(key_id, record.key_hash, verified)
        self._note_use(key_id)
        return verified

    def _remember(self, key_id: str, key_hash: str, verified: Verified) -> None:
        if verified.accounts_version is None and self.settings.api_key_cache_s <= 0:
            return  # no version to validate it by and no time bound to trust it for
        previous = self._keys.get(key_id)
        self._keys.put(key_id, _CachedKey(verified, key_hash, previous.touch_due if previous else 0.0))

    def _note_use(self, key_id: str) -> None:
        """Ask for ``last_used_at`` at most once per interval per key in this process (an
        in-process deadline: a warm key costs no Redis call for it); the asking is off the request
        path, batched (:class:`LastUsedRecorder`)."""
        entry = self._keys.get(key_id)
        now = time.monotonic()
        with self._lock:
            if entry is not None:
                if entry.touch_due > now:
                    return
                entry.touch_due = now + self.settings.last_used_interval_s
        self._last_used.note(key_id, utcnow())


def _owner(identity: Identity) -> tuple[str, str]:
    return identity.principal.tenant_id, identity.principal.user_id
