"""``POST /v1/recall`` served without FastAPI's routing and request machinery (issue 16).

Recall is the hot route: sessions call it on every message, and the sequential p50 target is a
few milliseconds. FastAPI's path to the endpoint (the exception and exit-stack middleware, the
router matching each route in turn, the content-type parse, the dependency and header-parameter
resolution, the endpoint runner) cost ~0.15 ms of the API's CPU per recall at 1M beliefs, for
any message (docs/benchmarks.md). This middleware sits innermost among the app's own, inside
:class:`~service.api.errors.RequestContextMiddleware` (request id, body limit, access log and
metrics stay as they are), and serves a well-formed recall itself with the route's own parts:
the same bearer scheme, :func:`~service.api.deps.authenticate`, the same validation of the body
(stdlib JSON, then :class:`RecallIn` as FastAPI validates it) and the same endpoint function;
errors the services raise go to the app's own exception handlers, as FastAPI would send them.

Anything it is not sure of goes to the framework unchanged: another path or method, a mounted
prefix, a body that is not plain JSON (no or another content type, empty, not parseable, not a
valid :class:`RecallIn`), a session header the route's parameter would refuse. The framework then
answers exactly as before, with the body replayed, so every error a caller can provoke before the
services run is the framework's own. ``TENURE_API_RECALL_LANE=false`` turns the lane off.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.routing import APIRoute
from starlette._exception_handler import wrap_app_handling_exceptions  # FastAPI's own endpoint wrapper uses it
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import SESSION_HEADER, SESSION_MAX_CHARS, bearer_scheme, resolve_recall_caller
from service.api.recall_ahead import RecallAhead
from service.api.routes.recall import RecallIn, recall, router

# the route the router would select (FastAPI sets it as scope["route"]): its endpoint is ours
RECALL_ROUTE = next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is recall)
RECALL_PATH = RECALL_ROUTE.path
_SESSION_HEADER = SESSION_HEADER.lower().encode("latin-1")
# Starlette's scope["starlette.exception_handlers"]: by exception type, by status
Handlers = tuple[dict[Any, Any], dict[int, Any]]


class RecallLane:
    """Pure ASGI middleware: ``POST /v1/recall`` with a JSON body, served directly (see the module)."""

    def __init__(self, app: ASGIApp, enabled: bool = True) -> None:
        self.app = app
        self.enabled = enabled
        self._handlers: Handlers | None = None  # the app's, once (they are fixed at start-up)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not (self.enabled and _is_recall(scope) and _plain_json(scope) and _session_header_ok(scope)):
            await self.app(scope, receive, send)
            return
        try:
            body, receive = await _read_body(receive)
        except Exception as exc:  # noqa: BLE001 - the body limit while it streams: as FastAPI answers it
            await self._handled(_raising(_body_error(exc)), Request(scope, receive))(scope, receive, send)
            return
        payload = _valid_payload(body)
        if payload is None:  # the framework's own answer (422 and its details)
            await self.app(scope, receive, send)
            return
        # what the router would have set: the access log's and the metrics' route label
        scope["route"], scope["endpoint"] = RECALL_ROUTE, recall
        request = Request(scope, receive)
        await self._handled(_serve(request, payload), request)(scope, receive, send)

    def _handled(self, app: ASGIApp, request: Request) -> ASGIApp:
        """``app`` with the app's exception handlers, as FastAPI wraps an endpoint."""
        if self._handlers is None:
            self._handlers = _exception_handlers(request.app.exception_handlers)
        request.scope["starlette.exception_handlers"] = self._handlers
        return wrap_app_handling_exceptions(app, request)


def _serve(request: Request, payload: RecallIn) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        credentials = await bearer_scheme(request)
        ahead = RecallAhead(payload.scopes, payload.query, budget=payload.budget, explain=payload.explain)
        caller = await resolve_recall_caller(request, credentials, request.headers.get(SESSION_HEADER), ahead)
        response = await recall(payload, caller)
        await response(scope, receive, send)

    return app


def _body_error(exc: Exception) -> Exception:
    """What FastAPI makes of an error while it reads a body (the outer middleware then answers
    413 for the body limit)."""
    if isinstance(exc, HTTPException):
        return exc
    return HTTPException(status_code=400, detail="There was an error parsing the body")


def _raising(exc: Exception) -> ASGIApp:
    async def app(_scope: Scope, _receive: Receive, _send: Send) -> None:
        raise exc

    return app


def _is_recall(scope: Scope) -> bool:
    return (
        scope["type"] == "http"
        and scope["method"] == "POST"
        and scope["path"] == RECALL_PATH
        and not scope.get("root_path")
    )


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope["headers"] if key.lower() == name]


def _plain_json(scope: Scope) -> bool:
    """One ``Content-Type`` of ``application/json`` (parameters allowed): what FastAPI parses as
    JSON too. Other JSON types and a missing type are left to it."""
    types = _header(scope, b"content-type")
    if len(types) != 1:
        return False
    media_type = types[0].split(b";", 1)[0].strip().lower()
    return media_type == b"application/json"


def _session_header_ok(scope: Scope) -> bool:
    """A session header the route's parameter takes (``max_length``), or none; the blank check
    is the route's own, in :func:`resolve_recall_caller`."""
    values = _header(scope, _SESSION_HEADER)
    return not values or len(values[0].decode("latin-1")) <= SESSION_MAX_CHARS


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole body (the outer middleware enforces its size limit as it streams), and a
    ``receive`` that gives it again before anything else the client sends (a disconnect)."""
    chunks: list[bytes] = []
    pending: Message | None = None
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client left: let the framework see it
            pending = message
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    return body, _replaying(body, receive, pending)


def _replaying(body: bytes, receive: Receive, pending: Message | None = None) -> Receive:
    replayed = False

    async def again() -> Message:
        nonlocal replayed, pending
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": pending is not None}
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    return again


def _valid_payload(body: bytes) -> RecallIn | None:
    """The body as the route validates it (``json.loads``, then the model from Python values),
    or None when the framework should answer instead."""
    if not body:
        return None
    try:
        return RecallIn.model_validate(json.loads(body))
    except Exception:  # noqa: BLE001 - not JSON (or nested past the recursion limit), not a RecallIn
        return None


def _exception_handlers(handlers: dict[Any, Any]) -> Handlers:
    """The app's handlers as Starlette's ``ExceptionMiddleware`` holds them (the catch-all for
    ``Exception`` stays with ``ServerErrorMiddleware``, outside this middleware)."""
    by_type: dict[Any, Any] = {}
    by_status: dict[int, Any] = {}
    for key, handler in handlers.items():
        if isinstance(key, int):
            by_status[key] = handler
        elif key is not Exception:
            by_type[key] = handler
    return by_type, by_status
