"""The REST API as a FastAPI application: its routers, middleware and error handlers.

:func:`build_rest_app` makes the app the composition root (:mod:`service.app`) then mounts the
console and MCP onto; routers are included from one list (:data:`ROUTERS`, plus ``extra_routers``)
so other features plug in without touching this file. Nothing here imports the console or MCP
(import-linter contract in ``pyproject.toml``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline
from starlette.types import Lifespan

from service.api.errors import RequestContextMiddleware, error_responses, install_error_handlers
from service.api.recall_lane import RecallLane
from service.api.routes import admin, audit, beliefs, health, messages, metrics, models, quarantine, recall, turns
from service.api.routes import memory_loop as memory_loop_routes
from service.auth import keys
from service.config import Settings
from service.telemetry.tracing import instrument_app

# Starlette tries routes in this order, so the hot paths come first: recall and the proxy's two
# endpoints resolve in ~10 µs instead of ~70 µs behind the beliefs router's patterns.
ROUTERS: list[APIRouter] = [
    recall.router,
    memory_loop_routes.router,  # the proxy's /v1/chat/completions
    messages.router,
    models.router,
    health.router,
    beliefs.router,
    admin.router,
    audit.router,
    quarantine.router,
    turns.router,
]

DESCRIPTION = """Shared, typed belief memory for LLM work.

Authenticate with `Authorization: Bearer <credential>`: an API key (`tnr_...`, issued by an admin)
or a JWT. Every error has the shape `{"error": {"code", "message", "details", "request_id"}}`.
"""

CORS_HEADERS = [
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
]


def build_rest_app(
    config: Settings, lifespan: Lifespan[FastAPI], *, extra_routers: Sequence[APIRouter] = ()
) -> FastAPI:
    """The REST API (every ``/v1`` route, health, metrics) around the caller's ``lifespan``."""
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
    # added first, so innermost: inside the request context (id, body limit, access log, metrics)
    app.add_middleware(RecallLane, enabled=config.api.recall_lane)
    app.add_middleware(RequestContextMiddleware, max_body_bytes=config.api.max_body_bytes)
    if config.api.cors_origins:  # browser clients (chat UIs) calling the proxy or the API directly
        app.add_middleware(
            CORSMiddleware,
            allow_origins=config.api.cors_origins,
            allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=CORS_HEADERS,
            expose_headers=["X-Request-ID", "Retry-After", "x-tenure-warning"],
            allow_credentials=False,
            max_age=600,
        )
    for router in (*ROUTERS, *extra_routers):
        app.include_router(router)
    if config.observability.metrics_enabled:
        app.include_router(metrics.router)
    if config.observability.tracing_enabled:
        instrument_app(app, keys.redacted)  # a key put in a path keeps only its id
    return app


__all__ = ["ROUTERS", "build_rest_app"]
