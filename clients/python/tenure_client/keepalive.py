"""A lean HTTP/1.1 keep-alive transport for :class:`~tenure_client.AsyncTenure` (opt-in).

httpx's default transport (httpcore, h11, anyio) spends ~450 µs of CPU per request on this
machine before httpx's own ~120 µs; a recall answer parsed by ``httptools`` (uvicorn's C parser)
off a kept-alive asyncio socket spends ~50 µs, and the request costs as much less in latency
(``benchmarks/sdk_transport_ab.py``, docs/benchmarks.md). An agent that recalls on every turn
pays it every turn::

    from tenure_client import AsyncTenure
    from tenure_client.keepalive import KeepAliveTransport

    async with KeepAliveTransport() as transport, AsyncTenure(url, api_key, transport=transport) as tenure:
        ...

A client never closes a transport it was given: that is the caller's to close (above, the ``async
with``), so several clients (one per user's key) can share one transport and its sockets.

What it does: HTTP/1.1 over TCP or TLS (the default verifying context, or ``ssl_context``),
requests with a ``Content-Length`` body, answers with a length or chunked (as uvicorn sends), read
whole (no streaming: the async client has no streamed call); at most ``max_connections``
sockets per origin, a request waiting for a free one within httpx's pool timeout; httpx's
connect, read and pool timeouts, raised as httpx's exceptions, so the client's retries and
errors work unchanged. A socket is reused only after a complete answer that allows keep-alive,
and not after ``keepalive_expiry`` seconds idle (below uvicorn's 5 s, so the server never closes
one under a request). One that timed out, broke, or whose request was cancelled is closed, never
reused. Not supported: proxies (``HTTP_PROXY`` is not read), HTTP/2, ``Expect: 100-continue``.

:class:`KeepAliveSyncTransport` is the same for the synchronous :class:`~tenure_client.Tenure`
(``with KeepAliveSyncTransport() as transport: Tenure(url, key, transport=transport)``), over
blocking sockets, safe to share between threads; its answers stream (a JSONL export is read as it
arrives), and a socket goes back to the pool once its answer was read whole. An idle socket the
server closed is noticed before reuse (it reads as ready: end of file) and dropped.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar, cast

import httptools
import httpx

_CRLF = b"\r\n"
_Origin = tuple[str, str, int]
PoolT = TypeVar("PoolT")


class TransportClosed(httpx.TransportError):
    """A request handed to a transport after it was closed: an httpx transport error, so the SDK
    reports it as :class:`~tenure_client.errors.ConnectionFailed` like any other (and does not
    retry it: it cannot succeed)."""

    def __init__(self, request: httpx.Request):
        message = "the transport is closed (a transport you pass to a client is yours to close)"
        super().__init__(message, request=request)


class _Exchange(asyncio.Protocol):
    """One socket: writes a request, parses its answer, and can be reused for the next."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.lost = False
        self.reusable = False
        self.head_only = False
        self.idle_since = time.monotonic()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP answer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(httpx.ReadError(str(exc) if exc else "the server closed the connection before answering"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # the answer to a HEAD states a length but has no body: it is whole now. The parser
        # would wait for that body, so the socket is not reused.
        if self.head_only:
            self._settle()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive() and not self.head_only
        self._settle()

    def _settle(self) -> None:
        answer, status, headers, body = self.answer, self.parser.get_status_code(), self.headers, b"".join(self.body)
        self.answer, self.headers, self.body = None, [], []
        if answer is not None and not answer.done():
            answer.set_result((status, headers, body))

    # the transport's side
    def send(self, data: bytes, *, head_only: bool) -> asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]]:
        assert self.transport is not None
        self.answer = asyncio.get_running_loop().create_future()
        self.reusable, self.head_only = False, head_only
        self.transport.write(data)
        return self.answer

    def usable(self, now: float, expiry: float) -> bool:
        return (
            not self.lost
            and self.transport is not None
            and not self.transport.is_closing()
            and (now - self.idle_since < expiry)
        )

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: Exception) -> None:
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            answer.set_exception(exc)
        self.close()


class _Pool:
    """The sockets of one origin: idle ones (last used first) and a bound on how many exist."""

    def __init__(self, max_connections: int):
        self.idle: deque[_Exchange] = deque()
        self.slots = asyncio.Semaphore(max_connections)


class _KeepAliveOptions(Generic[PoolT]):
    """What both transports are configured with: their options, their pools (one per origin)
    and the TLS context their sockets share."""

    def __init__(
        self,
        *,
        max_connections: int = 16,
        keepalive_expiry: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ):
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._pools: dict[_Origin, PoolT] = {}
        self._lock = threading.Lock()  # the synchronous transport's threads share the pools and idle lists
        self._closed = False

    def _tls(self) -> ssl.SSLContext:
        # made once: building the default context reads the system's CA bundle
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context


class KeepAliveTransport(_KeepAliveOptions[_Pool], httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` over kept-alive asyncio sockets (see the module's notes)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise TransportClosed(request)
        origin = _origin(request.url)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        pool = self._pools.get(origin) or self._pools.setdefault(origin, _Pool(self.max_connections))
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await pool.slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no free connection within the pool timeout", request=request) from None
        exchange: _Exchange | None = None
        try:
            exchange = await self._idle_or_new(pool, origin, timeouts.get("connect"), request)
            data = _encode(request, await request.aread())
            try:
                async with asyncio.timeout(timeouts.get("read")):
                    status, headers, body = await exchange.send(data, head_only=request.method == "HEAD")
            except TimeoutError:
                raise httpx.ReadTimeout("no answer within the read timeout", request=request) from None
            except httpx.TransportError as exc:
                exc.request = request
                raise
            if exchange.reusable and not exchange.lost:
                exchange.idle_since = time.monotonic()
                pool.idle.append(exchange)
                exchange = None
            return httpx.Response(
                status,
                headers=headers,
                stream=httpx.ByteStream(body),
                extensions={"http_version": b"HTTP/1.1"},
                request=request,
            )
        finally:
            if exchange is not None:
                exchange.close()  # broken, timed out, cancelled or not to be kept
            pool.slots.release()

    async def _idle_or_new(
        self, pool: _Pool, origin: _Origin, connect_timeout: float | None, request: httpx.Request
    ) -> _Exchange:
        now = time.monotonic()
        while pool.idle:
            exchange = pool.idle.pop()
            if exchange.usable(now, self.keepalive_expiry):
                return exchange
            exchange.close()
        scheme, host, port = origin
        tls = self._tls() if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, exchange = await loop.create_connection(
                    _Exchange, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect to {host}:{port} in time", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"could not connect to {host}:{port}: {exc}", request=request) from exc
        return exchange

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            while pool.idle:
                pool.idle.pop().close()
        self._pools.clear()


def _reads_as_ready(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read now (``poll``: no limit on the descriptor's
    number, where ``select`` refuses one above 1023)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    ready, _, _ = select.select([sock], [], [], 0)  # pragma: no cover - Windows
    return bool(ready)


class _SyncExchange:
    """One blocking socket: writes a request, parses its answer as it is read (the head first,
    then the body as the caller asks for it), and can be reused for the next once complete."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.head_done = self.complete = self.reusable = self.head_only = self.closed = False
        self.idle_since = time.monotonic()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.complete = self.head_only  # the answer to a HEAD has no body (the socket is not reused)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.reusable = self.parser.should_keep_alive() and not self.head_only

    # the transport's side
    def start(
        self, data: bytes, *, head_only: bool, timeouts: dict[str, float | None], request: httpx.Request
    ) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Send the request; the answer's status and headers (its body: :meth:`body`)."""
        self.headers, self.chunks = [], deque()
        self.head_done = self.complete = self.reusable = False
        self.head_only = head_only
        self.sock.settimeout(timeouts.get("write"))
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise httpx.WriteTimeout("not sent within the write timeout", request=request) from None
        except OSError as exc:
            raise httpx.WriteError(f"could not send the request: {exc}", request=request) from exc
        self.sock.settimeout(timeouts.get("read"))
        while not self.head_done:
            self._read(request)
        return self.parser.get_status_code(), self.headers

    def body(self, request: httpx.Request) -> Iterator[bytes]:
        while True:
            while self.chunks:
                yield self.chunks.popleft()
            if self.complete:
                return
            self._read(request)

    def _read(self, request: httpx.Request) -> None:
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise httpx.ReadTimeout("no answer within the read timeout", request=request) from None
        except OSError as exc:
            raise httpx.ReadError(f"could not read the answer: {exc}", request=request) from exc
        if not data:
            raise httpx.ReadError("the server closed the connection before answering", request=request)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"malformed HTTP answer: {exc}", request=request) from exc

    def usable(self, now: float, expiry: float) -> bool:
        """Not closed, not idle too long, and nothing to read: an idle keep-alive socket that
        reads as ready holds the server's end of file (or bytes no request asked for)."""
        if self.closed or now - self.idle_since >= expiry:
            return False
        try:
            return not _reads_as_ready(self.sock)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()


class _SyncPool:
    """The sockets of one origin: idle ones (last used first) and a bound on how many exist."""

    def __init__(self, max_connections: int):
        self.idle: deque[_SyncExchange] = deque()
        self.slots = threading.BoundedSemaphore(max_connections)


class _Answer(httpx.SyncByteStream):
    """An answer's body as it is read; closing it hands the socket back (kept if the answer was
    read whole and allows keep-alive, else closed) and frees its slot, once."""

    def __init__(
        self, transport: KeepAliveSyncTransport, pool: _SyncPool, exchange: _SyncExchange, request: httpx.Request
    ):
        self._transport, self._pool, self._exchange, self._request = transport, pool, exchange, request
        self._released = False

    def __iter__(self) -> Iterator[bytes]:
        return self._exchange.body(self._request)

    def close(self) -> None:
        if not self._released:
            self._released = True
            self._transport._release(self._pool, self._exchange)


class KeepAliveSyncTransport(_KeepAliveOptions[_SyncPool], httpx.BaseTransport):
    """An ``httpx.BaseTransport`` over kept-alive blocking sockets (see the module's notes)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise TransportClosed(request)
        origin = _origin(request.url)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        with self._lock:
            pool = self._pools.get(origin) or self._pools.setdefault(origin, _SyncPool(self.max_connections))
        if not pool.slots.acquire(timeout=timeouts.get("pool")):
            raise httpx.PoolTimeout("no free connection within the pool timeout", request=request)
        exchange: _SyncExchange | None = None
        try:
            exchange = self._idle_or_new(pool, origin, timeouts.get("connect"), request)
            data = _encode(request, request.read())
            head_only = request.method == "HEAD"
            status, headers = exchange.start(data, head_only=head_only, timeouts=timeouts, request=request)
        except BaseException:
            if exchange is not None:
                exchange.close()
            pool.slots.release()
            raise
        return httpx.Response(
            status,
            headers=headers,
            stream=_Answer(self, pool, exchange, request),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    def _release(self, pool: _SyncPool, exchange: _SyncExchange) -> None:
        if exchange.complete and exchange.reusable and not exchange.closed and not self._closed:
            exchange.idle_since = time.monotonic()
            with self._lock:
                pool.idle.append(exchange)
        else:
            exchange.close()  # broken, timed out, not read whole, or not to be kept
        pool.slots.release()

    def _idle_or_new(
        self, pool: _SyncPool, origin: _Origin, connect_timeout: float | None, request: httpx.Request
    ) -> _SyncExchange:
        now = time.monotonic()
        while True:
            with self._lock:
                exchange = pool.idle.pop() if pool.idle else None
            if exchange is None:
                break
            if exchange.usable(now, self.keepalive_expiry):
                return exchange
            exchange.close()
        scheme, host, port = origin
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect to {host}:{port} in time", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"could not connect to {host}:{port}: {exc}", request=request) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                sock = self._tls().wrap_socket(sock, server_hostname=host)
        except TimeoutError:
            sock.close()
            raise httpx.ConnectTimeout(f"no TLS handshake with {host}:{port} in time", request=request) from None
        except OSError as exc:  # ssl.SSLError included: an unverified certificate sends nothing
            sock.close()
            raise httpx.ConnectError(f"could not connect to {host}:{port}: {exc}", request=request) from exc
        return _SyncExchange(sock)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle = [exchange for pool in self._pools.values() for exchange in pool.idle]
            self._pools = {}
        for exchange in idle:
            exchange.close()


def _origin(url: httpx.URL) -> _Origin:
    if url.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"{url.scheme!r} is not http or https")
    return url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80)


def _encode(request: httpx.Request, body: bytes) -> bytes:
    """The request line, headers and body; the body's length stated (never chunked: it is read)."""
    lines = [b"%s %s HTTP/1.1" % (request.method.encode("ascii"), request.url.raw_path)]
    for name, value in request.headers.raw:
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(name + b": " + value)
    if body or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(b"Content-Length: %d" % len(body))
    return _CRLF.join(lines) + _CRLF + _CRLF + body
