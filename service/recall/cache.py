"""The tenant's prefix in Redis for anything derived from its beliefs' text, and its erasure.

Everything kept in Redis that holds text of a tenant's beliefs stores under this prefix
(:func:`service.redis_keys.render_cache`), and an erase sweeps it, so none of it can keep an erased
belief's text. Today that is the tenant's shared recall vocabulary
(:mod:`service.recall.shared_vocabulary`: its names and aliases as analysed units); recall renders
injection blocks per request and caches none.
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
