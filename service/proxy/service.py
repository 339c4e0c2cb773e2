"""The memory-loop proxy: recall -> system prompt -> upstream -> sidecar stripped -> turn recorded
-> extraction enqueued. Used by the ``/v1/chat/completions`` and ``/v1/turns`` routes.

Failure policy: bad input and refused models are 4xx; upstream failures are OpenAI-style 502/504
(or the upstream's own 4xx); a failing store never fails the request: the answer goes out without
memory (``tenure.degraded``) and an unrecorded turn is reported the same way.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import redis
from opensearchpy import OpenSearch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool

from service.auth.actor import Actor
from service.config import Settings
from service.domain import scopes as scope_rules
from service.domain.belief import Belief, BeliefId
from service.domain.principal import Principal
from service.domain.visible_text import has_control_or_surrogate
from service.errors import Conflict, StoreUnavailable, ValidationFailed
from service.extraction.model_gate import GateDecision, ModelGate
from service.extraction.parked_turns import ParkedTurns
from service.extraction.queue import TaskQueue
from service.extraction.sidecar import ParseStatus, StreamStripper, split_blocks, split_sidecar
from service.lean_redis import EventLoopRedis
from service.loops import LoopBound
from service.proxy.prompt import build_system_prompt
from service.proxy.upstream import AnswerBudget, Target, Upstream, ended_early, redacted_event, stream_failure
from service.recall.context import RecallResult
from service.recall.render import InjectionBlock
from service.recall.service import RecallService
from service.storage.beliefs import BeliefStore
from service.storage.reviews import ReviewStore
from service.storage.turns import TurnRecord, TurnStore

log = logging.getLogger("tenure.proxy")
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    """The OpenAI request; unknown fields are passed through to the upstream."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(..., min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=1000)
    stream: bool = False
    metadata: dict[str, Any] | None = None


class TurnIn(BaseModel):
    """A completed turn posted by a client that called the model itself."""

    model_config = ConfigDict(extra="forbid")

    turn_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    session_id: str | None = Field(None, min_length=1, max_length=200)
    scope: list[str] = Field(default_factory=list, max_length=scope_rules.MAX_SCOPES)
    model: str = Field(..., min_length=1, max_length=200)
    user_message: str = Field(..., max_length=200_000)
    assistant_message: str = Field(..., max_length=200_000)
    # ids the store looks up: the belief id pattern bounds their length and characters (a
    # surrogate failed the store's encoder, a 40 kB id OpenSearch's term limit)
    injected_ids: list[BeliefId] = Field(default_factory=list, max_length=200)

    @field_validator("scope")
    @classmethod
    def _scopes(cls, values: list[str]) -> list[str]:
        return scope_rules.normalize_scopes(values)

    @field_validator("session_id", "model")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # copied into every extracted belief's provenance and change log; the proxy refuses such
        # a session id too (session_and_scope_of)
        if value is not None and has_control_or_surrogate(value):
            raise ValueError("must not contain control characters")
        return value


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")


def session_and_scope(
    body: ChatRequest, actor: Actor, header_session: str | None, header_scope: str | None
) -> tuple[str, list[str]]:
    first = [m.model_dump(mode="json") for m in body.messages[:3]]
    return session_and_scope_of(body.metadata or {}, first, actor, header_session, header_scope)


def _sendable_session(session: Any) -> bool:
    """A session id goes back in the JSON answer and into the turn record: a control character or
    an unpaired surrogate (which no UTF-8 encoder takes) in it failed the answer after the model
    had been paid for."""
    return (
        isinstance(session, str)
        and bool(session.strip())
        and len(session) <= 200
        and not has_control_or_surrogate(session)
    )


def session_and_scope_of(
    meta: dict[str, Any],
    first_messages: list[Any],
    actor: Actor,
    header_session: str | None,
    header_scope: str | None,
) -> tuple[str, list[str]]:
    """The session id and scopes of a proxied request, whatever its API: header, else the body's
    ``metadata``, else derived from the caller and the first (at most three) messages."""
    session = header_session or meta.get("session_id")
    if session is not None and not _sendable_session(session):
        raise ValidationFailed(
            "session id must be a non-empty string of at most 200 characters, without control characters"
        )
    if not session:
        who = f"{actor.principal.tenant_id}|{actor.principal.user_id}"
        raw = f"{who}|{json.dumps(first_messages[:3], sort_keys=True)}"
        session = "derived_" + hashlib.sha256(raw.encode()).hexdigest()[:24]
    scope_raw: Any = meta.get("scope")
    if scope_raw is None and header_scope:
        scope_raw = [s for s in header_scope.split(",") if s.strip()]
    if isinstance(scope_raw, str):
        scope_raw = [scope_raw]
    if scope_raw is None:
        scope_raw = []
    if not isinstance(scope_raw, list) or not all(isinstance(s, str) for s in scope_raw):
        raise ValidationFailed("scope must be a scope label or a list of scope labels")
    try:
        scopes = scope_rules.normalize_scopes(scope_raw)
    except scope_rules.InvalidScope as exc:
        raise ValidationFailed(str(exc)) from None
    return session.strip(), scopes


def belief_texts(beliefs: Iterable[Belief]) -> list[str]:
    """The statements of beliefs a context carried: what a model could echo back."""
    return [text for b in beliefs for text in (b.content, b.why_it_matters) if text]


@dataclass
class TurnContext:
    actor: Actor
    model: str
    session_id: str
    scopes: list[str]
    gate: GateDecision
    user_message: str
    injected_ids: list[str] = field(default_factory=list)
    tiers: dict[str, list[str]] = field(default_factory=dict)
    recall: RecallResult | None = None
    degraded: list[str] = field(default_factory=list)
    turn_id: str = field(default_factory=lambda: f"turn-{uuid.uuid4().hex}")
    api: str = "openai"  # which ingress: "openai" (chat completions) or "anthropic" (messages)

    def injected_texts(self) -> list[str]:
        """The belief text this turn's context carried (for telling an echo from a sidecar)."""
        if self.recall is None:
            return []
        entries = [e for tier in self.recall.tiers().values() for e in tier]
        texts = belief_texts(e.belief for e in entries)
        return [*texts, self.recall.persona] if self.recall.persona else texts

    def _extraction(self, parse_status: str, recorded: bool | None) -> str:
        if not self.gate.extract:
            return "off"
        if recorded is False:
            return "not_recorded"
        return "skipped" if parse_status == ParseStatus.MISSING.value else "queued"

    def tenure(self, parse_status: str, recorded: bool | None) -> dict[str, Any]:
        """``recorded`` None: the turn is held in Redis before the response and stored in the
        index right after it (:meth:`ProxyTurns.secure`)."""
        return {
            "session_id": self.session_id,
            "turn_id": self.turn_id if recorded is not False else None,
            "turn_recording": "held_before_response" if recorded is None else "before_response",
            "scope": self.scopes,
            "injected_belief_ids": self.injected_ids,
            "injected_tiers": self.tiers,
            "parse_status": parse_status,
            "extraction": self._extraction(parse_status, recorded),
            "degraded": bool(self.degraded),
            "degraded_reasons": self.degraded,
            "model_warning": self.gate.warning,
        }


class MemoryLoop:
    """The memory loop's parts the API uses (built once, held by :class:`service.api.state.Services`)."""

    def __init__(
        self,
        settings: Settings,
        client: OpenSearch,
        rds: redis.Redis[bytes],
        async_redis: LoopBound[EventLoopRedis] | None = None,
    ):
        ns = settings.opensearch_namespace
        self.settings = settings
        self.turns = TurnStore(client, ns)
        self.reviews = ReviewStore(client, ns)
        self.beliefs = BeliefStore(client, ns)
        self.queue = TaskQueue(settings)
        self.parked = ParkedTurns(rds, self.turns, self.queue, settings, async_redis)
        self.upstream = Upstream(settings.loop)
        # strict by default: POST /v1/turns refuses what it cannot extract; the proxy decides per
        # tenant (strict_gate) whether a model below its floor is refused or served without extraction
        self.gate = ModelGate(settings.loop.model_families, strict=True)
        self.client = client

    async def aclose(self) -> None:
        await self.upstream.aclose()
        self.queue.close()

    def strict_gate(self, tenant_id: str) -> bool:
        override = self.settings.loop.for_tenant(tenant_id).strict_model_gate
        return self.settings.loop.strict_model_gate if override is None else override

    def extraction_enabled(self, tenant_id: str) -> bool:
        override = self.settings.loop.for_tenant(tenant_id).extraction_enabled
        return self.settings.loop.extraction_enabled if override is None else override

    def injected_texts(self, principal: Principal, injected_ids: list[str]) -> list[str]:
        """The text of the beliefs a client-posted turn says its context carried (``POST
        /v1/turns``: the client ran the recall, the proxy's own context is not there). Only
        beliefs the poster may see count; whatever their lifecycle now, they were injected."""
        return belief_texts(self.beliefs.get_many(principal, injected_ids, live_only=False))

    # ------------------------------------------------------------------ turn recording

    def record(
        self, ctx: TurnContext, *, assistant: str, raw: str | None, status: ParseStatus, park_on_outage: bool = True
    ) -> bool:
        """Durably record the turn, then enqueue its extraction. False when it could not be
        recorded (the answer still goes out; the turn is reported as degraded). With
        ``park_on_outage`` (the proxy: nobody is left to retry) an OpenSearch outage parks the
        turn in Redis; ``POST /v1/turns`` answers 503 instead and its caller retries."""
        turn = self.turn_record(ctx, assistant=assistant, raw=raw, status=status)
        return self.store_and_enqueue(turn, ctx.degraded, park_on_outage=park_on_outage)

    def turn_record(self, ctx: TurnContext, *, assistant: str, raw: str | None, status: ParseStatus) -> TurnRecord:
        """The turn as it is stored: the exchange, its sidecar (when extracted) and its context."""
        extract = ctx.gate.extract and status is not ParseStatus.MISSING
        return TurnRecord(
            tenant_id=ctx.actor.principal.tenant_id,
            turn_id=ctx.turn_id,
            owner_id=ctx.actor.principal.user_id,
            projects=sorted(ctx.actor.principal.projects),
            teams=sorted(ctx.actor.principal.teams),
            credential=ctx.actor.credential,
            credential_id=ctx.actor.credential_id,
            session_id=ctx.session_id,
            scope=ctx.scopes,
            source="proxy",
            model=ctx.model,
            user_message=ctx.user_message[: self.settings.loop.max_turn_message_chars],
            assistant_text=assistant[: self.settings.loop.max_turn_message_chars],
            sidecar_raw=raw[: self.settings.loop.sidecar_max_chars * 4] if raw and extract else None,
            parse_status=status.value,
            gate=ctx.gate.outcome.value,
            injected_ids=ctx.injected_ids,
            extraction_status="pending" if extract else "skipped",
        )

    def settle(self, turn: TurnRecord, held: str, degraded: list[str]) -> bool:
        """Store a turn held in Redis (:meth:`ParkedTurns.hold`), enqueue its extraction, then drop
        the held entry. With OpenSearch unavailable the entry stays where it is: the drain stores
        it once the store is back, as a parked turn."""
        try:
            self.turns.create(turn)
        except Conflict:
            pass  # a drain stored it first (and enqueued its extraction)
        except StoreUnavailable as exc:
            log.warning("turn %s left parked in Redis until OpenSearch is back: %s", turn.turn_id, exc.message)
            degraded.append("turn parked: stored and extracted once the store is back")
            return True
        else:
            self._enqueue(turn, degraded)
        self.parked.release(held)
        return True

    def store_and_enqueue(self, turn: TurnRecord, degraded: list[str], *, park_on_outage: bool) -> bool:
        try:
            self.turns.create(turn)
        except Conflict as exc:
            if park_on_outage:  # the proxy's own ids are fresh uuids: this is not the caller's doing
                log.warning("turn %s not recorded: %s", turn.turn_id, exc.message)
                degraded.append("turn not recorded: id conflict")
                return False
            # POST /v1/turns with an id that is taken (by a colleague: theirs reads as missing):
            # a retry can never succeed, so not a 503 but a 409 naming the fix.
            raise Conflict(f"turn id {turn.turn_id!r} is already taken; send the turn under another id") from exc
        except Exception as exc:
            if park_on_outage and isinstance(exc, StoreUnavailable):
                return self._park(turn, degraded, exc)
            log.warning("turn %s not recorded: %s", turn.turn_id, exc)
            degraded.append("turn not recorded: store unavailable")
            return False
        self._enqueue(turn, degraded)
        return True

    def _enqueue(self, turn: TurnRecord, degraded: list[str]) -> None:
        if turn.extraction_status == "pending":
            try:
                self.queue.extract(turn.tenant_id, turn.turn_id)
            except Exception as exc:  # the sweep re-enqueues pending turns later
                log.warning("extraction of %s not enqueued (sweep will retry): %s", turn.turn_id, exc)
                degraded.append("extraction delayed: queue unavailable")

    def _park(self, turn: TurnRecord, degraded: list[str], exc: StoreUnavailable) -> bool:
        """OpenSearch is down: keep the turn in Redis; the beat stores and extracts it later."""
        if self.parked.park(turn):
            log.warning("turn %s parked in Redis until OpenSearch is back: %s", turn.turn_id, exc.message)
            degraded.append("turn parked: stored and extracted once the store is back")
            return True
        log.warning("turn %s not recorded (OpenSearch and Redis both unavailable): %s", turn.turn_id, exc.message)
        degraded.append("turn not recorded: store unavailable")
        return False


class ProxyTurns:
    """What every proxy ingress shares: the turn context (session, scope, model gate), recall of the
    four tiers and, after the answer, the receipt, the turn record and the extraction task."""

    def __init__(self, loop: MemoryLoop, recall: RecallService):
        self.loop = loop
        self.recall = recall

    async def begin(
        self,
        actor: Actor,
        model: str,
        session_scope: tuple[str, list[str]],
        user_message: str,
        api: str = "openai",
    ) -> tuple[TurnContext, InjectionBlock | None]:
        """The turn's context (refused here when strict mode refuses the model) and the injection
        block recalled for the latest user message."""
        session, scopes = session_scope
        tenant = actor.principal.tenant_id
        gate = self.loop.gate.check(
            model, extraction_enabled=self.loop.extraction_enabled(tenant), strict=self.loop.strict_gate(tenant)
        )
        ctx = TurnContext(
            actor=replace(actor, session_id=session),
            model=model,
            session_id=session,
            scopes=scopes,
            gate=gate,
            user_message=user_message,
            api=api,
        )
        return ctx, await self._recall(ctx)

    async def _recall(self, ctx: TurnContext) -> InjectionBlock | None:
        """The four tiers for the latest user message. The injection receipt is written with the
        turn, after the answer (it is not on the latency path)."""
        try:
            built = await self.recall.abuild(
                ctx.actor.principal, ctx.scopes, ctx.user_message, write_version=ctx.actor.write_version
            )
        except Exception as exc:  # any store failure: answer without memory, flagged
            log.warning("recall failed, answering without memory: %s", exc)
            ctx.degraded.append("memory unavailable: recall failed")
            return None
        ctx.recall = built.result
        ctx.injected_ids = built.result.injected_ids
        ctx.tiers = built.result.tier_ids()
        return built.block

    def finish(self, ctx: TurnContext, *, assistant: str, raw: str | None, status: ParseStatus) -> bool:
        """Before the last chunk of a stream: the injection receipt (audit), then the turn, then
        the task."""
        self._record_receipt(ctx)
        return self.loop.record(ctx, assistant=assistant, raw=raw, status=status)

    async def secure(
        self, ctx: TurnContext, *, assistant: str, raw: str | None, status: ParseStatus
    ) -> tuple[Callable[[], bool], bool | None]:
        """Before a whole answer goes out: the injection receipt and the turn, both appended to
        Redis at once (one round trip on the event loop's client), so a process killed once the
        answer is sent loses neither. Returns the rest, for after the answer (the turn stored, its
        task enqueued, the held entry dropped), and ``recorded`` for :meth:`TurnContext.tenure`:
        None when held. Redis unable to hold it, the turn is stored now instead (slower, still
        durable), and nothing is left."""
        turn = self.loop.turn_record(ctx, assistant=assistant, raw=raw, status=status)
        _, held = await asyncio.gather(self._arecord_receipt(ctx), self.loop.parked.ahold(turn))
        if held is None:
            degraded = ctx.degraded
            recorded = await run_in_threadpool(self.loop.store_and_enqueue, turn, degraded, park_on_outage=True)
            return (lambda: recorded), recorded
        return functools.partial(self.loop.settle, turn, held, ctx.degraded), None

    async def _arecord_receipt(self, ctx: TurnContext) -> None:
        """:meth:`_record_receipt` from the event loop (the outbox append awaited there)."""
        if ctx.recall is None:
            return
        event = self.recall.receipt_of(ctx.actor, ctx.recall, session_id=ctx.session_id, details=self._details(ctx))
        try:
            await self.recall.receipts.arecord(event)
        except Exception as exc:
            self._receipt_lost(ctx, exc)

    @staticmethod
    def _details(ctx: TurnContext) -> dict[str, Any]:
        details = {"via": "proxy", "turn_id": ctx.turn_id, "model": ctx.model}
        if ctx.api != "openai":
            details["api"] = ctx.api
        return details

    @staticmethod
    def _receipt_lost(ctx: TurnContext, exc: Exception) -> None:
        log.warning("injection receipt for %s not recorded: %s", ctx.turn_id, exc)
        ctx.degraded.append("injection receipt not recorded: audit store unavailable")

    def _record_receipt(self, ctx: TurnContext) -> None:
        if ctx.recall is not None:
            try:
                self.recall.record_receipt(ctx.actor, ctx.recall, session_id=ctx.session_id, details=self._details(ctx))
            except Exception as exc:
                self._receipt_lost(ctx, exc)


class ChatProxy(ProxyTurns):
    """``POST /v1/chat/completions``: the OpenAI Chat Completions ingress."""

    async def prepare(
        self, actor: Actor, body: ChatRequest, header_session: str | None, header_scope: str | None
    ) -> tuple[TurnContext, dict[str, Any]]:
        # bad input is refused first (as /v1/messages does), then a missing provider before any recall
        session_scope = session_and_scope(body, actor, header_session, header_scope)
        self.loop.upstream.target(actor.principal.tenant_id)  # no provider configured: 503
        users = [m for m in body.messages if m.role == "user"]
        ctx, block = await self.begin(actor, body.model, session_scope, text_of(users[-1].content) if users else "")
        client_system = "\n\n".join(
            text_of(m.content) for m in body.messages if m.role in ("system", "developer") and m.content
        )
        system = build_system_prompt(block, client_system or None, with_sidecar=ctx.gate.extract)
        forwarded = body.model_dump(mode="json", exclude={"metadata"}, exclude_none=True)
        forwarded["messages"] = [{"role": "system", "content": system}] + [
            m.model_dump(mode="json", exclude_none=True) for m in body.messages if m.role not in ("system", "developer")
        ]
        return ctx, forwarded

    async def complete(self, ctx: TurnContext, forwarded: dict[str, Any]) -> tuple[dict[str, Any], Callable[[], bool]]:
        """The answer with the sidecar removed, and the work to run once it is sent (receipt,
        turn record, extraction enqueue: off the latency path, still in that order)."""
        data = await self.loop.upstream.complete(ctx.actor.principal.tenant_id, forwarded)
        status, raw, visible = ParseStatus.MISSING, None, ""
        for index, choice in enumerate(data.get("choices") or []):
            message = choice.get("message") if isinstance(choice, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                split = split_sidecar(content, ctx.injected_texts())
                shown: str | list[Any] = split.visible
            elif isinstance(content, list):  # a list of parts, as some providers answer
                shown, split = split_blocks(content, ctx.injected_texts())
            else:
                continue
            if shown != content:
                message["content"] = shown  # type: ignore[index]
                if "logprobs" in choice:  # the sidecar's tokens are not shown either
                    choice["logprobs"] = visible_logprobs(choice["logprobs"], split.visible)
            if index == 0:
                status, raw, visible = split.status, split.raw, split.visible
        after, recorded = await self.secure(ctx, assistant=visible, raw=raw, status=status)
        data["tenure"] = ctx.tenure(status.value, recorded)
        return data, after

    async def stream(self, ctx: TurnContext, forwarded: dict[str, Any]) -> AsyncIterator[bytes]:
        """Open the upstream stream (errors raise before anything is sent), then relay it."""
        target = self.loop.upstream.target(ctx.actor.principal.tenant_id)
        response = await self.loop.upstream.open_stream_at(target, "/chat/completions", {**forwarded, "stream": True})
        return self._relay(ctx, target, response)

    async def _relay(self, ctx: TurnContext, target: Target, response: Any) -> AsyncIterator[bytes]:
        policy = self.loop.settings.loop
        relay = _ChoiceRelay(AnswerBudget.of(policy))
        template: dict[str, Any] = {
            "id": "chatcmpl-tenure",
            "object": "chat.completion.chunk",
            "model": ctx.model,
        }
        try:
            async for event in Upstream.events(response, policy.upstream_max_event_bytes):
                if "error" in event and not event.get("choices"):  # the upstream's own error ends the stream
                    yield _sse(redacted_event(event, target))
                    yield b"data: [DONE]\n\n"
                    return
                template = {k: event[k] for k in ("id", "object", "created", "model") if k in event} or template
                out = relay.feed(event)
                relay.budget.check()  # a stream that holds back without end is refused
                if out is not None:
                    yield _sse(out)
            if not relay.finished:
                raise ended_early()
        except Exception as exc:  # upstream broke off mid-stream
            log.warning("upstream stream failed: %s", exc)
            error = stream_failure(exc)
            yield _sse({"error": openai_error_body(error.code.value, error.message, "upstream_error")})
            yield b"data: [DONE]\n\n"
            return
        finally:
            await response.aclose()
        for choice in relay.tails():
            yield _sse({**template, "choices": [choice]})
        for event in relay.held:
            yield _sse(event)
        split = split_sidecar(relay.first_text(), ctx.injected_texts())
        recorded = await run_in_threadpool(
            self.finish, ctx, assistant=split.visible, raw=split.raw, status=split.status
        )
        yield _sse({**template, "choices": [], "tenure": ctx.tenure(split.status.value, recorded)})
        yield b"data: [DONE]\n\n"


@dataclass
class _ChoiceRelay:
    """One OpenAI stream, chunk by chunk, with a :class:`_Choice` per choice (``n`` > 1
    interleaves the choices' chunks: one stripper over all of them saw markers cut apart by
    another choice's text and let them through). A choice's ``finish_reason`` is held, with
    trailers (usage), until the held-back tails are out. ``budget`` counts what it holds."""

    budget: AnswerBudget
    choices: dict[int, _Choice] = field(default_factory=dict)
    held: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False  # a choice's finish_reason came: the stream did not just stop

    def first_text(self) -> str:
        """The first choice's whole text, for the turn record."""
        return self.choices[min(self.choices)].stripper.full_text if self.choices else ""

    def tails(self) -> list[dict[str, Any]]:
        """The held-back text that turned out not to be a marker, one choice each."""
        out = []
        for index in sorted(self.choices):
            state = self.choices[index]
            if tail := state.stripper.finish():
                out.append(state.shown({"index": index, "delta": {"content": tail}, "finish_reason": None}, tail))
        return out

    def feed(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """The event to forward now, if any."""
        choices = event.get("choices") or []
        if not isinstance(choices, list) or not choices:  # usage or other trailers: after the text
            self._hold(event)
            return None
        now: list[dict[str, Any]] = []
        finished: list[dict[str, Any]] = []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            state = self.choices.setdefault(index if isinstance(index, int) else 0, _Choice())
            raw_delta = choice.get("delta")
            delta: dict[str, Any] = raw_delta if isinstance(raw_delta, dict) else {}
            piece = delta.get("content")
            if isinstance(piece, str):
                state.take(choice.get("logprobs"))
                self.budget.keep(piece)
                visible = state.stripper.feed(piece)
                self.budget.show(visible)
                # role, tool calls, refusal: never the sidecar (only text is), so they go out even
                # after its marker, as Anthropic's tool_use blocks and a whole answer's tool_calls do
                rest = {k: v for k, v in delta.items() if k != "content" and v is not None}
                if choice.get("finish_reason") is not None:
                    if visible:
                        now.append(
                            state.shown({**choice, "delta": {"content": visible}, "finish_reason": None}, visible)
                        )
                    # its tokens' entries went with the text (or, the sidecar's, nowhere)
                    finished.append({**choice, "delta": rest} | ({"logprobs": None} if "logprobs" in choice else {}))
                elif visible or rest:
                    # the opening chunk ({"role": "assistant", "content": ""}) goes out as it came
                    now.append(state.shown({**choice, "delta": {**rest, "content": visible}}, visible))
            elif choice.get("finish_reason") is not None:
                finished.append(choice)  # the finish comes after the held-back tail
            elif not state.stripper.marker_seen or any(v is not None for v in delta.values()):
                now.append(choice)  # role-only or tool-call deltas
        if finished:
            self.finished = True
            self._hold({**event, "choices": finished})
        return {**event, "choices": now} if now else None

    def _hold(self, event: dict[str, Any]) -> None:
        self.budget.hold(event)
        self.held.append(event)


@dataclass
class _Choice:
    """One streamed choice: its stripper, and the log probabilities of its tokens (``logprobs:
    true``), which go out only for tokens wholly inside the text shown so far: the sidecar's
    tokens (and the whitespace before it) never do."""

    stripper: StreamStripper = field(default_factory=StreamStripper)
    pending: list[Any] = field(default_factory=list)  # token entries not sent yet
    budget: int = 0  # characters shown whose tokens' entries were not sent yet

    def take(self, logprobs: Any) -> None:
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        if isinstance(entries, list):
            self.pending.extend(entries)

    def shown(self, choice: dict[str, Any], visible: str) -> dict[str, Any]:
        """``choice`` (going out with ``visible``) carrying the entries of the tokens now shown."""
        sent, self.pending, self.budget = _tokens_within(self.pending, self.budget + len(visible))
        logprobs = choice.get("logprobs")
        if sent or isinstance(logprobs, dict):
            choice["logprobs"] = {**(logprobs if isinstance(logprobs, dict) else {}), "content": sent}
        return choice


def _tokens_within(entries: list[Any], chars: int) -> tuple[list[Any], list[Any], int]:
    """The leading token entries whose text fits in ``chars`` characters, the others, and the
    characters left over."""
    at = 0
    for entry in entries:
        token = entry.get("token") if isinstance(entry, dict) else None
        size = len(token) if isinstance(token, str) else 0
        if size > chars:
            break
        chars -= size
        at += 1
    return entries[:at], entries[at:], chars


def visible_logprobs(logprobs: Any, visible: str) -> Any:
    """A whole answer's ``logprobs`` without the entries of tokens past its visible text."""
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list):
        return logprobs
    return {**logprobs, "content": _tokens_within(entries, len(visible))[0]}


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def openai_error_body(code: str, message: str, type_: str, param: str | None = None) -> dict[str, Any]:
    return {"message": message, "type": type_, "code": code, "param": param}
