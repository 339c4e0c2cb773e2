"""Failed authentication is limited and cheap.

Every failed authentication (a credential was given and refused) draws a token from a Redis
bucket per client address and, for an API key, per key id; once a bucket is empty that subject
is refused with 429 ``rate_limited`` for the bucket's ``Retry-After`` without verifying anything,
remembered in-process so a blocked caller costs neither OpenSearch nor Redis. A credential that can
never become valid (:class:`InvalidCredential`: unknown key id, wrong secret, bad signature,
expired token) is also kept in a bounded in-process negative cache for ``negative_cache_s``, so
replaying it skips the key lookup (an OpenSearch GET) and the signature check.

A blocked key id also refuses its owner's correct key until the window passes (the price of
stopping a secret being guessed); successful requests are never charged here, and a request
without any credential is not a failed authentication.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from service import redis_keys
from service.auth import keys
from service.auth.authenticator import UNREAD, Authenticator, Identity, Verified, VersionRead
from service.auth.ratelimit import BUCKET_SCRIPT
from service.errors import InvalidCredential, RateLimited, Unauthenticated
from service.lru import BoundedLru

log = logging.getLogger(__name__)

MAX_REMEMBERED = 10_000
T = TypeVar("T")


class AuthGuard:
    """Wraps the :class:`Authenticator`'s checks; ``per_s <= 0`` turns the failure limit off."""

    def __init__(
        self,
        authenticator: Authenticator,
        redis_client: redis.Redis[bytes],
        namespace: str,
        *,
        per_s: float,
        burst: int,
        negative_cache_s: float,
    ):
        self.authenticator = authenticator
        self.namespace = namespace
        self.per_s = per_s
        self.burst = burst
        self.negative_cache_s = negative_cache_s
        self._script = redis_client.register_script(BUCKET_SCRIPT)
        self._lock = threading.Lock()
        self._blocked: dict[str, float] = {}
        # fingerprint -> (monotonic expiry, refusal message); a hit does not refresh its recency
        self._known_bad: BoundedLru[str, tuple[float, str]] = BoundedLru(MAX_REMEMBERED)

    def cached(self, token: str, client: str | None) -> Verified | None:
        """The credential when it is known without any I/O (an API key verified earlier in this
        process, its subjects not blocked): the event loop's path, to be confirmed with the
        request's accounts version (:meth:`Authenticator.confirm`). None: call :meth:`verify`
        (which also counts a failure)."""
        self._refuse_if_blocked(self._subjects(token, client))
        return self.authenticator.cached(token)

    async def averify(self, token: str) -> Verified | None:
        """:meth:`Authenticator.averify` (an API key met for the first time, on the event loop),
        unless the credential is remembered as invalid; None: call :meth:`verify`, which answers a
        remembered or new refusal and counts it. (Blocked subjects were refused by :meth:`cached`.)"""
        if self._remembered_bad(_fingerprint(token)) is not None:
            return None
        return await self.authenticator.averify(token)

    def verify(self, token: str, client: str | None, accounts_version: VersionRead = UNREAD) -> Verified:
        """:meth:`Authenticator.verify`, limited and counted (I/O: a worker thread's job)."""
        return self._guarded(token, client, lambda: self.authenticator.verify(token, accounts_version))

    def authenticate(self, token: str, client: str | None) -> Identity:
        """:meth:`Authenticator.authenticate` (the whole check, for callers without the request's
        Redis round trip: console sign-in), limited and counted."""
        return self._guarded(token, client, lambda: self.authenticator.authenticate(token))

    def _guarded(self, token: str, client: str | None, check: Callable[[], T]) -> T:
        subjects = self._subjects(token, client)
        self._refuse_if_blocked(subjects)
        fingerprint = _fingerprint(token)
        try:
            remembered = self._remembered_bad(fingerprint)
            if remembered is not None:
                raise InvalidCredential(remembered)  # the same answer, without the lookup
            return check()
        except Unauthenticated as exc:
            if isinstance(exc, InvalidCredential):
                self._remember_bad(fingerprint, exc.message)
            self._failed(subjects)
            raise

    # ------------------------------------------------------------------ subjects and blocks

    def _subjects(self, token: str, client: str | None) -> list[str]:
        out = []
        key_id = keys.parse_key_id(token) if keys.looks_like_key(token) else None
        if key_id is not None:
            out.append(f"key:{key_id}")
        address = hashlib.sha256((client or "unknown").encode()).hexdigest()[:32]
        out.append(f"addr:{address}")
        return out

    def _refuse_if_blocked(self, subjects: list[str]) -> None:
        now = time.monotonic()
        with self._lock:
            until = max((self._blocked.get(s, 0.0) for s in subjects), default=0.0)
        if until > now:
            raise self._limited(until - now)

    def _limited(self, wait_s: float) -> RateLimited:
        return RateLimited(
            "too many failed authentications from this client or for this key; retry later",
            retry_after_s=max(1, math.ceil(wait_s)),
            details={"retry_after_ms": math.ceil(wait_s * 1000), "per_s": self.per_s, "burst": self.burst},
        )

    def _failed(self, subjects: list[str]) -> None:
        if self.per_s <= 0:
            return
        buckets = [redis_keys.failed_authentication(self.namespace, s) for s in subjects]
        args: list[float] = []
        for _ in subjects:
            args += [self.per_s, self.burst]
        try:
            allowed, wait_ms, refused = self._script(keys=buckets, args=args)
        except redis.RedisError as exc:
            log.warning("failed-authentication limit unavailable: %s", exc)
            return
        if allowed:
            return
        wait_s = int(wait_ms) / 1000
        with self._lock:
            self._blocked[subjects[int(refused) - 1]] = time.monotonic() + wait_s
            if len(self._blocked) > MAX_REMEMBERED:
                now = time.monotonic()
                self._blocked = {s: u for s, u in self._blocked.items() if u > now}
        raise self._limited(wait_s)

    # ------------------------------------------------------------------ negative cache

    def _remembered_bad(self, fingerprint: str) -> str | None:
        """The refusal message of a credential refused for good within the cache window."""
        if self.negative_cache_s <= 0:
            return None
        with self._lock:  # the expiry check and the removal as one step against a concurrent put
            known = self._known_bad.peek(fingerprint)
            if known is None:
                return None
            if known[0] <= time.monotonic():
                self._known_bad.pop(fingerprint)
                return None
            return known[1]

    def _remember_bad(self, fingerprint: str, message: str) -> None:
        if self.negative_cache_s <= 0:
            return
        with self._lock:
            self._known_bad.put(fingerprint, (time.monotonic() + self.negative_cache_s, message))


def _fingerprint(token: str) -> str:
    """What the negative cache keys a credential by (never the credential itself)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
