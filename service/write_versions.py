"""Per-tenant write versions: one Redis counter per tenant, bumped after every belief write.

Anything derived from a tenant's beliefs and kept between requests (the recall vocabulary,
:mod:`service.recall.vocabulary`) records the version it was built at and is rebuilt when the
counter has moved. The bump comes *after* the write returned, and belief writes are visible when
they return (``wait_for``/``true`` refresh), so whoever reads the new version also reads the new
document; a reader that read the old version keeps a cache entry tagged with it, which the next
request after the bump discards.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis
import redis.asyncio

from service import redis_keys
from service.errors import StoreUnavailable


class TenantWriteVersions:
    def __init__(self, client: redis.Redis[bytes], namespace: str):
        self.client = client
        self.namespace = namespace

    def key(self, tenant_id: str) -> str:
        return redis_keys.tenant_write_version(self.namespace, tenant_id)

    def current(self, tenant_id: str) -> int:
        """The tenant's version (0 before its first write)."""
        try:
            raw = self.client.get(self.key(tenant_id))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while reading the tenant's write version") from exc
        return int(raw) if raw else 0

    def bump(self, tenant_ids: Iterable[str]) -> None:
        """Mark the tenants as written. Raises if Redis is down: the write itself succeeded and is
        idempotent, so the caller's retry is safe, while a silently missed bump would leave caches
        of the old version in use."""
        keys = sorted({self.key(t) for t in tenant_ids})
        if not keys:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.incr(key)
                pipe.execute()
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while recording a belief write") from exc


def queue_current(
    pipe: redis.client.Pipeline[bytes] | redis.asyncio.client.Pipeline[bytes], namespace: str, tenant_id: str
) -> None:
    """Queue the read of a tenant's version on someone else's pipeline (the rate limit's), so the
    request's one Redis round trip carries it; :func:`parse` reads the pipeline's result."""
    pipe.get(redis_keys.tenant_write_version(namespace, tenant_id))


def parse(raw: object) -> int:
    """A version as read from Redis (0 before the tenant's first write)."""
    return int(raw) if isinstance(raw, bytes | str | int) and raw else 0
