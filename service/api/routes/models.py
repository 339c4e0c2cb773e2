"""``GET /v1/models``: the OpenAI-compatible model list (``service/proxy/models.py``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from service.api.deps import authenticate, bearer_scheme, raw_services
from service.api.errors import openai_error_responses
from service.proxy.models import list_models

router = APIRouter(prefix="/v1", tags=["memory loop"])


@router.get(
    "/models",
    summary="Models the proxy can answer with (OpenAI-compatible list)",
    responses=openai_error_responses(401, 429),
)
async def models(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> dict[str, Any]:
    # like the chat route: the caller's own credential, charged as a read, no "indices ready" gate
    services = raw_services(request)
    identity = await authenticate(request, services, credentials, read_only=True)
    return await list_models(services.loop.upstream, services.settings.loop, identity.principal.tenant_id)
