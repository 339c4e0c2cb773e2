"""Liveness and readiness."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from service.api.deps import raw_services
from service.api.state import ensure_indices

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready", "unavailable"]
    opensearch: bool
    redis: bool
    indices: bool


@router.get("/healthz", response_model=Health, summary="The process is up")
async def healthz() -> Health:
    # async: it waits for nothing, so it need not hop to the thread pool and back (twice: FastAPI
    # also serialises a sync endpoint's answer there); a probe every few seconds per replica
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="OpenSearch and Redis are reachable",
    responses={503: {"model": Readiness, "description": "Not ready"}},
)
def readyz(request: Request) -> JSONResponse:
    services = raw_services(request)
    try:
        opensearch_ok = bool(services.opensearch.ping())
    except Exception:  # noqa: BLE001 - any failure means "not reachable"
        opensearch_ok = False
    try:
        redis_ok = bool(services.redis.ping())
    except Exception:  # noqa: BLE001
        redis_ok = False
    if opensearch_ok and not request.app.state.indices_ready:
        request.app.state.indices_ready = ensure_indices(services)
    indices = bool(request.app.state.indices_ready)
    ready = opensearch_ok and redis_ok and indices
    body = Readiness(
        status="ready" if ready else "unavailable",
        opensearch=opensearch_ok,
        redis=redis_ok,
        indices=indices,
    )
    headers = {} if ready else {"Retry-After": str(services.settings.api.retry_after_s)}
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503, headers=headers)
