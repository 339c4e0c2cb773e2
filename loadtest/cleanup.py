"""Remove what a LocalStack run left in servers it did not own (shared OpenSearch and Redis)."""

from __future__ import annotations

import redis

from service.config import Settings
from service.storage.client import build_client
from service.storage.templates import FAMILIES, drop_namespace


def drop_stack_data(settings: Settings) -> None:
    """Drop the namespace's indices and templates and its Redis keys (rate limits, queues, caches).

    Only for namespaces a load test created: LocalStack gives every run a fresh one, so nothing
    else lives under it.
    """
    namespace = settings.opensearch_namespace
    client = build_client(settings)
    try:
        drop_namespace(client, namespace, FAMILIES)
    finally:
        client.close()
    rds: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url)
    try:
        for pattern in (f"{namespace}:*", f"{namespace}.*", f"_kombu.binding*.{namespace}.*"):
            for key in rds.scan_iter(match=pattern, count=500):
                rds.delete(key)
    finally:
        rds.close()
