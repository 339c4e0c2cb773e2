"""Memory-loop routes: the OpenAI-compatible proxy, client-posted turns, the review queue and the
compaction trigger. Authentication reuses the API's ``CurrentActor`` / ``AdminPrincipal``."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from service.api.deps import (
    SESSION_HEADER,
    AdminPrincipal,
    CurrentActor,
    CurrentPrincipal,
    actor_of,
    authenticate,
    bearer_scheme,
    raw_services,
)
from service.api.errors import OpenAIErrorOut, openai_error_responses, request_id_of
from service.auth.actor import Actor
from service.domain.belief import MAX_CONTENT_CHARS, MAX_WHY_CHARS
from service.domain.json_tree import holds_lone_surrogate, nesting_depth
from service.errors import ErrorCode, NotFound, StoreUnavailable, TenureError, ValidationFailed
from service.extraction.reviews import Action, MergeChoice, ReviewService
from service.extraction.sidecar import split_sidecar
from service.proxy.service import (
    ChatProxy,
    ChatRequest,
    MemoryLoop,
    TurnContext,
    TurnIn,
    openai_error_body,
)
from service.proxy.upstream import UpstreamFailure
from service.storage.reviews import ReviewItem, ReviewKind, ReviewStatus
from service.storage.turns import TurnRecord

router = APIRouter(prefix="/v1", tags=["memory loop"])
_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
TurnIdPath = Annotated[str, Path(pattern=_ID, description="A turn id")]
ReviewIdPath = Annotated[str, Path(pattern=_ID, description="A review item id")]
WARNING_HEADER = "x-tenure-warning"
BodyT = TypeVar("BodyT", bound=BaseModel)
# deeper than any real tool schema; well below the ~255 levels pydantic serializes
MAX_PROXY_DEPTH = 100

_TYPES = {
    ErrorCode.VALIDATION_ERROR: "invalid_request_error",
    ErrorCode.MODEL_NOT_SUPPORTED: "invalid_request_error",
    ErrorCode.PAYLOAD_TOO_LARGE: "invalid_request_error",
    ErrorCode.UPSTREAM_ERROR: "upstream_error",
    ErrorCode.UPSTREAM_TIMEOUT: "timeout_error",
    ErrorCode.UPSTREAM_NOT_CONFIGURED: "upstream_error",
    ErrorCode.UPSTREAM_ANSWER_TOO_LARGE: "upstream_error",
}  # a rate limit is refused by proxy_actor, before the handler: it answers in the service's shape


def openai_error(request: Request, exc: TenureError) -> JSONResponse:
    """The route's own failures in OpenAI's shape, with the request id like every other error of
    the route (the API fuzz found them without it)."""
    status = exc.status if isinstance(exc, UpstreamFailure) else exc.code.http_status
    error = openai_error_body(exc.code.value, exc.message, _TYPES.get(exc.code, "api_error"))
    body = {"error": {**error, "request_id": request_id_of(request)}}
    if exc.details is not None:
        body["error"]["details"] = exc.details
    return JSONResponse(body, status_code=status, headers=exc.headers if isinstance(exc, UpstreamFailure) else None)


async def proxy_actor(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    session: Annotated[str | None, Header(alias=SESSION_HEADER, max_length=200)] = None,
) -> Actor:
    """The API's authentication without the API's "indices ready" gate: the proxy must answer
    (without memory) when OpenSearch is down, and JWTs verify without the store. Charged as a
    read: the proxy writes no belief itself (extraction is asynchronous), so a Redis outage lets
    it answer rather than refuse. A blank session header means none here (OpenAI clients)."""
    identity = await authenticate(request, raw_services(request), credentials, read_only=True)
    return actor_of(request, identity, session.strip() if session and session.strip() else None)


ProxyActor = Annotated[Actor, Depends(proxy_actor)]


def memory_loop(request: Request) -> MemoryLoop:
    return raw_services(request).loop


def refuse_unforwardable(raw: Any, body: bytes | None = None) -> None:
    """What parses but could never be sent on to the model or answered: a body nested past what
    the serializer takes (pydantic stops near 255 levels), an unpaired surrogate no UTF-8 encoder
    takes. Refused here, before any recall or upstream work. ``body``: the bytes ``raw`` was
    parsed from (a body without a surrogate escape is not walked for one)."""
    if nesting_depth(raw) > MAX_PROXY_DEPTH:
        raise ValidationFailed(f"the request body is nested too deeply (more than {MAX_PROXY_DEPTH} levels)")
    if holds_lone_surrogate(raw, body):
        raise ValidationFailed("the request body holds an unpaired UTF-16 surrogate (a lone \\ud800-\\udfff escape)")


async def proxy_body(request: Request, model: type[BodyT], what: str) -> BodyT:
    """A proxy request body, parsed by hand so every failure is a ``ValidationFailed`` the route
    renders in its SDK's error shape (the framework's 422 would use the service's)."""
    try:
        raw = await request.json()
    except ValueError:
        raise ValidationFailed("the request body is not valid JSON") from None
    except RecursionError:
        # json's C decoder recurses per nesting level: 1,000 brackets exhaust the stack
        raise ValidationFailed("the request body is nested too deeply") from None
    refuse_unforwardable(raw, await request.body())  # the bytes json() read, kept by the request
    try:
        return model.model_validate(raw)
    except RecursionError:
        raise ValidationFailed("the request body is nested too deeply") from None
    except ValidationError as exc:
        details = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()[:20]]
        raise ValidationFailed(f"invalid {what}", details=details) from None


@router.post(
    "/chat/completions",
    summary="OpenAI-compatible chat completions with memory (streaming and not)",
    responses={
        **openai_error_responses(401, 413, 429, 502, 504),
        422: {"model": OpenAIErrorOut, "description": "Invalid request, or a model below its floor in strict mode"},
        503: {
            "model": OpenAIErrorOut,
            "description": "No upstream model provider is configured (`upstream_not_configured`)",
        },
    },
)
async def chat_completions(
    request: Request,
    actor: ProxyActor,
    x_session_id: Annotated[str | None, Header(max_length=200)] = None,
    x_tenure_scope: Annotated[str | None, Header(max_length=2000)] = None,
) -> Any:
    loop = memory_loop(request)
    proxy = ChatProxy(loop, raw_services(request).recall)
    try:
        body = await proxy_body(request, ChatRequest, "chat completion request")
        ctx, forwarded = await proxy.prepare(actor, body, actor.session_id or x_session_id, x_tenure_scope)
        headers = {WARNING_HEADER: ctx.gate.warning} if ctx.gate.warning else {}
        if body.stream:
            events = await proxy.stream(ctx, forwarded)
            return StreamingResponse(
                events,
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        data, after = await proxy.complete(ctx, forwarded)
        return JSONResponse(data, headers=headers, background=BackgroundTask(after))
    except TenureError as exc:
        return openai_error(request, exc)


class TurnOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turn_id: str
    session_id: str
    scope: list[str]
    parse_status: str
    extraction_status: str
    visible: str | None = None
    result: dict[str, Any] | None = None
    model_warning: str | None = None


def _turn_out(turn: TurnRecord, warning: str | None = None, visible: str | None = None) -> TurnOut:
    return TurnOut(
        turn_id=turn.turn_id,
        session_id=turn.session_id,
        scope=turn.scope,
        parse_status=turn.parse_status,
        extraction_status=turn.extraction_status,
        visible=visible,
        result=turn.result,
        model_warning=warning,
    )


@router.post(
    "/turns",
    status_code=202,
    response_model=TurnOut,
    summary="Post a completed turn for extraction",
)
async def post_turn(request: Request, body: TurnIn, actor: CurrentActor) -> Any:
    loop = memory_loop(request)
    principal = actor.principal
    gate = loop.gate.check(body.model, extraction_enabled=loop.extraction_enabled(principal.tenant_id))
    if body.turn_id:
        try:
            existing = await run_in_threadpool(loop.turns.get, principal, body.turn_id)
            return JSONResponse(_turn_out(existing).model_dump(), status_code=200)
        except NotFound:
            pass
    # the same last line as the proxy's: a block echoing a belief this turn's context carried (a
    # colleague's shared belief the model repeated between markers) is not the turn's sidecar
    injected = await run_in_threadpool(loop.injected_texts, principal, body.injected_ids)
    split = split_sidecar(body.assistant_message, injected)
    ctx = TurnContext(
        actor=actor,
        model=body.model,
        session_id=body.session_id or actor.session_id or "client",
        scopes=body.scope,
        gate=gate,
        user_message=body.user_message,
        injected_ids=body.injected_ids,
    )
    if body.turn_id:
        ctx.turn_id = body.turn_id
    recorded = await run_in_threadpool(
        loop.record, ctx, assistant=split.visible, raw=split.raw, status=split.status, park_on_outage=False
    )
    if not recorded:
        raise StoreUnavailable("the turn could not be recorded; retry later")
    turn = await run_in_threadpool(loop.turns.get, principal, ctx.turn_id)
    headers = {WARNING_HEADER: gate.warning} if gate.warning else {}
    # without markers this is the message as sent; an echoed block is not shown back either
    return JSONResponse(_turn_out(turn, gate.warning, split.visible).model_dump(), status_code=202, headers=headers)


@router.get("/turns/{turn_id}", response_model=TurnOut, summary="A turn of yours and its extraction outcome")
async def get_turn(request: Request, turn_id: TurnIdPath, principal: CurrentPrincipal) -> TurnOut:
    turn = await run_in_threadpool(memory_loop(request).turns.get, principal, turn_id)
    return _turn_out(turn)


def _reviews(request: Request) -> ReviewService:
    reviews: ReviewService = request.app.state.services.reviews
    return reviews


@router.get("/reviews", response_model=list[ReviewItem], summary="Your open review items")
async def my_reviews(
    request: Request,
    principal: CurrentPrincipal,
    kind: ReviewKind | None = None,
    status: ReviewStatus | None = "open",
    size: Annotated[int, Query(ge=1, le=200)] = 50,
) -> list[ReviewItem]:
    loop = memory_loop(request)
    return await run_in_threadpool(lambda: loop.reviews.list(principal, kind=kind, status=status, size=size))


@router.get("/admin/reviews", response_model=list[ReviewItem], summary="The tenant's review queue (admin)")
async def admin_reviews(
    request: Request,
    admin: AdminPrincipal,
    kind: ReviewKind | None = None,
    status: ReviewStatus | None = "open",
    size: Annotated[int, Query(ge=1, le=200)] = 50,
) -> list[ReviewItem]:
    loop = memory_loop(request)
    return await run_in_threadpool(
        lambda: loop.reviews.list(admin, kind=kind, status=status, tenant_wide=True, size=size)
    )


class MergeIn(BaseModel):
    """How a conflict's proposal is merged into the existing belief (``action: merge``)."""

    # One line above: the SDK's generated models copy the docstring. The belief keeps its name,
    # type and scopes and gains the proposal's aliases (and its name, when it differs); content and
    # why-it-matters come from the side chosen, or from the edited text.

    model_config = ConfigDict(extra="forbid")

    content: Literal["existing", "proposed"] = Field("existing", description="Whose content the merged version keeps")
    why_it_matters: Literal["existing", "proposed"] = Field("existing", description="Whose why-it-matters it keeps")
    edited_content: str | None = Field(
        None, min_length=1, max_length=MAX_CONTENT_CHARS, description="New content instead of either side's"
    )
    edited_why_it_matters: str | None = Field(
        None, min_length=1, max_length=MAX_WHY_CHARS, description="New why-it-matters instead of either side's"
    )

    def choice(self) -> MergeChoice:
        return MergeChoice(**self.model_dump())


class ResolveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Action = Field(
        description=(
            "conflicts: keep_existing, accept_proposed (the proposal supersedes the belief), merge (into the "
            "belief, see `merge`) or dismiss; alias candidates: apply_alias or dismiss"
        )
    )
    merge: MergeIn | None = Field(None, description="Only with action merge; defaults keep the existing texts")


@router.post("/admin/reviews/{review_id}/resolve", response_model=ReviewItem, summary="Resolve a review item")
async def resolve_review(
    request: Request, review_id: ReviewIdPath, body: ResolveIn, admin: AdminPrincipal
) -> ReviewItem:
    service = _reviews(request)
    merge = body.merge.choice() if body.merge is not None else None
    return await run_in_threadpool(service.resolve, admin, review_id, body.action, merge)


class CompactionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = False


@router.post("/admin/compaction", status_code=202, summary="Run compaction for your tenant now")
async def trigger_compaction(
    request: Request, admin: AdminPrincipal, body: Annotated[CompactionIn | None, Body()] = None
) -> dict[str, Literal["queued"] | str | bool]:
    loop = memory_loop(request)
    force = body.force if body else False
    await run_in_threadpool(loop.queue.plan_compaction, admin.tenant_id, force)
    return {"status": "queued", "tenant_id": admin.tenant_id, "force": force}
