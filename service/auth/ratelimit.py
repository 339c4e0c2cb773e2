"""Per-credential rate limiting: a token bucket in Redis, one atomic Lua call per request.

Each credential has a bucket of ``burst`` tokens refilled at ``per_s`` tokens a second; a request
takes one token or is refused with 429 ``rate_limited`` and the seconds until a token is back
(``Retry-After``). The bucket is keyed by the API key id, or for a JWT by its tenant and subject
(every token of a user shares one bucket, so minting tokens does not buy requests).

Why Lua: the read-refill-take-write must be atomic across API processes, and a script does it in
one round trip using the Redis server's clock (API hosts' clocks never disagree about a bucket).

If Redis cannot answer, reads (GET/HEAD/OPTIONS) are let through and the outage is logged: a
limiter outage must not take the read path down. Everything else fails closed with 503, as the
JWT revocation check does: writes are what a flood would abuse.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time

import redis

from service.auth.authenticator import Identity
from service.errors import RateLimited, StoreUnavailable

log = logging.getLogger(__name__)

# KEYS[1] the bucket; ARGV[1] tokens per second, ARGV[2] burst.
# Returns {allowed (0/1), milliseconds until one token is available}.
BUCKET_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil then
  tokens = burst
  at = now
end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local allowed = 0
local wait_ms = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait_ms = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', string.format('%.6f', now))
-- an idle bucket is full again after burst/rate seconds: keep it no longer than that
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, wait_ms}
"""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_OUTAGE_LOG_INTERVAL_S = 10.0


class RateLimiter:
    """``per_s <= 0`` disables the limiter (no Redis call at all)."""

    def __init__(self, redis_client: redis.Redis[bytes], namespace: str, *, per_s: float, burst: int):
        self.redis = redis_client
        self.namespace = namespace
        self.per_s = per_s
        self.burst = burst
        self._script = redis_client.register_script(BUCKET_SCRIPT)
        self._last_outage_log = 0.0

    @property
    def enabled(self) -> bool:
        return self.per_s > 0

    def bucket(self, identity: Identity) -> str:
        principal = identity.principal
        if identity.kind == "api_key" and identity.credential_id:
            return f"{self.namespace}:rl:key:{identity.credential_id}"
        # Tenant and subject come from a token's claims (any text): hash them into a safe key.
        subject = hashlib.sha256(f"{principal.tenant_id}\0{principal.user_id}".encode()).hexdigest()[:32]
        return f"{self.namespace}:rl:sub:{subject}"

    def charge(self, identity: Identity, *, read_only: bool) -> None:
        """Take one token from the credential's bucket, or raise :class:`RateLimited`."""
        if not self.enabled:
            return
        try:
            allowed, wait_ms = self._script(keys=[self.bucket(identity)], args=[self.per_s, self.burst])
        except redis.RedisError as exc:
            self._outage(exc, read_only)
            return
        if not allowed:
            retry_after = max(1, math.ceil(int(wait_ms) / 1000))
            raise RateLimited(
                f"rate limit exceeded for this credential ({self.per_s:g}/s, burst {self.burst})",
                retry_after_s=retry_after,
                details={"retry_after_ms": int(wait_ms), "per_s": self.per_s, "burst": self.burst},
            )

    def _outage(self, exc: redis.RedisError, read_only: bool) -> None:
        if not read_only:
            raise StoreUnavailable("Redis is unreachable; cannot apply the rate limit to this write") from exc
        now = time.monotonic()
        if now - self._last_outage_log >= _OUTAGE_LOG_INTERVAL_S:
            # At most one line per interval: an outage must not flood the log at request rate.
            self._last_outage_log = now
            log.warning("rate limiter unavailable, letting reads through unlimited: %s", exc)
