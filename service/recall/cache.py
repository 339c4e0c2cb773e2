"""Where cached renderings of injection blocks would live in Redis, and their erasure.

Nothing in this version caches a rendering (recall renders per request). The prefix stays reserved
(:func:`service.redis_keys.render_cache`), and erasure still sweeps it, so a cache added later
has to store under it and can never keep an erased belief's text.
"""

from __future__ import annotations

import redis

from service import redis_keys
from service.errors import StoreUnavailable


class RenderCache:
    def __init__(self, client: redis.Redis[bytes], namespace: str):
        self.client = client
        self.namespace = namespace

    def prefix(self, tenant_id: str) -> str:
        return redis_keys.render_cache(self.namespace, tenant_id)

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
