"""``POST /v1/messages``: the Anthropic Messages ingress of the memory loop.

The same turn as the OpenAI route (:class:`service.proxy.service.ProxyTurns`: session and scope,
model gate, recall, receipt, turn record, extraction), in Anthropic's shapes: the injection goes
into the top-level ``system`` (one text block per part of the prompt, the caller's own system
text in the dynamic part), the sidecar is removed from the answer's text blocks, and a stream is
relayed event by event (``message_start`` ... ``message_stop``) with the text deltas passed
through :class:`StreamStripper`. Tool use passes through untouched: ``tools``/``tool_choice`` go
upstream as sent, ``tool_use`` blocks and ``input_json_delta`` events come back as sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service.auth.actor import Actor
from service.extraction.sidecar import StreamStripper, answer_text, split_blocks, split_sidecar
from service.proxy.prompt import system_prompt_parts
from service.proxy.service import ProxyTurns, TurnContext, session_and_scope_of, text_of
from service.proxy.upstream import (
    AnswerBudget,
    Target,
    Upstream,
    UpstreamFailure,
    ended_early,
    redacted_event,
    stream_failure,
)

log = logging.getLogger("tenure.proxy")
API = "anthropic"
# metadata keys the proxy reads itself; Anthropic's own metadata (user_id) is forwarded
OWN_METADATA = frozenset({"session_id", "scope"})


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(BaseModel):
    """The Anthropic Messages request; unknown fields (tools, tool_choice, temperature, thinking...)
    are passed through to the upstream."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(..., min_length=1, max_length=200)
    messages: list[AnthropicMessage] = Field(..., min_length=1, max_length=1000)
    max_tokens: int = Field(..., ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None


def latest_user_text(messages: list[AnthropicMessage]) -> str:
    """The text of the latest user message that has any (a message carrying only tool results
    continues the question asked before it)."""
    for message in reversed(messages):
        if message.role == "user":
            text = text_of(message.content)
            if text.strip():
                return text
    return ""


def anthropic_error_event(code: str, message: str, type_: str = "api_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message, "code": code}}


class MessagesProxy(ProxyTurns):
    async def prepare(
        self,
        actor: Actor,
        body: MessagesRequest,
        header_session: str | None,
        header_scope: str | None,
        version: str | None,
        beta: str | None,
    ) -> tuple[TurnContext, Target, dict[str, Any]]:
        meta = body.metadata or {}
        first = [m.model_dump(mode="json") for m in body.messages[:3]]
        session_scope = session_and_scope_of(meta, first, actor, header_session, header_scope)
        # the target first: an unconfigured upstream is refused before any recall work
        target = self.loop.upstream.anthropic_target(actor.principal.tenant_id, version, beta)
        ctx, block = await self.begin(actor, body.model, session_scope, latest_user_text(body.messages), API)
        client_system = text_of(body.system) if body.system is not None else ""
        parts = system_prompt_parts(block, client_system or None, with_sidecar=ctx.gate.extract)
        forwarded = body.model_dump(mode="json", exclude={"metadata", "system"}, exclude_none=True)
        forwarded["system"] = [{"type": "text", "text": part} for part in parts]
        theirs = {k: v for k, v in meta.items() if k not in OWN_METADATA}
        if theirs:
            forwarded["metadata"] = theirs
        return ctx, target, forwarded

    async def complete(
        self, ctx: TurnContext, target: Target, forwarded: dict[str, Any]
    ) -> tuple[dict[str, Any], Callable[[], bool]]:
        """The message with the sidecar removed, and the work to run once it is sent."""
        data = await self.loop.upstream.post_json(target, "/messages", forwarded)
        content = data.get("content")
        if not isinstance(content, list):
            raise UpstreamFailure("the upstream answer has no content", status=502)
        data["content"], split = split_blocks(content, ctx.injected_texts())
        after, recorded = await self.secure(ctx, assistant=split.visible, raw=split.raw, status=split.status)
        data["tenure"] = ctx.tenure(split.status.value, recorded)
        return data, after

    async def stream(self, ctx: TurnContext, target: Target, forwarded: dict[str, Any]) -> AsyncIterator[bytes]:
        """Open the upstream stream (errors raise before anything is sent), then relay it."""
        response = await self.loop.upstream.open_stream_at(target, "/messages", {**forwarded, "stream": True})
        return self._relay(ctx, target, response)

    async def _relay(self, ctx: TurnContext, target: Target, response: Any) -> AsyncIterator[bytes]:
        policy = self.loop.settings.loop
        relay = _Relay(AnswerBudget.of(policy))
        try:
            async for event in Upstream.events(response, policy.upstream_max_event_bytes):
                if event.get("type") == "error":  # the upstream's own error event ends the stream
                    yield _sse(redacted_event(event, target))
                    return
                outs = relay.feed(event)
                relay.budget.check()  # a stream that holds back without end is refused
                for out in outs:
                    yield _sse(out)
            if not relay.held:  # neither message_delta nor message_stop: cut short
                raise ended_early()
        except Exception as exc:  # upstream broke off mid-stream
            log.warning("upstream stream failed: %s", exc)
            error = stream_failure(exc)
            yield _sse(anthropic_error_event(error.code.value, error.message))
            return
        finally:
            await response.aclose()
        split = split_sidecar(answer_text(relay.texts()), ctx.injected_texts())
        recorded = await run_in_threadpool(
            self.finish, ctx, assistant=split.visible, raw=split.raw, status=split.status
        )
        for out in relay.trailer(ctx.tenure(split.status.value, recorded)):
            yield _sse(out)


@dataclass
class _Relay:
    """One Anthropic stream, event by event. Text blocks go through a :class:`StreamStripper`
    each (a held-back tail is released before the block's ``content_block_stop``); once a block
    showed the sidecar marker, later text blocks are not forwarded at all, and the blocks that
    are forwarded are renumbered so the client sees consecutive indices. ``message_delta`` and
    ``message_stop`` are held until the turn is recorded; the ``tenure`` object rides on the
    ``message_delta``. ``budget`` counts what it holds."""

    budget: AnswerBudget
    index: dict[int, int] = field(default_factory=dict)  # upstream block index -> forwarded index
    strippers: dict[int, StreamStripper] = field(default_factory=dict)  # forwarded text blocks
    parts: dict[int, list[str]] = field(default_factory=dict)  # every text block's text, upstream index
    closed: bool = False  # the marker was seen: the rest of the text is sidecar
    held: list[dict[str, Any]] = field(default_factory=list)

    def texts(self) -> list[str]:
        return ["".join(self.parts[i]) for i in sorted(self.parts)]

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind in ("message_delta", "message_stop"):
            self.budget.hold(event)
            self.held.append(event)
            return []
        at = event.get("index")
        if not isinstance(at, int):
            return [event]  # message_start, ping
        if kind == "content_block_start":
            return self._start(at, event)
        if at not in self.index:
            if kind == "content_block_delta":
                self._record(at, event.get("delta"))
            return []  # a suppressed block
        out = {**event, "index": self.index[at]}
        if kind == "content_block_delta":
            return self._delta(at, out)
        if kind == "content_block_stop" and at in self.strippers:
            tail = self.strippers[at].finish()
            return [*self._text(out["index"], tail), out]
        return [out]

    def _start(self, at: int, event: dict[str, Any]) -> list[dict[str, Any]]:
        block = event.get("content_block")
        text_block = block if isinstance(block, dict) and block.get("type") == "text" else None
        if text_block is not None:
            self.parts[at] = []
            if self.closed:
                return []
        self.index[at] = len(self.index)
        out = {**event, "index": self.index[at]}
        if text_block is None:
            return [out]
        self.strippers[at] = StreamStripper()
        initial = text_block.get("text")
        out["content_block"] = {**text_block, "text": ""}  # any initial text goes through the stripper
        return [out, *self._delta(at, self._text_delta(self.index[at], initial))]

    def _delta(self, at: int, out: dict[str, Any]) -> list[dict[str, Any]]:
        delta = out.get("delta")
        if at not in self.strippers or not isinstance(delta, dict) or delta.get("type") != "text_delta":
            return [out]  # tool input, thinking, signatures, citations
        piece = self._record(at, delta)
        stripper = self.strippers[at]
        visible = stripper.feed(piece)
        if stripper.marker_seen:
            self.closed = True
        return self._text(out["index"], visible, like=out)

    def _record(self, at: int, delta: Any) -> str:
        text = delta.get("text") if isinstance(delta, dict) else None
        piece = text if isinstance(text, str) else ""
        if at in self.parts:
            self.budget.keep(piece)
            self.parts[at].append(piece)
        return piece

    @staticmethod
    def _text_delta(index: int, text: Any) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text or ""}}

    def _text(self, index: int, text: str, like: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        if not text:
            return []
        self.budget.show(text)
        out = like if like is not None else self._text_delta(index, text)
        return [{**out, "delta": {**out["delta"], "text": text}}]

    def trailer(self, tenure: dict[str, Any]) -> list[dict[str, Any]]:
        """The held ``message_delta`` (carrying ``tenure``) and ``message_stop``."""
        out: list[dict[str, Any]] = []
        placed = False
        for event in self.held:
            if event.get("type") == "message_delta" and not placed:
                event = {**event, "tenure": tenure}
                placed = True
            out.append(event)
        if not placed:  # a stream without message_delta: the receipt as an event of its own
            out.insert(0, {"type": "tenure", "tenure": tenure})
        return out


def _sse(body: dict[str, Any]) -> bytes:
    kind = str(body.get("type", "message"))
    return f"event: {kind}\ndata: ".encode() + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
