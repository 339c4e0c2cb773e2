"""Bearer JWT verification with joserfc, and development token issuance.

Algorithms are pinned twice: :func:`joserfc.jwt.decode` is given only the configured ones (``none``
is never among them), and the key is chosen by the header's algorithm *family*: an HS256
token is only ever checked against the configured HMAC secret, an RS256/ES256 token only against
JWKS keys of the matching type. That closes the classic confusion attack (an HS256 token "signed"
with the public RSA key).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeGuard

import httpx
from joserfc import jwt
from joserfc.errors import BadSignatureError, InvalidClaimError, JoseError
from joserfc.jwk import GuestProtocol, Key, KeySet, OctKey
from joserfc.jwt import ClaimsOption

from service.config import AuthSettings
from service.content_coding import IDENTITY, read_bounded
from service.domain.accounts import SLUG_RE
from service.domain.principal import Principal, Role
from service.errors import InvalidCredential, Unauthenticated

log = logging.getLogger(__name__)

HMAC_ALGS = frozenset({"HS256"})
ASYMMETRIC_ALGS = {"RS256": "RSA", "ES256": "EC"}
SUPPORTED_ALGS = HMAC_ALGS | set(ASYMMETRIC_ALGS)
TENANT_CLAIM = "tenant_id"
# Claims whose refusal can be a matter of time: a token "not yet valid" (``nbf``) or "issued in the
# future" (``iat``, an issuer's clock ahead of ours) becomes valid later.
NOT_YET_CLAIMS = frozenset({"nbf", "iat"})
JWKS_RETRY_S = 30.0  # after a failed JWKS fetch, the next attempt waits this long at most
KID_REFETCH_S = 10.0  # a kid the cached JWKS lacks (a rotated key) re-fetches it at most this often
# One JWKS fetch's deadline, all of it (httpx's own timeout is per operation: a provider trickling
# its answer a byte at a time never trips it), and the longest a verification waits for one
JWKS_FETCH_TIMEOUT_S = 5.0
# A JWKS is a few kB (an RSA-2048 public key is ~0.5 kB in JSON; a provider publishes a handful):
# more than this is a misconfigured URL or a misbehaving provider, not keys, and is not read on
JWKS_MAX_BYTES = 1024 * 1024
DEV_TOKEN_PREFIX = "dev-"  # noqa: S105 - the jti prefix of a development token this service issued


class KeySource:
    """The JWKS, from a file (read once) or a URL (re-fetched after ``jwks_cache_s``). A failed
    fetch is tried again only after ``JWKS_RETRY_S`` (or the cache time, if shorter): until then
    the keys known before serve, or, with none known, tokens are refused at once; the provider
    being down must not cost every JWT request its own attempt. A token naming a ``kid`` the set
    lacks (the provider rotated its key) re-fetches it, at most once per ``KID_REFETCH_S`` and not
    during a failed fetch's pause, so made-up kids (anyone can send one) can neither send every
    request to the provider nor stall JWT requests behind a provider that is down.

    The fetch runs on its own thread, never under the lock, and at most one at a time: a
    verification whose key is known never waits for it (an aged set serves while its successor is
    fetched), and the callers that need its result (no keys yet, or a kid the set lacks) wait for
    that one fetch, at most ``JWKS_FETCH_TIMEOUT_S``. (Verifications run on worker threads,
    ``anyio.to_thread``: a fetch made under the lock held every JWT verification of the process,
    known kid or not, for the whole fetch.)"""

    def __init__(self, settings: AuthSettings):
        self.settings = settings
        self._lock = threading.Lock()  # guards the fields below; never held during I/O
        self._keys: KeySet | None = None
        self._next_fetch = 0.0  # monotonic
        self._attempted = -math.inf  # monotonic: the last fetch attempt's start (and then its end)
        self._paused_until = 0.0  # monotonic: after a failed fetch, no unknown kid fetches before this
        self._inflight: threading.Event | None = None  # set when the fetch in flight has ended
        if settings.jwks_file:
            self._keys = KeySet.import_key_set(json.loads(Path(settings.jwks_file).read_text()))

    @property
    def configured(self) -> bool:
        return bool(self.settings.jwks_file or self.settings.jwks_url)

    def key_set(self, *, unknown_kid: bool = False) -> KeySet:
        """The keys; ``unknown_kid``: the set as it was lacked a token's kid (fetch it again, if
        the last attempt is ``KID_REFETCH_S`` old, and wait for the fetch in flight)."""
        if self.settings.jwks_file or not self.settings.jwks_url:
            if self._keys is None:
                raise Unauthenticated("no JWKS is configured for asymmetric tokens")
            return self._keys
        with self._lock:
            now = time.monotonic()
            kid_due = unknown_kid and now - self._attempted >= KID_REFETCH_S and now >= self._paused_until
            fetch = self._inflight
            if fetch is None and (now >= self._next_fetch or kid_due):
                fetch = self._start_fetch(now)
            keys = self._keys
        if fetch is not None and (keys is None or unknown_kid):  # this caller needs the fetch's answer
            fetch.wait(JWKS_FETCH_TIMEOUT_S)
            keys = self._keys
        if keys is None:
            raise Unauthenticated("the JWKS could not be fetched; cannot verify the token")
        return keys

    def _start_fetch(self, now: float) -> threading.Event | None:
        """Start the one fetch (the caller holds the lock); None: no thread could be started."""
        done = threading.Event()
        try:
            threading.Thread(target=self._fetch, args=(done,), name="jwks-fetch", daemon=True).start()
        except RuntimeError:  # out of threads: the keys known serve; a later request tries again
            log.exception("the JWKS fetch could not be started")
            return None
        self._inflight, self._attempted = done, now
        return done

    def _fetch(self, done: threading.Event) -> None:
        url = str(self.settings.jwks_url)
        keys: KeySet | None = None
        try:
            keys = KeySet.import_key_set(json.loads(_jwks_body(url)))
        except (httpx.HTTPError, ValueError, TypeError, KeyError, JoseError) as exc:  # no key set
            log.warning("the JWKS could not be fetched from %s: %s", url, exc)
        finally:
            with self._lock:
                now = time.monotonic()
                if keys is not None:
                    self._keys = keys
                    self._next_fetch = now + self.settings.jwks_cache_s
                else:  # also an unexpected error: the pause, never a fetch per request
                    self._next_fetch = now + min(JWKS_RETRY_S, self.settings.jwks_cache_s)
                    self._paused_until = self._next_fetch
                # a slow provider is not asked again the moment it answered
                self._attempted = max(self._attempted, now)
                self._inflight = None
            done.set()


def _jwks_body(url: str) -> bytes:
    """The JWKS document at ``url``, read as it arrives up to ``JWKS_MAX_BYTES`` (decoded: it is
    asked for uncompressed, and one compressed anyway is decoded in bounded pieces) and until
    ``JWKS_FETCH_TIMEOUT_S`` after the fetch began (checked as each piece arrives; a read waiting
    for one ends at httpx's own timeout, the same); past either a ValueError, the connection
    closed with the rest unread. (A fetch that never ended kept the one fetch slot: no later
    fetch, so no rotated key, while it ran.)"""
    deadline = time.monotonic() + JWKS_FETCH_TIMEOUT_S
    with httpx.stream("GET", url, headers=IDENTITY, timeout=JWKS_FETCH_TIMEOUT_S) as response:
        response.raise_for_status()
        return read_bounded(response.iter_raw(), response.headers, JWKS_MAX_BYTES, deadline=deadline)


class TokenVerifier:
    def __init__(self, settings: AuthSettings):
        self.settings = settings
        allowed = [a for a in settings.jwt_algorithms if a in SUPPORTED_ALGS]
        if settings.jwt_hs256_secret is not None and "HS256" not in allowed:
            allowed.append("HS256")
        self.allowed = frozenset(allowed)
        self.keys = KeySource(settings)
        essential: ClaimsOption = {"essential": True}
        required: dict[str, ClaimsOption] = {
            "iss": {"essential": True, "value": settings.jwt_issuer},
            "aud": {"essential": True, "value": settings.jwt_audience},
            "exp": essential,
            "sub": essential,
            TENANT_CLAIM: essential,
        }
        self.claims = jwt.JWTClaimsRegistry(None, settings.jwt_leeway_s, **required)  # now=None: the clock

    def _keys_for(self, token: GuestProtocol) -> list[Key]:
        """The keys that may have signed ``token``: the HMAC secret, or the JWKS keys of its
        algorithm's type with its ``kid`` (all of that type when it names none)."""
        header = token.headers()
        alg = header.get("alg")
        if alg not in self.allowed:
            raise Unauthenticated(f"token algorithm {alg!r} is not accepted")
        if alg in HMAC_ALGS:
            secret = self.settings.jwt_hs256_secret
            if secret is None:
                raise Unauthenticated("HS256 tokens are not accepted by this deployment")
            return [OctKey.import_key(secret.get_secret_value().encode())]
        kty, kid = ASYMMETRIC_ALGS[str(alg)], header.get("kid")
        candidates = _matching(self.keys.key_set(), kty, kid)
        if not candidates and kid is not None:  # a key the provider published since?
            candidates = _matching(self.keys.key_set(unknown_kid=True), kty, kid)
        if not candidates:
            raise Unauthenticated("no JWKS key matches the token's kid and algorithm")
        return candidates

    def _decode(self, token: str) -> jwt.Token:
        """The token, its signature checked against each key that may have signed it (a token that
        names no ``kid`` while the provider publishes two keys, the old and the new)."""
        candidates: list[Key] = []

        def first(guest: GuestProtocol) -> Key:
            candidates.extend(self._keys_for(guest))
            return candidates[0]

        algorithms = sorted(self.allowed)
        try:
            return jwt.decode(token, first, algorithms=algorithms)
        except BadSignatureError:
            for key in candidates[1:]:
                with suppress(BadSignatureError):
                    return jwt.decode(token, key, algorithms=algorithms)
            raise

    def verify(self, token: str) -> dict[str, Any]:
        claims: dict[str, Any] = {}
        try:
            decoded = self._decode(token)
            claims = dict(decoded.claims)
            self.claims.validate(claims)
        except Unauthenticated:
            raise
        except JoseError as exc:
            message = f"invalid token: {exc.error}: {exc.description or ''}".rstrip(": ")
            if isinstance(exc, InvalidClaimError) and exc.claim in NOT_YET_CLAIMS and _numeric(claims.get(exc.claim)):
                # not valid *yet* (nbf, or an issuer's clock ahead of ours): refused now, but not
                # remembered as a credential that never becomes valid
                raise Unauthenticated(message) from exc
            # bad signature, expired, wrong issuer/audience: this token never becomes valid
            raise InvalidCredential(message) from exc
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise InvalidCredential("malformed token") from exc
        return claims

    def issue_dev_token(
        self, principal: Principal, *, ttl_s: int | None = None, jti: str | None = None
    ) -> tuple[str, int]:
        """An HS256 token for ``principal`` (development deployments only); ``jti``: its id, the
        handle to revoke it (by default a fresh :func:`dev_token_id`)."""
        secret = self.settings.jwt_hs256_secret
        if secret is None:
            raise Unauthenticated("development tokens need TENURE_AUTH_JWT_HS256_SECRET to be set")
        now = int(time.time())
        exp = now + (ttl_s or self.settings.dev_token_ttl_s)
        payload = {
            "iss": self.settings.jwt_issuer,
            "aud": self.settings.jwt_audience,
            "sub": principal.user_id,
            TENANT_CLAIM: principal.tenant_id,
            "roles": sorted(r.value for r in principal.roles),
            "projects": sorted(principal.projects),
            "teams": sorted(principal.teams),
            "iat": now,
            "nbf": now,
            "exp": exp,
            "jti": jti or dev_token_id(),  # the handle for revoking this token
        }
        key = OctKey.import_key(secret.get_secret_value().encode())
        return jwt.encode({"alg": "HS256", "typ": "JWT"}, payload, key, algorithms=["HS256"]), exp


def dev_token_id() -> str:
    """A fresh ``jti`` of a development token (its prefix marks it as this service's)."""
    return f"{DEV_TOKEN_PREFIX}{uuid.uuid4().hex}"


def _matching(key_set: KeySet, kty: str, kid: Any) -> list[Key]:
    """The keys of ``key_set`` of type ``kty`` with the id ``kid`` (any id when None)."""
    return [k for k in key_set.keys if k.key_type == kty and (kid is None or k.kid == kid)]


def expiry(claims: dict[str, Any]) -> int | None:
    """A verified token's ``exp`` as whole epoch seconds (rounded up): any JSON number is a
    NumericDate (RFC 7519 2), ``1767225600.5`` as much as ``1767225600``; None without one."""
    exp = claims.get("exp")
    return math.ceil(exp) if _numeric(exp) else None


def _numeric(value: Any) -> TypeGuard[int | float]:
    """A JSON number (a NumericDate, RFC 7519 2), never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string_list(claims: dict[str, Any], name: str) -> list[str]:
    value = claims.get(name, [])
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Unauthenticated(f"token claim {name!r} must be a list of strings")
    return value


def principal_from_claims(claims: dict[str, Any]) -> Principal:
    tenant, user = claims.get(TENANT_CLAIM), claims.get("sub")
    if not isinstance(tenant, str) or not tenant or not isinstance(user, str) or not user:
        raise InvalidCredential("token lacks a tenant_id or sub claim")
    # The same grammar as provisioned tenants and users: a ``*``, ``t:x`` or a newline would
    # otherwise reach cache keys, Redis keys and audit records as if it were a name.
    if not SLUG_RE.fullmatch(tenant) or not SLUG_RE.fullmatch(user):  # not match: "$" passes a final "\n"
        raise InvalidCredential(f"token claims tenant_id and sub must match {SLUG_RE.pattern}")
    roles = {Role.MEMBER}
    for name in _string_list(claims, "roles"):
        try:
            roles.add(Role(name))
        except ValueError:
            continue  # roles this service does not know grant nothing here
    return Principal(
        tenant_id=tenant,
        user_id=user,
        roles=frozenset(roles),
        projects=frozenset(p.lower() for p in _string_list(claims, "projects")),
        teams=frozenset(t.lower() for t in _string_list(claims, "teams")),
    )
