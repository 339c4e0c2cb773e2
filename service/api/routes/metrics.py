"""``GET /metrics``: Prometheus text format, for the internal network (the TLS proxy answers 404).

Counters and histograms of every process in this container (multi-process mode, see
:mod:`service.telemetry.metrics`), plus gauges read from Redis at scrape time: outbox depth and
the age of its oldest record, Celery queue lengths. The recall caches' counts of the scraped
process are published first (:mod:`service.telemetry.cache_metrics`; the other workers' every
few seconds).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import raw_services
from service.extraction.queue import queue_names
from service.redis_keys import parked_turns, receipts_outbox
from service.telemetry import metrics
from service.telemetry.cache_metrics import CachePublisher

router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
async def scrape(request: Request) -> Response:
    services = raw_services(request)
    namespace = services.settings.opensearch_namespace
    stores = metrics.StoreCollector(
        services.redis,
        {"receipts": receipts_outbox(namespace), "parked_turns": parked_turns(namespace)},
        queue_names(services.settings),
    )
    caches: CachePublisher | None = getattr(request.app.state, "cache_metrics", None)
    if caches is not None:  # this process's cache counts as of now (the others' within seconds)
        caches.publish()
    body = await run_in_threadpool(metrics.exposition, stores)
    return Response(body, media_type=metrics.CONTENT_TYPE)
