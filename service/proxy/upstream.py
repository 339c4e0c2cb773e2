"""The upstream models: one pooled async client per process, for the OpenAI-compatible
upstream (``/chat/completions``, bearer key) and the Anthropic-compatible one (``/messages``,
``x-api-key`` and ``anthropic-version``).

The client is httpx2's, not httpx's: httpx's pool (httpcore 1.0) scans every connection it holds
several times per request and miscounts idle ones (encode/httpcore#1035); httpx2's assigns
requests in one pass (pydantic/httpx2#974 and #1075). With 100 chats in flight the API spent
13.3-15.6 ms of CPU per chat with httpx and 4.9-5.2 ms with httpx2, on the event loop that also
serves recalls (``benchmarks/proxy_bench.py --in-flight``, docs/benchmarks.md). Its pool keeps the
same bounds: at most 200 connections in all, 50 kept idle, idle ones closed after the keep-alive
expiry. It asks for answers uncompressed, and decodes one compressed anyway in bounded pieces
(:mod:`service.content_coding`), so the bounds on what it holds count decoded bytes as they grow.

The target (base URL and key) is per tenant or global (settings). Failures become
:class:`UpstreamFailure` with a stable code and the status the proxy answers with; nothing here
knows about the client's response format.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import httpx2

from service.config import MemoryLoopSettings
from service.content_coding import (
    IDENTITY,
    AnswerTooLarge,
    AnswerTooSlow,
    BoundedBody,
    BoundedDecoder,
    ContentCodingError,
    check_deadline,
    decoder_for,
)
from service.errors import ErrorCode, TenureError, ValidationFailed
from service.telemetry.tracing import client_span, record_status

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024  # httpx2's own bound; the proxy passes upstream_max_event_bytes
_SSE_SIZE_ERROR = "byte limit"  # in httpx2's SSEError for an event past its bound


class UpstreamFailure(TenureError):
    code = ErrorCode.UPSTREAM_ERROR

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: ErrorCode = ErrorCode.UPSTREAM_ERROR,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message, code=code)
        self.status = status
        self.headers = headers or {}  # passed on to the caller: the upstream's retry advice


@dataclass(frozen=True)
class Target:
    base_url: str
    headers: dict[str, str]  # the upstream's credentials and API version
    secret: str | None = None  # the upstream key in ``headers``, never shown to a caller


def _message_of(response: httpx2.Response, body: bytes, secret: str | None) -> str:
    """The upstream's error message (from ``body``, the start of its answer), without the tenant's
    upstream key (a provider or gateway that echoes the key it was given would otherwise hand it
    to every member who gets the error)."""
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return _redacted(str(err["message"]), secret)[:500]
    except ValueError:
        pass
    return _redacted(body.decode("utf-8", "replace"), secret)[:300] or response.reason_phrase


def _redacted(text: str, secret: str | None) -> str:
    return text.replace(secret, "[upstream key]") if secret else text


def redacted_event(event: dict[str, Any], target: Target) -> dict[str, Any]:
    """An upstream's own in-stream error event, passed on to the caller, without the tenant's
    upstream key (as :func:`_message_of` for an error status). Only error events pay for the copy."""
    if not target.secret:
        return event
    text = json.dumps(event)
    cleaned = _redacted(text, json.dumps(target.secret)[1:-1])  # the key as it stands in JSON
    return event if cleaned == text else cast(dict[str, Any], json.loads(cleaned))


def failure_for(response: httpx2.Response, body: bytes, target: Target) -> UpstreamFailure:
    """Map an upstream error status (``body``: the start of its answer): the caller's own mistakes
    (400/404/413/422) and rate limits keep their status; credentials and server failures are the
    gateway's problem (502)."""
    status = response.status_code
    message = f"upstream answered {status}: {_message_of(response, body, target.secret)}"
    # a rate limit's or an overload's wait, so the caller's SDK retries when the provider said
    advice = {name: value for name in RETRY_HEADERS if _is_delay(value := response.headers.get(name, ""))}
    if status in (400, 404, 413, 422, 429):
        return UpstreamFailure(message, status=status, headers=advice)
    return UpstreamFailure(message, status=502, headers=advice)


RETRY_HEADERS = ("retry-after", "retry-after-ms")  # the second: OpenAI's SDK reads it first


def _is_delay(value: str) -> bool:
    """A short printable value (seconds, milliseconds or an HTTP date), safe to send on."""
    return 0 < len(value) <= 64 and value.isascii() and value.isprintable()


def stream_failure(exc: Exception) -> UpstreamFailure:
    """What a relay reports in-stream when the upstream's answer stopped before its end: the
    transport or parser error, or a stream that simply ended too soon (:func:`ended_early`)."""
    if isinstance(exc, UpstreamFailure):
        return exc
    return UpstreamFailure(f"the upstream stream broke off: {type(exc).__name__}", status=502)


def ended_early() -> UpstreamFailure:
    """A stream that closed without its end (no ``finish_reason``, no ``message_stop``): the
    answer is cut short, which the client must be told rather than shown as complete."""
    return UpstreamFailure("the upstream stream ended before the answer was complete", status=502)


def too_large(what: str, setting: str, limit: int) -> UpstreamFailure:
    """An upstream answer past what the proxy holds of one (a misbehaving upstream): a broken
    answer, as any other (502), with a code of its own naming the bound."""
    return UpstreamFailure(
        f"the upstream's {what} exceeds {limit} (TENURE_LOOP_{setting.upper()}); it was not read further",
        status=502,
        code=ErrorCode.UPSTREAM_ANSWER_TOO_LARGE,
    )


@dataclass(frozen=True)
class Deadline:
    """When a whole answer must have arrived, from before its request was sent (``at``, a
    ``time.monotonic()`` value, which the shared reader checks as the answer's pieces arrive), and
    what says how long (a setting's name), for the failure's message."""

    at: float
    seconds: float
    setting: str

    @classmethod
    def after(cls, seconds: float, setting: str) -> Deadline:
        return cls(time.monotonic() + seconds, seconds, setting)

    def check(self) -> None:
        """:meth:`missed` once the deadline has passed."""
        try:
            check_deadline(self.at)
        except AnswerTooSlow as exc:
            raise self.missed() from exc

    def missed(self) -> UpstreamFailure:
        """The answer was still arriving at the deadline (an upstream trickling it, which no
        per-read timeout stops): a time-out, as a read timing out is."""
        return UpstreamFailure(
            f"the upstream's answer took longer than {self.seconds:g} s ({self.setting}); it was not read further",
            status=504,
            code=ErrorCode.UPSTREAM_TIMEOUT,
        )


@dataclass
class AnswerBudget:
    """What a stream relay holds of one answer: its text (``kept``, for the turn record and the
    sidecar), and what of it is not shown yet (``kept - shown``: a possible marker's prefix with
    the whitespace before it, the sidecar) plus the events held for the end (finish, usage). Past
    ``upstream_max_body_bytes`` characters kept, or ``upstream_max_held_chars`` held back, the
    stream is refused (:func:`too_large`) rather than held without end."""

    max_kept: int
    max_held: int
    kept: int = 0
    shown: int = 0
    held_events: int = 0  # the serialized size of the events held for the end

    @classmethod
    def of(cls, policy: MemoryLoopSettings) -> AnswerBudget:
        return cls(max_kept=policy.upstream_max_body_bytes, max_held=policy.upstream_max_held_chars)

    def keep(self, text: str) -> None:
        self.kept += len(text)
        if self.kept > self.max_kept:
            raise too_large("streamed answer text", "upstream_max_body_bytes", self.max_kept)

    def show(self, text: str) -> None:
        self.shown += len(text)

    def hold(self, event: dict[str, Any]) -> None:
        self.held_events += len(json.dumps(event))  # rare (trailers): the copy is cheap

    def check(self) -> None:
        """After an event: refuse the stream if it holds back too much."""
        if self.kept - self.shown + self.held_events > self.max_held:
            raise too_large("text held back from the client", "upstream_max_held_chars", self.max_held)


ERROR_BODY_BYTES = 65_536  # of an error answer, only this much is read (its message is cut to 500)


def not_configured(setting: str, tenant_field: str, kind: str) -> UpstreamFailure:
    """A deployment that has not chosen its model provider yet: the service is not ready to chat
    (503), which is neither the caller's mistake nor a broken provider (502)."""
    return UpstreamFailure(
        f"no upstream configured: set {setting} (or the tenant's {tenant_field} in TENURE_LOOP_TENANTS) "
        f"to {kind} model provider",
        status=503,
        code=ErrorCode.UPSTREAM_NOT_CONFIGURED,
    )


class Upstream:
    def __init__(self, policy: MemoryLoopSettings):
        self.policy = policy
        timeout = httpx2.Timeout(policy.upstream_timeout_s, connect=policy.upstream_connect_timeout_s)
        # Accept-Encoding: identity, never the caller's (only the target's headers are sent):
        # httpx2 would ask for gzip and deflate and decode them itself, a bound on the answer
        # then depending on how much it decodes at once; a compressed answer is decoded here
        self.client = httpx2.AsyncClient(
            timeout=timeout,
            limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50),
            headers=IDENTITY,
        )

    def target(self, tenant_id: str) -> Target:
        """The OpenAI-compatible upstream of the tenant."""
        override = self.policy.for_tenant(tenant_id)
        base = override.upstream_base_url or self.policy.upstream_base_url
        key = override.upstream_api_key or self.policy.upstream_api_key
        if not base:
            raise not_configured("TENURE_LOOP_UPSTREAM_BASE_URL", "upstream_base_url", "an OpenAI-compatible")
        secret = key.get_secret_value() if key else None
        return Target(base.rstrip("/"), {"Authorization": f"Bearer {secret}"} if secret else {}, secret)

    def anthropic_target(self, tenant_id: str, version: str | None, beta: str | None) -> Target:
        """The Anthropic-compatible upstream of the tenant, with the caller's API version and beta
        flags (never the caller's credential: that authenticated them here)."""
        override = self.policy.for_tenant(tenant_id)
        base = override.anthropic_upstream_base_url or self.policy.anthropic_upstream_base_url
        key = override.anthropic_upstream_api_key or self.policy.anthropic_upstream_api_key
        if not base:
            raise not_configured(
                "TENURE_LOOP_ANTHROPIC_UPSTREAM_BASE_URL", "anthropic_upstream_base_url", "an Anthropic-compatible"
            )
        secret = key.get_secret_value() if key else None
        headers = {"anthropic-version": version or self.policy.anthropic_version}
        if secret:
            headers["x-api-key"] = secret
        if beta:
            headers["anthropic-beta"] = beta
        return Target(base.rstrip("/"), headers, secret)

    async def complete(self, tenant_id: str, body: dict[str, Any]) -> dict[str, Any]:
        data = await self.post_json(self.target(tenant_id), "/chat/completions", body)
        if not isinstance(data.get("choices"), list):
            raise UpstreamFailure("the upstream answer has no choices", status=502)
        return data

    async def post_json(self, target: Target, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``target`` + ``path`` and return the JSON object it answers (read up to
        ``upstream_max_body_bytes``: past that, :func:`too_large`, the connection closed), all of
        it within ``upstream_answer_timeout_s`` of sending (past that, :meth:`Deadline.missed`, the
        connection closed; an error answer still arriving then is judged by its status)."""
        deadline = self._answer_deadline()
        # The shared reader checks the deadline as pieces arrive; this bound also ends a wait for
        # the status line or the next piece (an upstream silent past the deadline), which only the
        # per-read timeout (minutes) would end otherwise.
        bound = asyncio.timeout(deadline.seconds)
        try:
            async with bound:
                response = await self._send("POST", target, path, body, stream=True)
                data = await self._json_of(response, deadline) if response.status_code < 400 else None
        except TimeoutError as exc:
            if bound.expired():
                raise deadline.missed() from exc
            raise
        if response.status_code >= 400:
            raise failure_for(response, await _head(response, deadline), target)
        if not isinstance(data, dict):
            raise UpstreamFailure("the upstream answer is not a JSON object", status=502)
        return data

    async def open_stream_at(self, target: Target, path: str, body: dict[str, Any]) -> httpx2.Response:
        """Send a streaming request and return the open response once its status is known (so
        an error can still be answered as a plain JSON error, read as a whole answer is, within
        ``upstream_answer_timeout_s``). Its stream ends within ``upstream_stream_timeout_s`` of
        sending (past that, reading it raises :meth:`Deadline.missed`). The caller must close it."""
        deadline = self._answer_deadline()
        whole = Deadline.after(self.policy.upstream_stream_timeout_s, "TENURE_LOOP_UPSTREAM_STREAM_TIMEOUT_S")
        response = await self._send("POST", target, path, body, stream=True, deadline=whole)
        if response.status_code >= 400:
            raise failure_for(response, await _head(response, deadline), target)
        return response

    async def get_json(self, target: Target, path: str, *, timeout_s: float) -> Any:
        """GET ``target`` + ``path`` (the model list), traced like the chats: the JSON it answers
        with 200, None with another status (read as :meth:`post_json` reads, all of it within
        ``timeout_s``; transport failures, an answer too large or too slow become
        :class:`UpstreamFailure`)."""
        deadline = Deadline.after(timeout_s, "the model list's own bound")
        response = await self._send("GET", target, path, None, stream=True, timeout_s=timeout_s)
        if response.status_code != 200:
            await response.aclose()
            return None
        return await self._json_of(response, deadline)

    def _answer_deadline(self) -> Deadline:
        return Deadline.after(self.policy.upstream_answer_timeout_s, "TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S")

    async def _json_of(self, response: httpx2.Response, deadline: Deadline | None = None) -> Any:
        """The JSON of a whole answer, read up to ``upstream_max_body_bytes`` and by ``deadline``
        (then closed)."""
        limit = self.policy.upstream_max_body_bytes
        body = await _read(response, limit, deadline)
        if body is None:
            raise too_large("answer", "upstream_max_body_bytes", limit)
        try:
            return json.loads(body)
        except ValueError as exc:  # UnicodeDecodeError too
            raise UpstreamFailure("the upstream answered with invalid JSON", status=502) from exc

    async def _send(
        self,
        method: str,
        target: Target,
        path: str,
        body: dict[str, Any] | None,
        *,
        stream: bool,
        timeout_s: float | None = None,
        deadline: Deadline | None = None,
    ) -> httpx2.Response:
        """Send ``body`` (if any); the answer once its status is known (transport failures become
        :class:`UpstreamFailure`). With tracing on, a client span covers it and the upstream gets
        the trace context (OpenTelemetry instruments httpx, not httpx2). ``timeout_s``: instead of
        the client's own timeouts; ``deadline``: the answer's body ends there (:func:`_decoded`)."""
        url = f"{target.base_url}{path}"
        headers = dict(target.headers)
        with client_span(method, url, headers) as span:
            options: dict[str, Any] = {"json": body} if body is not None else {}
            if timeout_s is not None:
                options["timeout"] = timeout_s
            try:
                # inside the try: building the request encodes the body as UTF-8 JSON
                request = self.client.build_request(method, url, headers=headers, **options)
                response = await self.client.send(request, stream=stream)
            except UnicodeEncodeError as exc:
                # the routes refuse unpaired surrogates first; one that still got here is the
                # client's text, never a crash
                raise ValidationFailed("the request holds text that cannot be encoded as UTF-8") from exc
            except httpx2.TimeoutException as exc:
                raise UpstreamFailure(
                    "the upstream model timed out", status=504, code=ErrorCode.UPSTREAM_TIMEOUT
                ) from exc
            except httpx2.HTTPError as exc:
                raise UpstreamFailure(f"the upstream model is unreachable: {type(exc).__name__}", status=502) from exc
            record_status(span, response.status_code)
        return await _decoded(response, deadline)

    @staticmethod
    async def events(
        response: httpx2.Response, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    ) -> AsyncIterator[dict[str, Any]]:
        """The JSON ``data`` of each server-sent event, until ``[DONE]`` (OpenAI) or the stream's
        end; events whose data is not a JSON object (keep-alives, comments) are skipped. An
        Anthropic event's name is also its data's ``type``, so the ``event:`` field is not needed.
        httpx2's parser reads the stream (fields, multi-line data, CR/LF variants); an event
        longer than ``max_event_bytes`` (``upstream_max_event_bytes``; a line that never ends
        counts as it grows) is :func:`too_large`; a 200 answer that is not ``text/event-stream``
        raises its ``SSEError``; the relay reports either as a broken upstream stream."""
        try:
            async for sse in httpx2.EventSource(response, max_event_size=max_event_bytes):
                data = sse.data.strip()
                if data == "[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield event
        except httpx2.SSEError as exc:
            if _SSE_SIZE_ERROR in str(exc):  # its parser's one other refusal: not an event stream
                raise too_large("server-sent event", "upstream_max_event_bytes", max_event_bytes) from exc
            raise

    async def aclose(self) -> None:
        await self.client.aclose()


async def _decoded(response: httpx2.Response, deadline: Deadline | None = None) -> httpx2.Response:
    """``response`` as it is, or, compressed (though not asked to be) or to be read by
    ``deadline``, the same answer with a body decoded in bounded pieces and ending at the deadline
    (:class:`_BoundedStream`); httpx2 never sees its coding. A coding that is not gzip or deflate
    is refused (502), the connection closed."""
    try:
        decoder = decoder_for(response.headers.get("content-encoding", ""))
    except ContentCodingError as exc:
        await response.aclose()
        raise UpstreamFailure(f"the upstream answer cannot be read: {exc}", status=502) from exc
    if decoder is None and deadline is None:
        return response
    headers = response.headers.multi_items()
    if decoder is not None:  # its length (if given) is the compressed one: not what the bounds compare with
        headers = [(k, v) for k, v in headers if k not in ("content-encoding", "content-length")]
    return httpx2.Response(
        response.status_code,
        headers=headers,
        stream=_BoundedStream(response, decoder, deadline),
        request=response.request,
        extensions=response.extensions,
    )


class _BoundedStream(httpx2.AsyncByteStream):
    """An answer's body read raw: a compressed one decoded at most ``PIECE_BYTES`` at a time, so
    a reader stops (and closes it) once the decoded size passes its bound, however little arrived;
    with a ``deadline``, :meth:`Deadline.missed` for the first piece arriving past it (keep-alives
    included: a stream of nothing but them is still bounded)."""

    def __init__(self, response: httpx2.Response, decoder: BoundedDecoder | None, deadline: Deadline | None):
        self._response = response
        self._decoder = decoder
        self._deadline = deadline

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for raw in self._response.aiter_raw():
            if self._deadline is not None:
                self._deadline.check()
            if self._decoder is None:
                yield raw
                continue
            try:
                for piece in self._decoder.decode(raw):
                    yield piece
            except ContentCodingError as exc:  # broken as a transport failure is
                raise httpx2.DecodingError(str(exc), request=self._response.request) from exc

    async def aclose(self) -> None:
        await self._response.aclose()


async def _read(response: httpx2.Response, limit: int, deadline: Deadline | None = None) -> bytes | None:
    """``response``'s (decoded) body, or None once it passes ``limit`` bytes (nothing more is
    read); still arriving at ``deadline``: :meth:`Deadline.missed`. Closes ``response`` either way;
    transport failures become :class:`UpstreamFailure`."""
    try:
        # decoded already (:func:`_decoded`): counted here, a length past the bound refused unread
        body = BoundedBody(response.headers, limit, deadline=deadline.at if deadline else None)
        async for chunk in response.aiter_bytes():
            body.add(chunk)
    except AnswerTooLarge:
        return None
    except AnswerTooSlow as exc:
        assert deadline is not None
        raise deadline.missed() from exc
    except httpx2.TimeoutException as exc:
        raise UpstreamFailure("the upstream model timed out", status=504, code=ErrorCode.UPSTREAM_TIMEOUT) from exc
    except httpx2.HTTPError as exc:
        raise UpstreamFailure(f"the upstream answer broke off: {type(exc).__name__}", status=502) from exc
    finally:
        await response.aclose()  # not read to its end: the connection is closed, not pooled
    return body.content()


async def _head(response: httpx2.Response, deadline: Deadline) -> bytes:
    """The start of an error answer (its first ``ERROR_BODY_BYTES``, what arrived by ``deadline``),
    for its message."""
    # no headers: decoded already (:func:`_decoded`), and a long one's start is still wanted
    body = BoundedBody({}, ERROR_BODY_BYTES, deadline=deadline.at)
    try:
        async for chunk in response.aiter_bytes():
            body.add(chunk)
    except (AnswerTooLarge, AnswerTooSlow, httpx2.HTTPError):
        pass  # the status says enough
    finally:
        await response.aclose()
    return body.content()
