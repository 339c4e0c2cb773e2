"""``POST /v1/messages``: the Anthropic Messages ingress of the proxy (``service/proxy/messages.py``).

Clients configured with ``ANTHROPIC_BASE_URL=<service>`` send their Tenure key as ``x-api-key``
(or as a bearer token); it authenticates them here and is never forwarded: the upstream gets the
tenant's Anthropic upstream key. Every failure is in Anthropic's error shape.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials
from starlette.background import BackgroundTask

from service.api.deps import SESSION_HEADER, actor_of, authenticate, bearer_scheme, raw_services
from service.api.errors import (
    AnthropicErrorOut,
    anthropic_error_responses,
    error_body,
    request_id_of,
)
from service.api.routes.memory_loop import WARNING_HEADER, proxy_body
from service.auth.actor import Actor
from service.errors import TenureError, Unauthenticated
from service.proxy.messages import MessagesProxy, MessagesRequest
from service.proxy.upstream import UpstreamFailure

router = APIRouter(prefix="/v1", tags=["memory loop"])
PATH = "/v1/messages"
api_key_scheme = APIKeyHeader(
    name="x-api-key",
    scheme_name="AnthropicApiKey",
    description="A Tenure API key or JWT, as Anthropic clients send their key (Authorization: Bearer works too).",
    auto_error=False,
)


async def messages_actor(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    api_key: Annotated[str | None, Depends(api_key_scheme)],
    session: Annotated[str | None, Header(alias=SESSION_HEADER, max_length=200)] = None,
) -> Actor:
    """The proxy's authentication (charged as a read, no "indices ready" gate), reading the
    credential from ``x-api-key`` when there is no bearer token."""
    credentials = bearer
    if credentials is None and api_key:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=api_key.strip())
    if credentials is None:
        raise Unauthenticated("missing credentials: send your Tenure API key as x-api-key (or Authorization: Bearer)")
    identity = await authenticate(request, raw_services(request), credentials, read_only=True)
    return actor_of(request, identity, session.strip() if session and session.strip() else None)


def anthropic_error(request: Request, exc: TenureError) -> JSONResponse:
    status = exc.status if isinstance(exc, UpstreamFailure) else exc.code.http_status
    body = error_body(exc.code, exc.message, exc.details, request_id_of(request), path=PATH, status=status)
    return JSONResponse(body, status_code=status, headers=exc.headers if isinstance(exc, UpstreamFailure) else None)


@router.post(
    "/messages",
    summary="Anthropic-compatible Messages with memory (streaming and not)",
    responses={
        **anthropic_error_responses(401, 413, 429, 502, 504),
        422: {"model": AnthropicErrorOut, "description": "Invalid request, or a model below its floor in strict mode"},
        503: {"model": AnthropicErrorOut, "description": "No upstream model provider is configured"},
    },
)
async def messages(
    request: Request,
    actor: Annotated[Actor, Depends(messages_actor)],
    anthropic_version: Annotated[str | None, Header(max_length=40)] = None,
    anthropic_beta: Annotated[str | None, Header(max_length=500)] = None,
    x_session_id: Annotated[str | None, Header(max_length=200)] = None,
    x_tenure_scope: Annotated[str | None, Header(max_length=2000)] = None,
) -> Any:
    services = raw_services(request)
    proxy = MessagesProxy(services.loop, services.recall)
    try:
        body = await proxy_body(request, MessagesRequest, "messages request")
        ctx, target, forwarded = await proxy.prepare(
            actor, body, actor.session_id or x_session_id, x_tenure_scope, anthropic_version, anthropic_beta
        )
        headers = {WARNING_HEADER: ctx.gate.warning} if ctx.gate.warning else {}
        if body.stream:
            events = await proxy.stream(ctx, target, forwarded)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
            )
        data, after = await proxy.complete(ctx, target, forwarded)
        return JSONResponse(data, headers=headers, background=BackgroundTask(after))
    except TenureError as exc:
        return anthropic_error(request, exc)
