"""A lean keep-alive HTTP/1.1 connection for the event loop's OpenSearch client (recall).

opensearch-py's ``AIOHttpConnection`` spends ~185 µs of CPU per request in aiohttp (URL objects,
timeouts, cookie jar, response objects, header multidicts); a request written straight to a
kept-alive socket and its answer parsed by ``httptools`` (uvicorn's parser, already installed)
spends ~40 µs (``benchmarks/keepalive_ab.py``). A recall makes two or three such requests, on the
API's hot path. Everything above the socket stays opensearch-py's: the transport, its retries and
node rotation, the serializer, the mapping of HTTP statuses to its exceptions.

What it does: HTTP/1.1 with ``Content-Length`` bodies (gzip when ``http_compress``), answers with a
length or chunked, basic auth from the URL or the settings, TLS with the default verifying
context, at most ``maxsize`` sockets per node (a request waits for a free one, as with aiohttp's
``limit``). A socket is reused only after a complete answer that allows keep-alive; one that timed
out, broke, or whose request was cancelled is closed, never reused.
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast
from urllib.parse import urlencode

import httptools
import urllib3
from opensearchpy import AsyncConnection
from opensearchpy.exceptions import ConnectionError as OsConnectionError
from opensearchpy.exceptions import ConnectionTimeout

_CRLF = b"\r\n"


class _Exchange(asyncio.Protocol):
    """One socket: writes a request, parses its answer, and can be reused for the next."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: asyncio.Future[tuple[int, dict[str, str], bytes]] | None = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.lost = False
        self.reusable = False
        self.head_only = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(OSError(f"malformed HTTP answer from OpenSearch: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(exc or OSError("OpenSearch closed the connection before answering"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools hands each header whole; a repeated one (``warning``) is joined as HTTP allows
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        # the answer to a HEAD has a length but no body: it is whole now. The parser would wait
        # for that body, so the socket is not reused.
        if self.head_only:
            self._settle(lambda answer: answer.set_result((self.parser.get_status_code(), self.headers, b"")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        body = b"".join(self.body)
        self._settle(lambda answer: answer.set_result((self.parser.get_status_code(), self.headers, body)))

    def _fail(self, exc: Exception) -> None:
        self._settle(lambda answer: answer.set_exception(exc))

    def _settle(self, outcome: Callable[[asyncio.Future[tuple[int, dict[str, str], bytes]]], None]) -> None:
        """Resolve the pending answer once: a later callback (an error after a whole answer, or
        the parser completing a HEAD's message) finds none."""
        answer, self.answer = self.answer, None
        if answer is not None and not answer.done():
            outcome(answer)

    def send(
        self, head: bytes, body: bytes | None, *, head_only: bool = False
    ) -> asyncio.Future[tuple[int, dict[str, str], bytes]]:
        assert self.transport is not None
        if self.closing:  # closed before connection_lost ran: uvloop raises on a write to it
            raise OSError("the kept-alive socket was closed by OpenSearch")
        self.answer = asyncio.get_running_loop().create_future()
        self.headers, self.body, self.reusable, self.head_only = {}, [], False, head_only
        try:
            self.transport.writelines((head, body) if body else (head,))
        except RuntimeError as exc:  # uvloop: the handle closed under the write
            raise OSError(f"could not write to OpenSearch: {exc}") from exc
        return self.answer

    @property
    def closing(self) -> bool:
        """Closed, or closing with ``connection_lost`` not yet run."""
        return self.lost or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class KeepAliveConnection(AsyncConnection):
    """opensearch-py's ``AsyncConnection`` over :class:`_Exchange` sockets (see the module).
    ``connect_timeout``: a connect that takes longer reached no node, so it is a
    ``ConnectionError`` (retried on the next node while this one rests), unlike a read that timed
    out (``ConnectionTimeout``: not retried, since the request may have been applied)."""

    def __init__(
        self,
        host: str = "localhost",
        port: int | None = None,
        http_auth: Any = None,
        maxsize: int | None = 10,
        pool_maxsize: int | None = None,
        connect_timeout: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
        **kwargs: Any,
    ) -> None:
        self.headers: dict[str, str] = {}
        super().__init__(host=host, port=port, **kwargs)
        if http_auth is not None:
            if isinstance(http_auth, tuple | list):
                http_auth = ":".join(http_auth)
            self.headers.update(urllib3.make_headers(basic_auth=http_auth))
        self.connect_timeout = connect_timeout
        self.ssl_context = ssl_context or (ssl.create_default_context() if self.use_ssl else None)
        default_port = 443 if self.use_ssl else 80
        name = f"[{self.hostname}]" if ":" in self.hostname else self.hostname  # IPv6
        host_header = name if self.port in (None, default_port) else f"{name}:{self.port}"
        # every header name lower-case (Connection.__init__ lowers its own), so a request's own
        # header replaces the default of the same name instead of being sent twice
        self._fixed = {"host": host_header, **self.headers}
        self._fixed_head = "".join(f"{name}: {value}\r\n" for name, value in self._fixed.items())
        self._idle: deque[_Exchange] = deque()
        self._slots = asyncio.Semaphore(pool_maxsize or maxsize or 10)
        self._open: set[_Exchange] = set()
        self.closed = False

    @property
    def open_sockets(self) -> int:
        """Sockets open to the node, idle or in use (0 once closed)."""
        return len(self._open)

    async def perform_request(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        timeout: float | None = None,
        ignore: Collection[int] = (),
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        path = self.url_prefix + url + (f"?{urlencode(params)}" if params else "")
        orig_body = body
        extra = dict(headers or {})
        if self.http_compress and body:
            body = self._gzip_compress(body)
            extra["content-encoding"] = "gzip"
        head = self._head(method, path, extra, body)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(timeout if timeout is not None else self.timeout):
                status, answer_headers, raw = await self._exchange(head, body, head_only=method == "HEAD")
        except TimeoutError as exc:
            self.log_request_fail(method, self.host + path, path, orig_body, loop.time() - start, exception=exc)
            raise ConnectionTimeout("TIMEOUT", f"no answer within the request timeout: {exc}", exc) from exc
        except OsConnectionError as exc:
            self.log_request_fail(method, self.host + path, path, orig_body, loop.time() - start, exception=exc)
            raise
        except OSError as exc:
            self.log_request_fail(method, self.host + path, path, orig_body, loop.time() - start, exception=exc)
            raise OsConnectionError("N/A", str(exc), exc) from exc
        duration = loop.time() - start
        if answer_headers.get("content-encoding") == "gzip":
            raw = gzip.decompress(raw)
        data = raw.decode("utf-8", "surrogatepass")
        if "warning" in answer_headers:  # repeated ones joined: opensearch-py splits them itself
            self._raise_warnings([answer_headers["warning"]])
        if not (200 <= status < 300) and status not in ignore:
            self.log_request_fail(
                method, self.host + path, path, orig_body, duration, status_code=status, response=data
            )
            self._raise_error(status, data, answer_headers.get("content-type"))
        self.log_request_success(method, self.host + path, path, orig_body, status, data, duration)
        return status, answer_headers, data

    def _head(self, method: str, path: str, extra: Mapping[str, str], body: bytes | None) -> bytes:
        if extra:
            merged = {**self._fixed, **{name.lower(): value for name, value in extra.items()}}
            headers = "".join(f"{name}: {value}\r\n" for name, value in merged.items())
        else:
            headers = self._fixed_head
        length = len(body) if body else 0
        return f"{method} {path} HTTP/1.1\r\n{headers}content-length: {length}\r\n\r\n".encode("latin-1")

    async def _exchange(self, head: bytes, body: bytes | None, *, head_only: bool) -> tuple[int, dict[str, str], bytes]:
        async with self._slots:
            exchange = self._take_idle() or await self._connect()
            done = False
            try:
                answer = await exchange.send(head, body, head_only=head_only)
                done = True
                return answer
            finally:
                # reuse only a socket whose answer came whole and may be kept alive: after a
                # timeout, a cancellation or a failure its state is unknown
                if done and exchange.reusable and not exchange.closing and not self.closed:
                    self._idle.append(exchange)
                else:
                    exchange.close()
                    self._open.discard(exchange)

    def _take_idle(self) -> _Exchange | None:
        """The most recently used idle socket; one the node closed meanwhile is dropped."""
        while self._idle:
            exchange = self._idle.pop()
            if not exchange.closing:
                return exchange
            exchange.close()
            self._open.discard(exchange)
        return None

    async def _connect(self) -> _Exchange:
        loop = asyncio.get_running_loop()
        try:
            _, exchange = await asyncio.wait_for(
                loop.create_connection(_Exchange, self.hostname, self.port, ssl=self.ssl_context),
                self.connect_timeout,
            )
        except (TimeoutError, OSError) as exc:
            raise OsConnectionError("N/A", f"could not connect to {self.host}: {exc!r}", exc) from exc
        self._open.add(exchange)
        return exchange

    async def close(self) -> None:
        self.closed = True
        while self._idle:
            self._idle.popleft().close()
        for exchange in list(self._open):
            exchange.close()
        self._open.clear()
