"""Per-credential and per-tenant rate limiting: token buckets in Redis, one atomic Lua call per
request.

Each credential has a bucket of ``burst`` tokens refilled at ``per_s`` tokens a second; a request
takes one token or is refused with 429 ``rate_limited`` and the seconds until a token is back
(``Retry-After``). The bucket is keyed by the API key id, or for a JWT by its tenant and subject
(every token of a user shares one bucket, so minting tokens does not buy requests). Every request
also draws from its tenant's bucket (``tenant_per_s``/``tenant_burst``), so an admin who mints five
keys does not get five times the tenant's rate.

Why Lua: the read-refill-take-write must be atomic across API processes, and a script does it in
one round trip using the Redis server's clock (API hosts' clocks never disagree about a bucket).

If Redis cannot answer, reads (GET/HEAD/OPTIONS) are let through and the outage is logged: a
limiter outage must not take the read path down. Everything else fails closed with 503, as the
JWT revocation check does: writes are what a flood would abuse.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import anyio.to_thread
import redis

from service import redis_keys, write_versions
from service.auth.authenticator import Identity
from service.errors import RateLimited, StoreUnavailable
from service.lean_redis import EventLoopRedis
from service.loops import LoopBound, on_loop
from service.lru import BoundedLru
from service.write_versions import UNKNOWN, TenantVersions

log = logging.getLogger(__name__)

# KEYS: the buckets one request draws from (the credential's, its tenant's); ARGV: per bucket,
# tokens per second and burst. A request takes one token from every bucket or from none.
# Returns {allowed (0/1), milliseconds until every bucket has a token, index of the bucket that
# refused (1-based; 0 when allowed)}.
BUCKET_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local levels = {}
local allowed = 1
local wait_ms = 0
local refused = 0
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local state = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(state[1])
  local at = tonumber(state[2])
  if tokens == nil or at == nil then
    tokens = burst
    at = now
  end
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
  levels[i] = tokens
  if tokens < 1 then
    allowed = 0
    local wait = math.ceil((1 - tokens) / rate * 1000)
    if wait > wait_ms then
      wait_ms = wait
      refused = i
    end
  end
end
for i, key in ipairs(KEYS) do
  local rate = tonumber(ARGV[2 * i - 1])
  local burst = tonumber(ARGV[2 * i])
  local tokens = levels[i]
  if allowed == 1 then
    tokens = tokens - 1
  end
  redis.call('HSET', key, 'tokens', string.format('%.6f', tokens), 'at', string.format('%.6f', now))
  -- an idle bucket is full again after burst/rate seconds: keep it no longer than that
  redis.call('PEXPIRE', key, math.ceil(burst / rate * 1000) + 1000)
end
return {allowed, wait_ms, refused}
"""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_OUTAGE_LOG_INTERVAL_S = 10.0
# tenants whose last write version this process remembers, buckets it remembers refusing
_REMEMBERED = 10_000


class RateLimiter:
    """``per_s <= 0`` disables the limiter (the round trip then only reads the tenant's versions);
    ``tenant_per_s <= 0`` leaves out the tenant's bucket."""

    def __init__(
        self,
        redis_client: redis.Redis[bytes],
        namespace: str,
        *,
        per_s: float,
        burst: int,
        tenant_per_s: float = 0.0,
        tenant_burst: int = 1,
        async_redis: LoopBound[EventLoopRedis] | None = None,
    ):
        self.redis = redis_client
        self.async_redis = async_redis  # the event loop's client (acharge); without it acharge hops to a thread
        self.namespace = namespace
        self.per_s = per_s
        self.burst = burst
        self.tenant_per_s = tenant_per_s
        self.tenant_burst = tenant_burst
        # Redis names a script by its SHA-1 (EVALSHA); not a security use of SHA-1
        self._sha = hashlib.sha1(BUCKET_SCRIPT.encode(), usedforsecurity=False).hexdigest()
        self._last_outage_log = 0.0
        # What the last round trips said, for a recall that starts before its own round trip
        # has answered (service/api/recall_ahead.py): each tenant's write version, and the
        # buckets that refused (monotonic time until their Retry-After).
        self._write_seen: BoundedLru[str, int] = BoundedLru(_REMEMBERED)
        self._refused_until: BoundedLru[str, float] = BoundedLru(_REMEMBERED)

    @property
    def enabled(self) -> bool:
        return self.per_s > 0

    def bucket(self, identity: Identity) -> str:
        principal = identity.principal
        if identity.kind == "api_key" and identity.credential_id:
            return redis_keys.rate_limit_credential(self.namespace, identity.credential_id)
        # Tenant and subject come from a token's claims: hash them into a safe key.
        subject = hashlib.sha256(f"{principal.tenant_id}\0{principal.user_id}".encode()).hexdigest()[:32]
        return redis_keys.rate_limit_subject(self.namespace, subject)

    def tenant_bucket(self, identity: Identity) -> str:
        """Every credential of a tenant also draws from this one: minting keys buys nothing."""
        tenant = hashlib.sha256(identity.principal.tenant_id.encode()).hexdigest()[:32]
        return redis_keys.rate_limit_tenant(self.namespace, tenant)

    def charge(self, identity: Identity, *, read_only: bool) -> TenantVersions:
        """Take one token from the credential's bucket and its tenant's, or raise :class:`RateLimited`.

        Returns the tenant's write and accounts versions (:mod:`service.write_versions`), read in
        the same pipeline, so the one Redis round trip of a request also tells recall whether its
        cached filter tiers are still current and the authenticator whether the credential it
        verified earlier still is; both None when Redis cannot answer (recall then does not cache,
        the authenticator falls back to its time bound).
        """
        keys, args = self._buckets(identity)
        try:
            results = self._round_trip(keys, args, identity.principal.tenant_id)
        except redis.RedisError as exc:
            self._unanswered(exc, read_only)
            return UNKNOWN
        return self._verdict(results, identity, keys)

    async def acharge(self, identity: Identity, *, read_only: bool) -> TenantVersions:
        """:meth:`charge` through the event loop's Redis client (no thread-pool hop); the same
        script, pipeline and answers."""
        client = on_loop(self.async_redis)
        if client is None:
            return await anyio.to_thread.run_sync(functools.partial(self.charge, identity, read_only=read_only))
        keys, args = self._buckets(identity)
        try:
            for attempt in (1, 2):
                pipe = client.pipeline(transaction=False)
                self._queue(pipe, keys, args, identity.principal.tenant_id)
                results: list[Any] = await pipe.execute(raise_on_error=False)
                if not self._script_missing(results, attempt):
                    break
                await client.execute_command("SCRIPT", "LOAD", BUCKET_SCRIPT)  # type: ignore[no-untyped-call]
        except redis.RedisError as exc:
            self._unanswered(exc, read_only)
            return UNKNOWN
        return self._verdict(results, identity, keys)

    def expected_write_version(self, identity: Identity) -> int | None:
        """The tenant's write version as this process's last round trip for it read it, when
        ``identity`` is likely to be let through: None for a tenant not seen yet, or while one of
        the identity's buckets is within the ``Retry-After`` of a refusal here. A guess only (no
        I/O): what a request may start on before its own round trip answers, and must check
        against what that round trip reads."""
        keys, _ = self._buckets(identity)
        now = time.monotonic()
        if any((self._refused_until.get(key) or 0.0) > now for key in keys):
            return None
        return self._write_seen.get(identity.principal.tenant_id)

    def forget_write_versions(self, tenant_ids: Iterable[str]) -> None:
        """This process wrote the tenants: their versions it read are old (the next round trip of
        each reads the new one)."""
        for tenant_id in tenant_ids:
            self._write_seen.pop(tenant_id)

    def _buckets(self, identity: Identity) -> tuple[list[str], list[float]]:
        keys: list[str] = []
        args: list[float] = []
        if self.enabled:
            keys = [self.bucket(identity)]
            args = [self.per_s, self.burst]
            if self.tenant_per_s > 0:
                keys.append(self.tenant_bucket(identity))
                args += [self.tenant_per_s, self.tenant_burst]
        return keys, args

    def _unanswered(self, exc: redis.RedisError, read_only: bool) -> None:
        """Redis did not answer: a write is refused (503), a read goes on unlimited (logged)."""
        if self.enabled:
            self._outage(exc, read_only)

    def _verdict(self, results: list[Any], identity: Identity, keys: list[str]) -> TenantVersions:
        versions = write_versions.parse_versions(results)
        if versions.write is not None:
            self._write_seen.put(identity.principal.tenant_id, versions.write)
        if not self.enabled:
            return versions
        allowed, wait_ms, refused = results[0]
        if not allowed:
            self._refused_until.put(keys[max(1, int(refused)) - 1], time.monotonic() + int(wait_ms) / 1000)
            retry_after = max(1, math.ceil(int(wait_ms) / 1000))
            whose, per_s, burst = (
                ("this credential", self.per_s, self.burst)
                if int(refused) <= 1
                else ("this tenant", self.tenant_per_s, self.tenant_burst)
            )
            raise RateLimited(
                f"rate limit exceeded for {whose} ({per_s:g}/s, burst {burst})",
                retry_after_s=retry_after,
                details={"retry_after_ms": int(wait_ms), "per_s": per_s, "burst": burst, "bucket": whose.split()[1]},
            )
        return versions

    def _queue(self, pipe: Any, keys: list[str], args: list[float], tenant_id: str) -> None:
        """The buckets' script (by its SHA) and the tenant's versions, on one pipeline."""
        if keys:
            pipe.evalsha(self._sha, len(keys), *keys, *args)
        write_versions.queue_versions(pipe, self.namespace, tenant_id)

    @staticmethod
    def _script_missing(results: list[Any], attempt: int) -> bool:
        """True when the pipeline should be sent again after loading the script (``NOSCRIPT`` on
        the first attempt); raises any other failure."""
        failure = next((r for r in results if isinstance(r, Exception)), None)
        if failure is None:
            return False
        if attempt == 1 and isinstance(failure, redis.exceptions.NoScriptError):
            return True
        raise failure

    def _round_trip(self, keys: list[str], args: list[float], tenant_id: str) -> list[Any]:
        """The buckets' script (by its SHA) and the tenant's versions in one pipeline: one
        round trip. (redis-py's ``Script`` on a pipeline would first ask ``SCRIPT EXISTS`` on
        every execute, a second round trip; here the script is loaded only when Redis answers
        ``NOSCRIPT``, after a restart or a ``SCRIPT FLUSH``, and the pipeline is sent again.)"""
        for attempt in (1, 2):
            pipe = self.redis.pipeline(transaction=False)
            self._queue(pipe, keys, args, tenant_id)
            results: list[Any] = pipe.execute(raise_on_error=False)
            if not self._script_missing(results, attempt):
                return results
            self.redis.execute_command("SCRIPT", "LOAD", BUCKET_SCRIPT)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _outage(self, exc: redis.RedisError, read_only: bool) -> None:
        if not read_only:
            raise StoreUnavailable("Redis is unreachable; cannot apply the rate limit to this write") from exc
        now = time.monotonic()
        if now - self._last_outage_log >= _OUTAGE_LOG_INTERVAL_S:
            # At most one line per interval: an outage must not flood the log at request rate.
            self._last_outage_log = now
            log.warning("rate limiter unavailable, letting reads through unlimited: %s", exc)
