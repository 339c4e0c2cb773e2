"""One HTTP call as the load test sees it: a status or an error kind, the body, the latency.

Calls the SDK covers (recall, beliefs, admin, turns) go through ``tenure_client.AsyncTenure``
(:class:`Api`, :func:`sdk_call`) with its retries off, so a 429 or 503 is counted as the answer it
is; the proxy's chat completions (the SDK only points an OpenAI client at them) are sent as plain
httpx requests (:func:`call`). Both time the request from when it was due to when its answer is
read, on one shared set of keep-alive connections (:class:`LaneTransport`)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel
from tenure_client import AsyncTenure, ConnectionFailed, TenureError

if TYPE_CHECKING:
    from loadtest.generator import LoadConfig

ERROR_KINDS = ("timeout", "connect", "other")


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None when no HTTP answer arrived
    kind: str  # the status as text ("201", "503") or an error kind ("timeout", "connect", "other")
    body: Any
    latency_ms: float
    retry_after: str | None = None  # an error answer's Retry-After, as the server wrote it (whole seconds)
    # a transport failure as httpx told it ("RemoteProtocolError: Server disconnected ..."): an
    # "other" alone cannot tell a server that closed the connection from a broken answer
    error: str | None = None

    def is_status(self, *expected: int) -> bool:
        return self.status in expected


def describe(exc: BaseException | None) -> str:
    """A transport failure in one line: its class and httpx's message."""
    if exc is None:
        return "unknown transport failure"
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def error_kind(exc: BaseException | None) -> str:
    """Classify a transport failure: fault drills tell a hung server (timeout) from a dead one."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    return "other"


class LaneTransport(httpx.AsyncBaseTransport):
    """Up to ``lanes`` keep-alive connections per origin (scheme, host, port), each its own
    one-connection httpx transport; a request takes a free lane of its origin (or waits, first come
    first served, for one to be given back) and holds it until its answer is closed. A lane
    connects on its first request, so no more connections open than requests were in flight.

    Why not one httpx pool of ``lanes`` connections: httpcore's pool scans every connection it
    holds several times per request (``AsyncConnectionPool._assign_requests_to_connections``,
    encode/httpcore#1035). With 64 connections the benchmark's paced client made ~3,600
    ``is_idle`` calls per request, spent ~6 ms of CPU per recall and fell behind at 150/s on this
    2-core machine: a run measured its own client. A one-connection pool has nothing to scan. Per
    origin, so a run against several API servers in turn does not reconnect on every request."""

    def __init__(self, lanes: int):
        if lanes < 1:
            raise ValueError("a lane transport needs at least one lane")
        self.lanes_per_origin = lanes
        # httpx's own default trust (certifi, or SSL_CERT_FILE / SSL_CERT_DIR), loaded once for all:
        # each transport would load the CA store again (~25 ms apiece)
        self._tls = httpx.create_ssl_context()
        self._origins: dict[tuple[bytes, bytes, int | None], _Lanes] = {}

    @property
    def free(self) -> int:
        """Free lanes over the origins reached so far."""
        return sum(len(lanes.free) for lanes in self._origins.values())

    def _lanes_of(self, url: httpx.URL) -> _Lanes:
        origin = (url.raw_scheme, url.raw_host, url.port)
        lanes = self._origins.get(origin)
        if lanes is None:
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            lanes = _Lanes(
                [httpx.AsyncHTTPTransport(limits=limits, verify=self._tls) for _ in range(self.lanes_per_origin)]
            )
            self._origins[origin] = lanes
        return lanes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        lanes = self._lanes_of(request.url)
        lane = await lanes.take(request)
        try:
            answer = await lane.handle_async_request(request)
        except BaseException:
            lanes.give_back(lane)
            raise
        stream = _LaneStream(answer.stream, lambda: lanes.give_back(lane))
        return httpx.Response(answer.status_code, headers=answer.headers, stream=stream, extensions=answer.extensions)

    async def aclose(self) -> None:
        await asyncio.gather(*(lane.aclose() for lanes in self._origins.values() for lane in lanes.all))


class _Lanes:
    """One origin's lanes: the free ones, and the requests waiting for one in arrival order."""

    def __init__(self, lanes: list[httpx.AsyncHTTPTransport]):
        self.all = lanes
        self.free = list(lanes)
        self._waiting: deque[asyncio.Future[httpx.AsyncHTTPTransport]] = deque()

    async def take(self, request: httpx.Request) -> httpx.AsyncHTTPTransport:
        """A free lane; else the next one given back, within the request's pool timeout."""
        if self.free:
            return self.free.pop()
        turn: asyncio.Future[httpx.AsyncHTTPTransport] = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            async with asyncio.timeout((request.extensions.get("timeout") or {}).get("pool")):
                return await turn
        except (asyncio.CancelledError, TimeoutError) as exc:
            if turn.done() and not turn.cancelled():
                self.give_back(turn.result())  # handed over as the wait ended: pass it on
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout("no free connection within the pool timeout", request=request) from exc
            raise

    def give_back(self, lane: httpx.AsyncHTTPTransport) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(lane)
                return
        self.free.append(lane)


class _LaneStream(httpx.AsyncByteStream):
    """An answer's body; closing it (httpx does once the body is read) gives its lane back, once."""

    def __init__(self, inner: httpx.AsyncByteStream | httpx.SyncByteStream, release: Callable[[], None]):
        assert isinstance(inner, httpx.AsyncByteStream)  # an async transport's answer
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


def make_client(timeout_s: float, connections: int) -> httpx.AsyncClient:
    """A shared keep-alive client: one connection per simulated in-flight request at most, over
    :class:`LaneTransport` (not one httpx pool of ``connections``: see there)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), transport=LaneTransport(connections))


class Api:
    """The run's SDK clients: one per (credential, API server) over the shared pool. With several
    API servers they take turns request by request (:meth:`LoadConfig.endpoint`'s round robin)."""

    def __init__(self, config: LoadConfig, http: httpx.AsyncClient):
        self.config = config
        self.http = http
        self._clients: dict[tuple[str, str], AsyncTenure] = {}

    def as_(self, key: str) -> AsyncTenure:
        """The SDK client of ``key`` for the next request (no retries: every answer counts)."""
        base = self.config.endpoint("")
        client = self._clients.get((key, base))
        if client is None:
            client = AsyncTenure(base, key, http_client=self.http, max_retries=0)
            self._clients[(key, base)] = client
        return client


async def sdk_call(request: Awaitable[BaseModel], status: int, *, started: float | None = None) -> Outcome:
    """Await one SDK request (a coroutine not started yet) as an :class:`Outcome`: its documented
    success ``status`` and the answer as JSON, or the server's error status and error body, or the
    transport failure's kind. ``started`` backdates the latency as in :func:`call`."""
    t0 = started if started is not None else time.perf_counter()
    try:
        answer = await request
    except ConnectionFailed as exc:
        cause = exc.__cause__
        return Outcome(None, error_kind(cause), None, (time.perf_counter() - t0) * 1000, error=describe(cause))
    except TenureError as exc:
        retry_after = f"{exc.retry_after_s:g}" if exc.retry_after_s is not None else None
        return Outcome(exc.status, str(exc.status), exc.to_dict(), (time.perf_counter() - t0) * 1000, retry_after)
    latency_ms = (time.perf_counter() - t0) * 1000
    return Outcome(status, str(status), answer.model_dump(mode="json", by_alias=True), latency_ms)


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    key: str,
    *,
    json: Any = None,
    params: Any = None,
    started: float | None = None,
) -> Outcome:
    """Send one request; ``started`` (a ``perf_counter`` value) backdates the latency to when the
    request was due, so an open-model run does not hide client-side queueing."""
    t0 = started if started is not None else time.perf_counter()
    try:
        response = await client.request(
            method, url, json=json, params=params, headers={"Authorization": f"Bearer {key}"}
        )
    except httpx.HTTPError as exc:
        return Outcome(None, error_kind(exc), None, (time.perf_counter() - t0) * 1000, error=describe(exc))
    latency_ms = (time.perf_counter() - t0) * 1000
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return Outcome(response.status_code, str(response.status_code), body, latency_ms)
