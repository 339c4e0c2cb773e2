"""The composition root: ``create_app(settings)`` is the one place that wires the service together.

Its lifespan opens OpenSearch and Redis, applies the index templates idempotently and builds the
one :class:`~service.api.state.Services` every interface shares; the app is the REST API
(:func:`service.api.rest.build_rest_app`) with the admin console (``/console``) and the MCP server
(``/mcp``) mounted on it. It sits above the interfaces in the layering contracts (``pyproject.toml``,
``docs/architecture.md``), so none of them imports another's package to be mounted.
Run it with ``uvicorn service.app:create_app --factory``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio.to_thread
import redis
from fastapi import APIRouter, FastAPI

from service import redis_advice
from service.api.examples import install as install_examples
from service.api.rest import build_rest_app
from service.api.state import AsyncClients, Services, ensure_indices
from service.config import Settings, get_settings
from service.console import install_console
from service.lean_redis import event_loop_redis
from service.mcp.server import mount as mount_mcp
from service.process import collect_every, freeze_startup_heap, paced_interval
from service.recall.tier_cache import refresh_filter_tiers
from service.recall.vocabulary_warmer import VocabularyWarmer
from service.storage.client import build_async_client, build_client, close_client
from service.storage.local_analysis import start_local_analysis
from service.telemetry.cache_metrics import CachePublisher
from service.telemetry.logs import configure_logging
from service.telemetry.tracing import configure_tracing

# How often the recall caches' counts reach the metrics (a scrape of this process also publishes
# them first): a scrape of another worker shows this one's at most this old
CACHE_METRICS_INTERVAL_S = 10.0


def paced_collections(interval_s: float) -> asyncio.Task[None] | None:
    """The API worker's paced full collection, a task on the running loop; none at 0."""
    return asyncio.create_task(collect_every(interval_s), name="paced-gc") if interval_s > 0 else None


async def stopped(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel the lifespan's background tasks and wait for them, so each closes what it opened
    (the listener its Redis connection) before the loop ends."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def vocabulary_refreshes(settings: Settings, services: Services) -> VocabularyWarmer | None:
    """The listener that restores announced vocabularies of this process's active tenants before
    their next recall (service/recall/vocabulary_warmer.py); none when recall does not share
    vocabularies through Redis or the setting is off."""
    builder = services.recall.builder
    matcher = builder.matcher
    shared = matcher.cache.shared if matcher is not None else None
    if matcher is None or shared is None or not settings.recall.vocabulary_refresh:
        return None
    tiers = None
    within_s = settings.recall.tier_refresh_within_s
    if builder.tier_cache is not None and within_s > 0:
        tiers = functools.partial(refresh_filter_tiers, builder.tier_cache, builder.store, within_s=within_s)
    return VocabularyWarmer(matcher.cache, settings.redis_url, shared.channel, tiers=tiers)


def create_app(settings: Settings | None = None, *, extra_routers: Sequence[APIRouter] = ()) -> FastAPI:
    config = settings or get_settings()
    observability = config.observability
    configure_logging(observability.log_format, observability.log_level)
    if observability.tracing_enabled:
        configure_tracing("tenure-api")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = build_client(config)
        redis_client = redis.Redis.from_url(config.redis_url, socket_timeout=5, socket_connect_timeout=2)
        # the event loop's clients: recall and the rate limit run through them without a thread hop
        async_clients = AsyncClients.here(
            build_async_client(config),
            event_loop_redis(config.redis_url, socket_timeout=5, connect_timeout=2),
        )
        services = Services.build(config, client, redis_client, async_clients, start_local_analysis(config.recall))
        app.state.services = services
        app.state.indices_ready = ensure_indices(services)
        redis_advice.warn_about(redis_client)  # settings that lose acknowledged work or cost latency
        anyio.to_thread.current_default_thread_limiter().total_tokens = config.api.thread_pool_size
        # after start-up: the long-lived heap leaves the cyclic GC's scans, and the paced full
        # collection runs on this loop (its finalizers with it; service/process.py)
        freeze_startup_heap(config.gc_thaw_interval_s, config.gc_young_threshold)
        collections = paced_collections(paced_interval(config.gc_collect_interval_s, config.gc_thaw_interval_s))
        warmer = app.state.vocabulary_warmer = vocabulary_refreshes(config, services)
        refreshes = asyncio.create_task(warmer.run(), name="vocabulary-refresh") if warmer is not None else None
        caches = app.state.cache_metrics = CachePublisher(services.cache_sources())
        published = asyncio.create_task(caches.run(CACHE_METRICS_INTERVAL_S), name="cache-metrics")
        try:
            async with mcp_server.session_manager.run():
                yield
        finally:
            await stopped(collections, refreshes, published)
            await services.aclose()
            close_client(client)
            redis_client.close()
            await async_clients.aclose()

    app = build_rest_app(config, lifespan, extra_routers=extra_routers)
    install_console(app)
    install_examples(app)  # a valid example on every request body and response (/docs "Try it out")
    mcp_server = mount_mcp(app)  # /mcp: the MCP tools over streamable HTTP (service/mcp)
    return app


__all__ = ["create_app"]
