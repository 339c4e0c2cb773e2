"""The MCP server: Tenure's memory as Model Context Protocol tools, built on the official ``mcp`` SDK.

One set of tools, two transports:

* **streamable HTTP at ``/mcp``** in the API's own FastAPI app (:func:`mount`). Every MCP request
  must carry the caller's own ``Authorization: Bearer`` API key or JWT; a tool call is executed as a
  REST call *of that caller* (its credential and its address) against the same app, in process
  (``httpx.ASGITransport``). So every
  tool goes through the same authenticator, rate limit, grants and scope chokepoint
  (``service/storage/access.py``) as ``curl`` would, and a recall writes the same injection receipt.
  There is no server credential and nothing is forwarded to another service.
* **stdio** (``tenure mcp``): a local process for an editor to spawn, talking to a deployment's REST
  API with the user's key (``TENURE_CLI_URL`` / ``TENURE_CLI_KEY``) through the Python SDK.

Stateless HTTP (no MCP session kept in the process), so any API worker can answer any request.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

import httpx
from fastapi import FastAPI
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field
from pydantic_core import from_json
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tenure_client import AsyncTenure, TenureError

MCP_PATH = "/mcp"
INVALID_REQUEST = -32600  # JSON-RPC 2.0
INSTRUCTIONS = """Tenure is your team's shared memory of settled decisions, preferences and open questions.
Call `recall` with the user's message (and the session's scopes, e.g. project:payments) at the start
of a task and put the returned injection into your working context. Use `remember` when the user
settles something worth keeping, `supersede` when a decision changes, `reinforce` when one is
confirmed. Only what your credential may see is ever returned."""

# What the tools do with one caller's client: the HTTP transport builds one per request from the
# caller's bearer credential, stdio one per process from the user's key.
ClientFactory = Callable[[Context], Awaitable[AsyncTenure]]
BeliefTypeName = Literal["preference", "decision", "entity", "open_question", "relation"]
Scopes = Annotated[list[str], Field(description="Scope labels, e.g. project:payments, team:core, domain:code")]


def _belief(b: Any) -> dict[str, Any]:
    """The fields an agent needs (the full record is one ``get`` away)."""
    return {
        "id": b.id,
        "type": b.type,
        "canonical_name": b.canonical_name,
        "aliases": b.aliases or [],
        "content": b.content,
        "why_it_matters": b.why_it_matters,
        "scope": b.scope,
        "epistemic_status": b.epistemic_status,
        "pinned": b.pinned,
        "version": b.version,
        "superseded_by": b.superseded_by,
        "resolved_at": b.resolved_at.isoformat() if b.resolved_at else None,
    }


async def _run(factory: ClientFactory, ctx: Context, call: Callable[[AsyncTenure], Awaitable[Any]]) -> Any:
    """Run one tool as the caller; an API refusal becomes a tool error the model can read."""
    client = await factory(ctx)
    try:
        return await call(client)
    except TenureError as exc:
        raise ToolError(str(exc)) from exc
    finally:
        await client.aclose()


def build_server(factory: ClientFactory) -> MCPServer:
    server = MCPServer("tenure", instructions=INSTRUCTIONS, version="0.1.0")

    @server.tool()
    async def recall(
        ctx: Context,
        query: Annotated[str, Field(description="The user's message, or any text to recall for")],
        scopes: Scopes | None = None,
        session_id: Annotated[str | None, Field(description="Groups receipts of one session")] = None,
    ) -> dict[str, Any]:
        """Recall the beliefs relevant to a message: returns the injection block to put into the
        system prompt, and the ids of what was injected (an injection receipt is written)."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            r = await c.recall(query, scopes=scopes or [], session_id=session_id)
            return {"injection": r.injection.text, "injected_ids": r.injected_ids, "receipt_id": r.receipt_id}

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def remember(
        ctx: Context,
        type: BeliefTypeName,  # noqa: A002 - the belief field's name
        canonical_name: Annotated[str, Field(description="snake_case name, e.g. session_cache")],
        content: Annotated[str, Field(description="What is settled, in one or two sentences")],
        scope: Scopes,
        aliases: Annotated[list[str] | None, Field(description="Words that should surface it")] = None,
        why_it_matters: Annotated[str, Field(description="The directive an assistant should follow")] = "",
    ) -> dict[str, Any]:
        """Store a new belief (decision, preference, entity, open_question or relation)."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            b = await c.beliefs.create(
                type=type,
                canonical_name=canonical_name,
                content=content,
                scope=scope,
                aliases=aliases or [],
                why_it_matters=why_it_matters,
            )
            return _belief(b)

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def supersede(
        ctx: Context,
        belief_id: str,
        content: Annotated[str, Field(description="The new content that replaces the old")],
        reason: str | None = None,
        aliases: list[str] | None = None,
    ) -> dict[str, Any]:
        """Replace a belief with a new version (the old one is kept in its history)."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            r = await c.beliefs.supersede(belief_id, content=content, reason=reason, aliases=aliases or [])
            return {"superseded": _belief(r.superseded), "current": _belief(r.current)}

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def reinforce(ctx: Context, belief_id: str, aliases: list[str] | None = None) -> dict[str, Any]:
        """Confirm a belief (optionally adding aliases that should surface it)."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            return _belief(await c.beliefs.reinforce(belief_id, aliases or []))

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def search_beliefs(
        ctx: Context,
        query: Annotated[str | None, Field(description="Match names and aliases")] = None,
        scopes: Scopes | None = None,
        types: list[BeliefTypeName] | None = None,
        limit: Annotated[int, Field(ge=1, le=200)] = 20,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """List the live beliefs you can see, filtered by name/alias text, scope and type."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            page = await c.beliefs.list(
                limit=limit, cursor=cursor, q=query, scope=scopes or [], type=types or [], status=["live"]
            )
            return {"items": [_belief(b) for b in page.items], "next_cursor": page.next_cursor}

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def history(ctx: Context, belief_id: str) -> dict[str, Any]:
        """A belief's supersession chain (oldest first) and its change log."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            h = await c.beliefs.history(belief_id)
            return {
                "chain": [_belief(b) for b in h.chain],
                "change_log": [e.model_dump(mode="json") for e in h.change_log],
            }

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def open_questions(
        ctx: Context,
        scopes: Scopes | None = None,
        limit: Annotated[int, Field(ge=1, le=200)] = 50,
        cursor: Annotated[str | None, Field(description="next_cursor of the previous page")] = None,
    ) -> dict[str, Any]:
        """The team's unresolved open questions you can see (page after page with ``cursor``)."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            page = await c.beliefs.list(
                limit=limit, cursor=cursor, scope=scopes or [], type=["open_question"], status=["live"]
            )
            return {"items": [_belief(b) for b in page.items], "next_cursor": page.next_cursor}

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    @server.tool()
    async def resolve(
        ctx: Context,
        belief_id: str,
        note: str | None = None,
        resolved_by: Annotated[str | None, Field(description="The belief that answers the question")] = None,
    ) -> dict[str, Any]:
        """Resolve an open question (optionally naming the belief that answers it)."""

        async def go(c: AsyncTenure) -> dict[str, Any]:
            return _belief(await c.beliefs.resolve(belief_id, note=note, resolved_by=resolved_by))

        result: dict[str, Any] = await _run(factory, ctx, go)
        return result

    return server


# ----------------------------------------------------------------- HTTP transport

INTERNAL_BASE = "http://tenure.internal"


def _bearer(headers: Mapping[str, str] | None) -> str | None:
    value = (headers or {}).get("authorization", "")
    scheme, _, credential = value.partition(" ")
    return credential.strip() or None if scheme.lower() == "bearer" else None


def _caller_address(ctx: Context) -> tuple[str, int]:
    """The MCP caller's own address (behind a proxy: what uvicorn's ``--proxy-headers`` made of
    it), for the in-process REST call: the failed-authentication limit keys on it, and
    ``httpx.ASGITransport``'s default (``127.0.0.1:123`` for every call) would let one caller's
    bad credentials block every MCP user of every tenant. No peer (a Unix socket): "unknown", as
    the REST API counts such a request."""
    peer = getattr(ctx.request_context.request, "client", None)
    return (peer.host, peer.port) if peer is not None else ("unknown", 0)


def in_process_factory(app: FastAPI) -> ClientFactory:
    """Tool calls over HTTP: the caller's own credential and address, against this same app, in
    process."""

    async def factory(ctx: Context) -> AsyncTenure:
        credential = _bearer(ctx.headers)
        if credential is None:  # the route wrapper refuses these first; a second wall costs nothing
            raise ToolError("unauthenticated: send Authorization: Bearer <API key or JWT>")
        transport = httpx.ASGITransport(app=app, client=_caller_address(ctx))
        return AsyncTenure(INTERNAL_BASE, credential, transport=transport, max_retries=0)

    return factory


class RequireBearer:
    """The MCP endpoint answers only requests that carry a bearer credential: a client without one
    gets the service's 401 (with ``WWW-Authenticate``) before any MCP message is read. Whether the
    credential is valid is decided per tool call by the REST API itself."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if _bearer(headers) is None:
            request_id = scope.get("state", {}).get("request_id")
            body = {
                "error": {
                    "code": "unauthenticated",
                    "message": "the MCP endpoint needs your own credential: Authorization: Bearer <API key or JWT>",
                    "details": None,
                    "request_id": request_id,
                }
            }
            await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)


class OnlyPost:
    """The endpoint takes only POST. It is stateless, so no session has server-sent events a GET
    stream could carry, or an end a DELETE could ask for; the SDK's transport would still answer
    a GET with an event stream that never ends, holding a connection and a task of the worker for
    as long as the caller likes (with any bearer, junk included). MCP's answer for a server
    without that stream: 405."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") == "POST":
            await self.app(scope, receive, send)
            return
        message = "Method Not Allowed: this stateless endpoint takes only POST (no event stream, no session)"
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}
        await JSONResponse(body, status_code=405, headers={"Allow": "POST"})(scope, receive, send)


def _invalid_request(body: bytes) -> str | None:
    """Why a POSTed JSON-RPC message is an Invalid Request the SDK's transport would mishandle,
    or ``None``. A request whose ``id`` is no string or integer (null, true, 1.5, an object)
    validates there as a notification and is answered 202 with no reply, so its caller waits for
    ever; MCP requires a string or integer id. A batch (an array, which the 2025-03-26 revision
    allowed and 2025-06-18 dropped) got a 400 with -32602, which says the params were wrong.
    Unparseable JSON is left to the SDK (-32700)."""
    try:
        message = from_json(body)
    except ValueError:
        return None
    if isinstance(message, list):
        return "Invalid Request: JSON-RPC batches are not supported; send one message per request"
    if isinstance(message, dict) and "method" in message and "id" in message:
        request_id = message["id"]
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            return "Invalid Request: a request's id must be a string or an integer (a notification has no id)"
    return None


class ValidRequests:
    """Answers what the SDK's transport would mishandle (:func:`_invalid_request`) with a JSON-RPC
    Invalid Request error (-32600, ``id`` null: a bad id cannot be echoed); hands the rest to it
    with the body it read."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await Request(scope, receive).body()  # the body limit and a client gone as for any route
        invalid = _invalid_request(body)
        if invalid is not None:
            answer = {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": invalid}}
            await JSONResponse(answer, status_code=400)(scope, receive, send)
            return
        await self.app(scope, _replayed(body, receive), send)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed out first, whole."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def mount(app: FastAPI) -> MCPServer:
    """Add ``/mcp`` (streamable HTTP, stateless, JSON responses) to ``app``. The caller's lifespan
    must run ``server.session_manager.run()``."""
    server = build_server(in_process_factory(app))
    # DNS-rebinding protection guards cookie- or network-authenticated local servers; here every
    # request needs a bearer credential a rebinding page cannot have, and the API serves any host.
    starlette_app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    endpoint = next(r for r in starlette_app.routes if isinstance(r, Route) and r.path == MCP_PATH)
    app.router.routes.append(
        Route(MCP_PATH, endpoint=RequireBearer(OnlyPost(ValidRequests(endpoint.app))), include_in_schema=False)
    )
    return server


# ---------------------------------------------------------------- stdio transport


def stdio_server(url: str | None = None, key: str | None = None, *, timeout_s: float = 30.0) -> MCPServer:
    """The server ``tenure mcp`` runs: every tool is a REST call with the user's own key, each
    waiting at most ``timeout_s`` for the API (``TENURE_CLI_TIMEOUT_S``, as the other commands)."""
    base = url or os.environ.get("TENURE_CLI_URL") or "http://127.0.0.1:8000"
    credential = key or os.environ.get("TENURE_CLI_KEY")

    async def factory(_ctx: Context) -> AsyncTenure:
        if not credential:
            raise ToolError("no credential: set TENURE_CLI_KEY (an API key from your admin) for `tenure mcp`")
        return AsyncTenure(base, credential, timeout=timeout_s)

    return build_server(factory)
