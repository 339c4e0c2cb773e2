"""One JSON error shape for every failure, rendered here and nowhere else:

    {"error": {"code": "<stable code>", "message": "...", "details": ..., "request_id": "..."}}

Also the request-id and body-size middleware (pure ASGI, so streaming bodies are counted as they
arrive and a lying or missing Content-Length cannot get past the limit).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Literal

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from opensearchpy import exceptions as os_exc
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.observe import observe_request
from service.errors import ErrorCode, RateLimited, StoreUnavailable, TenureError
from service.telemetry import context as work_context
from service.telemetry import metrics
from service.telemetry.context import WorkContext

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
# nginx's "client closed request": the status the access line and the latency metric record for a
# request whose client hung up before the request was read (no one receives the answer).
CLIENT_CLOSED_REQUEST = 499
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. validation_error, not_found")
    message: str
    details: Any = Field(None, description="Field paths for validation errors, or other context")
    request_id: str | None = Field(None, description="Also in the X-Request-ID response header")


class ErrorOut(BaseModel):
    """The one error shape of every endpoint."""

    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting the error shape for ``statuses``."""
    return {status: {"model": ErrorOut, "description": _DESCRIPTIONS[status]} for status in statuses}


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="authentication_error, permission_error, rate_limit_error, invalid_request_error, "
        "upstream_error, timeout_error or api_error (what the OpenAI SDKs map to their exception classes)"
    )
    code: str = Field(description="The service's stable code, e.g. unauthenticated, rate_limited")
    param: str | None = None
    details: Any = Field(None, description="Field paths for validation errors, or other context")
    request_id: str | None = Field(None, description="Also in the X-Request-ID response header")


class OpenAIErrorOut(BaseModel):
    """The error shape of the OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/models``)."""

    error: OpenAIErrorDetail


def openai_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting the OpenAI error shape for ``statuses``."""
    return {status: {"model": OpenAIErrorOut, "description": _DESCRIPTIONS[status]} for status in statuses}


_DESCRIPTIONS = {
    400: "Unreadable request body",
    401: "Missing, malformed, expired or revoked credentials",
    403: "The credential lacks the role or grant",
    404: "Not found (also: not visible to this principal)",
    405: "Method not allowed",
    409: "Conflict with the current state",
    413: "Request body too large",
    422: "Invalid request (details carry field paths)",
    429: "The credential's rate limit is exhausted; retry after the Retry-After delay",
    502: "The upstream model failed or refused the credentials",
    503: "A backing store is unavailable; retry after the Retry-After delay",
    504: "The upstream model timed out",
}


class PayloadTooLarge(TenureError):
    code = ErrorCode.PAYLOAD_TOO_LARGE


def request_id_of(request: Request) -> str | None:
    value = getattr(request.state, "request_id", None)
    return value if isinstance(value, str) else None


# The OpenAI-compatible routes answer every failure in the shape the OpenAI SDKs parse
# (``{"error": {"message", "type", "code", "param"}}``), so a client pointed at the proxy sees a
# typed AuthenticationError/RateLimitError instead of an unreadable body. The request id stays.
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/models"})
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error_type(status: int) -> str:
    return _OPENAI_TYPES.get(status, "api_error")


# The Anthropic Messages route answers in Anthropic's shape (``{"type": "error", "error": {"type",
# "message"}}``), so the Anthropic SDKs raise their typed errors; our stable code rides along.
ANTHROPIC_PATHS = frozenset({"/v1/messages"})
_ANTHROPIC_TYPES = {
    **_OPENAI_TYPES,
    413: "request_too_large",
    504: "timeout_error",
}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error")


class AnthropicErrorDetail(BaseModel):
    type: str = Field(
        description="authentication_error, permission_error, rate_limit_error, invalid_request_error, "
        "request_too_large, timeout_error or api_error (what the Anthropic SDKs map to their exceptions)"
    )
    message: str
    code: str = Field(description="The service's stable code, e.g. unauthenticated, rate_limited")
    details: Any = Field(None, description="Field paths for validation errors, or other context")


class AnthropicErrorOut(BaseModel):
    """The error shape of the Anthropic Messages route (``/v1/messages``)."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
    request_id: str | None = Field(None, description="Also in the X-Request-ID response header")


def anthropic_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting the Anthropic error shape for ``statuses``."""
    return {status: {"model": AnthropicErrorOut, "description": _DESCRIPTIONS[status]} for status in statuses}


def error_body(
    code: ErrorCode, message: str, details: Any, request_id: str | None, *, path: str = "", status: int = 0
) -> dict[str, Any]:
    if path in ANTHROPIC_PATHS:
        detail: dict[str, Any] = {"type": anthropic_error_type(status or code.http_status), "message": message}
        detail["code"] = code.value
        if details is not None:
            detail["details"] = details
        return {"type": "error", "error": detail, "request_id": request_id}
    if path in OPENAI_PATHS:
        error: dict[str, Any] = {
            "message": message,
            "type": openai_error_type(status or code.http_status),
            "code": code.value,
            "param": None,
            "request_id": request_id,
        }
        if details is not None:
            error["details"] = details
        return {"error": error}
    return {
        "error": {
            "code": code.value,
            "message": message,
            "details": details,
            "request_id": request_id,
        }
    }


def _respond(
    request: Request,
    status: int,
    code: ErrorCode,
    message: str,
    details: Any = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(code, message, details, request_id_of(request), path=request.url.path, status=status),
        status_code=status,
        headers=headers,
    )


async def _tenure_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TenureError)
    headers: dict[str, str] = {}
    if exc.code is ErrorCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, StoreUnavailable | RateLimited):
        headers["Retry-After"] = str(exc.retry_after_s)
    if isinstance(exc, RateLimited):
        bucket = exc.details.get("bucket") if isinstance(exc.details, dict) else None
        metrics.RATE_LIMITED.labels(bucket or "failed_auth").inc()
    if exc.code.http_status >= 500:
        log.warning("request %s failed: %s", request_id_of(request), exc.message)
    return _respond(request, exc.code.http_status, exc.code, exc.message, exc.details, headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = [
        {
            "loc": list(err.get("loc", ())),
            "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")),
        }
        for err in exc.errors()
    ]
    where = ", ".join(".".join(str(p) for p in d["loc"]) for d in details[:5])
    return _respond(request, 422, ErrorCode.VALIDATION_ERROR, f"invalid request: {where}", details)


async def _stray_model_error(request: Request, exc: Exception) -> JSONResponse:
    """A model's ValidationError no service turned into ValidationFailed: the input that caused it
    came from the request, so it is a 422 with the field paths, never a 500."""
    assert isinstance(exc, ValidationError)
    log.warning("untranslated model validation error in request %s: %s", request_id_of(request), exc.title)
    details = [{"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]} for err in exc.errors()]
    return _respond(request, 422, ErrorCode.VALIDATION_ERROR, f"invalid {exc.title}", details)


_HTTP_CODES = {
    400: ErrorCode.BAD_REQUEST,  # a body the framework could not read at all ("error parsing the body")
    401: ErrorCode.UNAUTHENTICATED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    409: ErrorCode.CONFLICT,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    429: ErrorCode.RATE_LIMITED,
}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Framework-raised errors (unknown route, wrong method, malformed JSON body...)."""
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, ClientDisconnect):
        # FastAPI turns any failure to read the body into "400 error parsing the body"; a client
        # that hung up did not send a bad request
        return _client_gone(request)
    status = exc.status_code
    code = _HTTP_CODES.get(status, ErrorCode.VALIDATION_ERROR if status < 500 else ErrorCode.INTERNAL)
    message = exc.detail if isinstance(exc.detail, str) else code.value.replace("_", " ")
    if status == 404 and message == "Not Found":
        message = f"no route for {request.method} {request.url.path}"
    headers = dict(exc.headers or {})
    return _respond(request, status, code, message, None, headers)


async def _store_down(request: Request, exc: Exception) -> JSONResponse:
    """A client error from a store that escaped translation: still a retryable 503, never a 500."""
    return await _tenure_error(request, StoreUnavailable(f"a backing store is unavailable ({type(exc).__name__})"))


async def _opensearch_error(request: Request, exc: Exception) -> JSONResponse:
    """An OpenSearch failure the storage layer did not translate (e.g. an index missing after a
    store reset): the backend is not usable right now, which is a 503, not a crash."""
    assert isinstance(exc, os_exc.TransportError)
    log.warning("untranslated OpenSearch error in request %s: %s", request_id_of(request), exc)
    return await _tenure_error(request, StoreUnavailable(f"OpenSearch could not serve the request ({exc.status_code})"))


def _client_gone(request: Request) -> Response:
    """The client hung up before its request was read (its own timeout, a cancelled call, a proxy
    giving up): nothing failed here and the answer reaches no one, so one INFO line with the
    request id instead of an error with a traceback, and no 500 in the metrics."""
    log.info("client disconnected before the request was read; request %s abandoned", request_id_of(request))
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _client_disconnected(request: Request, _exc: Exception) -> Response:
    return _client_gone(request)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error in request %s", request_id_of(request), exc_info=exc)
    # Starlette sends this from its outermost middleware, outside RequestContextMiddleware, which
    # adds the header to every other response: the id to quote must be in the header here too
    request_id = request_id_of(request)
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    message = "internal error; quote the request id when reporting it"
    return _respond(request, 500, ErrorCode.INTERNAL, message, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(TenureError, _tenure_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ValidationError, _stray_model_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(os_exc.ConnectionError, _store_down)
    app.add_exception_handler(os_exc.TransportError, _opensearch_error)
    app.add_exception_handler(redis.ConnectionError, _store_down)
    app.add_exception_handler(redis.TimeoutError, _store_down)
    app.add_exception_handler(ClientDisconnect, _client_disconnected)
    app.add_exception_handler(Exception, _unexpected)


class RequestContextMiddleware:
    """Assigns the request id (the caller's X-Request-ID if well-formed, else a fresh one), echoes
    it on the response, and enforces the body size limit while the body streams in."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get(REQUEST_ID_HEADER.lower(), "")
        request_id = given if _REQUEST_ID_RE.match(given) else f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        work = WorkContext(request_id=request_id)
        token = work_context.begin(work)
        status = 500  # what the request counts as if the app fails before answering
        try:
            status = await self._handle(scope, receive, send, request_id, headers)
        finally:
            work_context.end(token)
            observe_request(scope, status, work)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, headers: dict[str, str]
    ) -> int:
        """Serve the request; returns the status that went out."""
        limit = self.max_body_bytes

        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            body = error_body(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"request body exceeds {limit} bytes",
                {"limit": limit},
                request_id,
                path=scope.get("path", ""),
                status=413,
            )
            response = JSONResponse(body, status_code=413, headers={REQUEST_ID_HEADER: request_id})
            await response(scope, receive, send)
            return 413

        received = 0
        too_large = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    raise PayloadTooLarge(f"request body exceeds {limit} bytes", details={"limit": limit})
            return message

        replaced = False
        sent_status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal replaced, sent_status
            # The framework may turn a failure while reading the body into its own 400; the
            # client deserves to know the real reason, so the response is replaced by the 413.
            if too_large:
                if message["type"] == "http.response.start" and not replaced:
                    replaced = True
                    body = error_body(
                        ErrorCode.PAYLOAD_TOO_LARGE,
                        f"request body exceeds {limit} bytes",
                        {"limit": limit},
                        request_id,
                        path=scope.get("path", ""),
                        status=413,
                    )
                    response = JSONResponse(body, status_code=413, headers={REQUEST_ID_HEADER: request_id})
                    await response(scope, receive, send)
                    sent_status = 413
                return
            if message["type"] == "http.response.start":
                sent_status = int(message["status"])
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (REQUEST_ID_HEADER.lower().encode(), request_id.encode()),
                ]
            await send(message)

        await self.app(scope, counting_receive, send_with_id)
        return sent_status
