"""uvicorn HTTP protocols that answer an unparseable request in the service's JSON error shape.

A request the HTTP parser itself refuses (a control character in a header value, a space in a
header name, a broken request line) never reaches the ASGI app, so uvicorn answers it with its
own ``text/plain`` 400. These subclasses replace only that answer: same status, same connection
close, but the error body every other failure of that route has (the service's shape; on the
proxy's routes their SDK's, when the request line was read before the fault, which the httptools
parser tells), with code ``bad_request`` and a request id. Served with
``uvicorn --http service.api.http_protocol:JsonErrorHttpProtocol``.

With ``max_requests_per_connection`` set (``TENURE_API_MAX_REQUESTS_PER_CONNECTION``) a connection
closes after that many requests, its last answer saying so, so that the client's next connection
re-draws the worker process that serves it (docs/operations.md, "Requests per connection").

They also keep an idle keep-alive connection open for at least :data:`MIN_KEEP_ALIVE_S`, whatever
``--timeout-keep-alive`` says below that. uvicorn's default, 5 s, equals httpx's idle expiry (the
SDK's, the OpenAI and Anthropic SDKs'): a client that reuses a connection idle for almost 5 s
sends its request just as the server closes it, and the request is lost (``ReadError``, connection
reset) without reaching the app. The server must be the side that waits longer
(docs/operations.md, "Keep-alive").

And they do not wait for a slow client for ever (slowloris): uvicorn has no timer while a request
is being received, so a client that sends its headers or its body a byte at a time, or connects
and sends nothing, would hold its connection (a file descriptor, a request task, a buffered body)
as long as it likes. Here a request's headers must arrive within ``request_head_timeout_s`` of its
first byte and its body within ``request_body_timeout_s`` of its headers, or the client gets a
``408 request_timeout`` and the connection is closed; a new connection that sends nothing is
closed after the keep-alive timeout, like an idle one (docs/operations.md, "Slow clients").

The protocol is uvicorn's httptools one: httptools is a dependency of the service (its OpenSearch
client parses answers with it), so there is no fallback to uvicorn's h11 protocol, which would
serve without those timers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Literal
from urllib.parse import urlsplit

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.errors import error_body
from service.auth import keys
from service.config import get_settings
from service.errors import ErrorCode

logger = logging.getLogger("tenure.api.http")

REQUEST_ID_HEADER = b"x-request-id"

# Longer than every client's idle expiry we know of (httpx 5 s) and than a load balancer's usual
# 60 s idle timeout, so the client or the balancer always drops an idle connection first.
MIN_KEEP_ALIVE_S = 65


def uvicorn_http_option() -> str:
    """What ``uvicorn --http`` takes to serve with :data:`JsonErrorHttpProtocol`."""
    return f"{__name__}:JsonErrorHttpProtocol"


def keep_alive_s(configured: int) -> int:
    """The idle keep-alive timeout a connection gets: uvicorn's setting, never below the floor."""
    return max(configured, MIN_KEEP_ALIVE_S)


def bad_request_body(message: str, path: str = "") -> tuple[str, bytes]:
    """A fresh request id and the JSON error body for an unparseable request to ``path`` (empty
    when the request line itself could not be read)."""
    request_id = f"req-{uuid.uuid4().hex}"
    message = f"malformed HTTP request: {message}"
    body = error_body(ErrorCode.BAD_REQUEST, message, None, request_id, path=path, status=400)
    return request_id, json.dumps(body).encode()


def closing_error_response(status_line: bytes, request_id: str, body: bytes, default_headers: Any) -> bytes:
    """A whole HTTP/1.1 error response that closes its connection: ``default_headers`` (uvicorn's
    ``server``/``date``), then the JSON body's own."""
    head = [status_line]
    for name, value in default_headers:
        head.extend([name, b": ", value, b"\r\n"])
    head.extend(
        [
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            REQUEST_ID_HEADER + b": " + request_id.encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
    )
    return b"".join(head) + body


def _path_of(target: bytes) -> str:
    try:
        return urlsplit(target.decode("latin-1")).path
    except ValueError:
        return ""


class ClockedFlowControl(FlowControl):
    """uvicorn's flow control, also counting how long reading has been paused: while the server
    does not read (the app has not taken what came, or a pipelined request waits), a slow request
    is not the client's doing, and that time is not charged to it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__(transport)
        self._paused_since: float | None = None
        self._paused_before = 0.0

    def pause_reading(self) -> None:
        if not self.read_paused:
            self._paused_since = time.monotonic()
        super().pause_reading()

    def resume_reading(self) -> None:
        if self._paused_since is not None:
            self._paused_before += time.monotonic() - self._paused_since
            self._paused_since = None
        super().resume_reading()

    def paused_s(self) -> float:
        """Seconds reading has been paused since the connection opened, a pause under way included."""
        ongoing = time.monotonic() - self._paused_since if self._paused_since is not None else 0.0
        return self._paused_before + ongoing


Phase = Literal["headers", "body"]


class JsonErrorHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the JSON 400s, the keep-alive floor and the slow-client
    timers (the module docstring); the class every launch path gives ``uvicorn --http``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = keep_alive_s(self.timeout_keep_alive)
        api = get_settings().api
        self._timeouts: dict[Phase, float] = {
            "headers": api.request_head_timeout_s,
            "body": api.request_body_timeout_s,
        }
        # The part of a request being received, since when, and the connection's paused
        # reading by then; None between requests (the keep-alive timer's time).
        self._phase: Phase | None = None
        self._phase_started = 0.0
        self._paused_at_start = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._clock: ClockedFlowControl | None = None
        self._max_requests = api.max_requests_per_connection
        self._requests = 0  # requests begun on this connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._clock = ClockedFlowControl(transport)
        self.flow = self._clock
        # uvicorn arms its idle timer only once a response is out: a connection that never
        # sends a request would stay open for ever. It gets the idle connection's timeout.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_phase()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.get_protocol() is not self:  # upgraded: no longer an HTTP request
            self._end_phase()
        elif self._phase is not None and self._deadline is None and not self.transport.is_closing():
            # Only a request that did not come whole in one read gets a timer: a recall's
            # request (one read) never makes one.
            self._deadline = self.loop.call_later(self._remaining_s(), self._on_deadline)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begin_phase("headers")

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a request to answer (not an upgrade)
            self._count_request()
        self._begin_phase("body")

    def _count_request(self) -> None:
        """The connection's last request once it reaches ``max_requests_per_connection``: its
        answer says ``connection: close`` and the connection closes after it (uvicorn's own
        handling of a request that asked to close)."""
        self._requests += 1
        if self._max_requests and self._requests >= self._max_requests and self.cycle is not None:
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._end_phase()

    def _begin_phase(self, phase: Phase) -> None:
        self._end_phase()
        self._phase = phase
        self._phase_started = time.monotonic()
        self._paused_at_start = self._clock.paused_s() if self._clock else 0.0

    def _end_phase(self) -> None:
        self._phase = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _remaining_s(self) -> float:
        """What is left of the phase's timeout, counting only the time the server was reading."""
        assert self._phase is not None
        paused = (self._clock.paused_s() if self._clock else 0.0) - self._paused_at_start
        return self._timeouts[self._phase] - (time.monotonic() - self._phase_started - paused)

    def _on_deadline(self) -> None:
        self._deadline = None
        if self._phase is None or self.transport.is_closing():
            return
        remaining = self._remaining_s()
        if remaining > 0:  # the server paused reading meanwhile: that time was not the client's
            self._deadline = self.loop.call_later(remaining, self._on_deadline)
            return
        self._time_out(self._phase)

    def _time_out(self, phase: Phase) -> None:
        """Answer 408 if no answer to anything on this connection is under way, and close it.
        A request whose headers are in has its app task running: it is told the client left
        (its reads end, whatever it sends is dropped), so it never answers over the 408."""
        cycle, timeout = self.cycle, self._timeouts[phase]
        if phase == "headers" or cycle is None:  # no app task for this request yet
            answerable = cycle is None or cycle.response_complete
            path, request_id = _path_of(self.url), f"req-{uuid.uuid4().hex}"
        else:
            answerable = not cycle.response_started
            path = cycle.scope.get("path", "")
            given = cycle.scope.get("state", {}).get("request_id")
            request_id = given if isinstance(given, str) else f"req-{uuid.uuid4().hex}"
            cycle.disconnected = True
            cycle.message_event.set()
        logger.warning(
            "request %s not received within %g s: %s, connection closed",
            phase,
            timeout,
            "answered 408" if answerable else "an answer was already under way",
            extra={"request_id": request_id, "path": keys.redacted(path), "client": self.client},
        )
        if answerable:
            message = f"request {phase} not received within {timeout:g} s"
            body = error_body(ErrorCode.REQUEST_TIMEOUT, message, {"timeout_s": timeout}, request_id, path=path)
            status_line = b"HTTP/1.1 408 Request Timeout\r\n"
            default_headers = self.server_state.default_headers
            self.transport.write(
                closing_error_response(status_line, request_id, json.dumps(body).encode(), default_headers)
            )
        self._end_phase()
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # the request target as far as the parser got (a header fault comes after it)
        request_id, body = bad_request_body(msg, _path_of(getattr(self, "url", b"") or b""))
        status_line = b"HTTP/1.1 400 Bad Request\r\n"
        self.transport.write(closing_error_response(status_line, request_id, body, self.server_state.default_headers))
        self.transport.close()
