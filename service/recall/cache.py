"""Cached renderings of injection blocks in Redis.

Anything that caches a rendered injection block for a tenant (the recall endpoint's optional
per-session cache, the proxy) stores it under :meth:`RenderCache.key`, so erasure can find and drop
every rendering that might still contain an erased belief. Entries expire on their own after
``ttl_s``; erasure removes them at once.
"""

from __future__ import annotations

import redis

from service import redis_keys
from service.errors import StoreUnavailable


class RenderCache:
    def __init__(self, client: redis.Redis[bytes], namespace: str, *, ttl_s: int = 300):
        self.client = client
        self.namespace = namespace
        self.ttl_s = ttl_s

    def prefix(self, tenant_id: str) -> str:
        return redis_keys.render_cache(self.namespace, tenant_id)

    def key(self, tenant_id: str, name: str) -> str:
        return self.prefix(tenant_id) + name

    def put(self, tenant_id: str, name: str, text: str) -> None:
        try:
            self.client.set(self.key(tenant_id, name), text, ex=self.ttl_s)
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while caching a rendering") from exc

    def get(self, tenant_id: str, name: str) -> str | None:
        try:
            value = self.client.get(self.key(tenant_id, name))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while reading a rendering") from exc
        return value.decode() if isinstance(value, bytes) else value

    def invalidate_tenant(self, tenant_id: str) -> int:
        """Delete every cached rendering of the tenant; returns how many were removed."""
        removed = 0
        try:
            batch: list[bytes | str] = []
            for key in self.client.scan_iter(match=self.prefix(tenant_id) + "*", count=500):
                batch.append(key)
                if len(batch) >= 500:
                    removed += int(self.client.delete(*batch))
                    batch = []
            if batch:
                removed += int(self.client.delete(*batch))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while dropping cached renderings") from exc
        return removed
