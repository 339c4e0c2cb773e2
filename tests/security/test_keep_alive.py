"""An idle keep-alive connection stays open longer than clients keep one in their pools.

httpx (the SDK's transport, and the OpenAI and Anthropic SDKs') reuses a connection idle for less
than 5 s. uvicorn closed its side after 5 s idle by default, so a request sent on a connection idle
for almost 5 s could meet the server's close and be lost with a reset (``ReadError``), before the
app saw it: the paced 1M runs of docs/benchmarks.md lost one to three recalls that way. And with
``max_requests_per_connection`` a connection ends after that many answers, the last one saying so.

Against the API under a real uvicorn process, started like production (``deploy/localstack.py``,
with the service's protocol class)."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.server import ServerState

from deploy.localstack import LocalStack
from service.api.http_protocol import MIN_KEEP_ALIVE_S, JsonErrorHttpProtocol, keep_alive_s
from tests.security.conftest import api_only_stack

HTTPX_IDLE_EXPIRY_S = httpx.Limits().keepalive_expiry or 0.0


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length body; status 0 when the server closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), body


def _get(sock: socket.socket, path: str) -> tuple[int, bytes]:
    try:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: api\r\n\r\n".encode())
        return _read_response(sock)
    except ConnectionError:
        return 0, b""


def test_the_floor_applies_below_it_only() -> None:
    assert keep_alive_s(5) == MIN_KEEP_ALIVE_S > HTTPX_IDLE_EXPIRY_S
    assert keep_alive_s(MIN_KEEP_ALIVE_S + 55) == MIN_KEEP_ALIVE_S + 55


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("never called: only the protocol is built")


@pytest.mark.parametrize("configured", [5, MIN_KEEP_ALIVE_S + 55])
def test_the_protocol_class_applies_the_floor(configured: int) -> None:
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_no_app, timeout_keep_alive=configured)
        connection = JsonErrorHttpProtocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        assert connection.timeout_keep_alive == max(configured, MIN_KEEP_ALIVE_S)
    finally:
        loop.close()


@pytest.mark.timeout(60)
def test_a_connection_idle_past_a_clients_expiry_still_answers(served_api: LocalStack) -> None:
    host, port = served_api.api_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert _get(sock, "/healthz")[0] == 200
        # longer than any pooled client waits before reusing it, and than uvicorn's own default
        time.sleep(HTTPX_IDLE_EXPIRY_S + 1.0)
        status, body = _get(sock, "/healthz")
    assert status == 200, f"the server closed a connection idle {HTTPX_IDLE_EXPIRY_S + 1.0:.0f} s: {body!r}"


def _head_of(sock: socket.socket, path: str) -> tuple[int, str]:
    """One GET's status and the answer's ``connection`` header ("" when it has none)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: api\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed before answering"
        data += chunk
    lines = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    connection = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("connection:")), "")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    body = data.partition(b"\r\n\r\n")[2]
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), connection


@pytest.fixture(scope="module")
def api_closing_after_3(tmp_path_factory: pytest.TempPathFactory, opensearch_url: str, redis_url: str) -> Any:
    env = {"TENURE_API_MAX_REQUESTS_PER_CONNECTION": "3"}
    with api_only_stack(tmp_path_factory.mktemp("served-api-3"), opensearch_url, redis_url, env) as stack:
        yield stack


@pytest.mark.timeout(60)
def test_a_connection_closes_after_its_last_request(api_closing_after_3: LocalStack) -> None:
    """With ``max_requests_per_connection`` 3 the third answer says ``connection: close`` and the
    connection ends after it; a pooled client (httpx) opens another and loses nothing."""
    host, port = api_closing_after_3.api_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert [_head_of(sock, "/healthz") for _ in range(3)] == [(200, ""), (200, ""), (200, "close")]
        assert sock.recv(1) == b""  # closed by the server
    with httpx.Client(base_url=api_closing_after_3.api_url, timeout=10) as http:
        assert [http.get("/healthz").status_code for _ in range(10)] == [200] * 10


@pytest.mark.timeout(60)
def test_without_a_limit_a_connection_stays_open(served_api: LocalStack) -> None:
    host, port = served_api.api_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert [_head_of(sock, "/healthz") for _ in range(5)] == [(200, "")] * 5
