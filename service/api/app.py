"""The FastAPI application.

``create_app(settings)`` wires everything once: the lifespan opens OpenSearch and Redis, applies the
index templates idempotently and builds the shared :class:`Services`; routers are included from one
list (:data:`ROUTERS`, plus ``extra_routers``) so other features plug in without touching this file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio.to_thread
import redis
from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline

from service.api.errors import RequestContextMiddleware, error_responses, install_error_handlers
from service.api.examples import install as install_examples
from service.api.routes import admin, audit, beliefs, health, messages, metrics, models, quarantine, recall
from service.api.routes import memory_loop as memory_loop_routes
from service.api.state import Services, ensure_indices
from service.config import Settings, get_settings
from service.console import install_console
from service.errors import TenureError
from service.mcp.server import mount as mount_mcp
from service.process import freeze_startup_heap
from service.storage.client import build_client
from service.telemetry.logs import configure_logging
from service.telemetry.tracing import configure_tracing, instrument_app

ROUTERS: list[APIRouter] = [
    health.router,
    beliefs.router,
    recall.router,
    admin.router,
    audit.router,
    quarantine.router,
    models.router,
    memory_loop_routes.router,
    messages.router,
]

DESCRIPTION = """Shared, typed belief memory for LLM work.

Authenticate with `Authorization: Bearer <credential>`: an API key (`tnr_...`, issued by an admin)
or a JWT. Every error has the shape `{"error": {"code", "message", "details", "request_id"}}`.
"""


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
        services = Services.build(config, client, redis_client)
        app.state.services = services
        app.state.indices_ready = ensure_indices(services)
        anyio.to_thread.current_default_thread_limiter().total_tokens = config.api.thread_pool_size
        freeze_startup_heap()  # after start-up: the long-lived heap leaves the cyclic GC's scans
        try:
            async with mcp_server.session_manager.run():
                yield
        finally:
            await services.aclose()
            client.close()
            redis_client.close()

    # /docs (Swagger UI) and /redoc from assets shipped in the fastapi-offline wheel: no CDN, so
    # they work on an air-gapped deployment (static files under /static-offline-docs)
    app = FastAPIOffline(
        title="Tenure team service",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        responses=error_responses(400, 401, 403, 404, 409, 413, 422, 429, 503),
    )
    install_error_handlers(app)
    app.add_middleware(RequestContextMiddleware, max_body_bytes=config.api.max_body_bytes)
    if config.api.cors_origins:  # browser clients (chat UIs) calling the proxy or the API directly
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.api.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=[
                "Authorization",
                "Content-Type",
                "X-Request-ID",
                "X-Session-Id",
                "X-Tenure-Scope",
                "X-Tenure-Session",
                "OpenAI-Organization",
                "OpenAI-Project",
                "x-api-key",
                "anthropic-version",
                "anthropic-beta",
            ],
            expose_headers=["X-Request-ID", "Retry-After", "x-tenure-warning"],
            allow_credentials=False,
            max_age=600,
        )
    for router in (*ROUTERS, *extra_routers):
        app.include_router(router)
    if observability.metrics_enabled:
        app.include_router(metrics.router)
    if observability.tracing_enabled:
        instrument_app(app)
    install_console(app)
    install_examples(app)  # a valid example on every request body and response (/docs "Try it out")
    mcp_server = mount_mcp(app)  # /mcp: the MCP tools over streamable HTTP (service/mcp)
    return app


__all__ = ["ROUTERS", "TenureError", "create_app"]
