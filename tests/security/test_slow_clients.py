"""A slow client (slowloris) cannot hold a connection of the API for as long as it likes.

uvicorn keeps no timer while a request is being received: a client that sends its headers or its
body a byte at a time, or connects and sends nothing, holds a file descriptor and, once its
headers are in, a request task, for ever. The service's protocol class
(``service/api/http_protocol.py``) gives a request's headers ``request_head_timeout_s`` from its
first byte and its body ``request_body_timeout_s`` from its headers, answers ``408
request_timeout`` and closes the connection; a connection that sends nothing is closed after the
keep-alive timeout. Time the server itself does not read (the app has not taken the body yet)
is not the client's, and an answer that takes long is not cut.

A real uvicorn process with the service's protocol class and error middleware, serving a small
app, with the timeouts in seconds (head 1 s, body 2 s, idle 3 s).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from deploy.devstack import free_port
from tests.served_app import uvicorn_serving
from tests.wire import content_length, header, read_chunks, read_head

HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 3
READ_LATER_S = 3.0  # longer than the body's timeout: what the server does meanwhile is its own time

SLOW_CLIENT_APP = """
import asyncio

import service.api.http_protocol as http_protocol
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from service.api.errors import RequestContextMiddleware, install_error_handlers

# The idle floor (65 s in service) lowered for this test: a silent connection then closes in seconds.
http_protocol.MIN_KEEP_ALIVE_S = {idle}

app = FastAPI()
install_error_handlers(app)
app.add_middleware(RequestContextMiddleware, max_body_bytes=4_000_000)


@app.post("/v1/import")
async def read_it_all(request: Request) -> dict[str, int]:
    return {{"received": len(await request.body())}}


@app.post("/v1/import-later")
async def read_it_later(request: Request) -> dict[str, int]:
    await asyncio.sleep({later})
    return {{"received": len(await request.body())}}


@app.get("/v1/slow-answer")
async def slow_answer() -> StreamingResponse:
    async def parts():
        for part in range(4):
            yield b"part %d\\n" % part
            await asyncio.sleep(1.0)

    return StreamingResponse(parts(), media_type="text/plain")
"""


@pytest.fixture(scope="module")
def api_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    home, port = tmp_path_factory.mktemp("slow-clients"), free_port()
    timeouts = {
        "TENURE_API_REQUEST_HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
        "TENURE_API_REQUEST_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    source = SLOW_CLIENT_APP.format(idle=IDLE_TIMEOUT_S, later=READ_LATER_S)
    with uvicorn_serving(home, source, port, env=timeouts, options=["--timeout-keep-alive", str(IDLE_TIMEOUT_S)]):
        yield port


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _trickle(sock: socket.socket, data: bytes, every_s: float) -> float:
    """Send ``data`` a byte at a time until the server stops taking it; returns when it did
    (monotonic), or when the last byte went."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
        if _closed_or_answered(sock, every_s):
            break
    return time.monotonic()


def _closed_or_answered(sock: socket.socket, wait_s: float) -> bool:
    sock.settimeout(wait_s)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK)) or True
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(10)


def _answer(sock: socket.socket) -> tuple[int, bytes, Any]:
    """Status, head and decoded body of the next answer; (0, b"", None) if the server closed."""
    stream = sock.makefile("rb")
    head = read_head(stream)
    if not head:
        return 0, b"", None
    if header(head, b"transfer-encoding") == b"chunked":
        body = read_chunks(stream)
    else:
        body = stream.read(content_length(head))
    status = int(head.split(b" ", 2)[1])
    content_type = header(head, b"content-type") or b""
    return status, head, json.loads(body) if content_type.startswith(b"application/json") else body


def _server_closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def _import_head(path: str, length: int) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: api\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n"
    return head.encode() + b"\r\n"


def test_headers_sent_a_byte_at_a_time_get_a_408_and_the_connection_closes(api_port: int) -> None:
    with _connect(api_port) as sock:
        started = time.monotonic()
        stopped = _trickle(sock, _import_head("/v1/import", 2) + b"{}", every_s=0.1)
        status, head, body = _answer(sock)
        assert status == 408, (head, body)
        assert 0.8 * HEAD_TIMEOUT_S <= stopped - started <= HEAD_TIMEOUT_S + 1.5
        assert body["error"]["code"] == "request_timeout"
        assert body["error"]["message"] == f"request headers not received within {HEAD_TIMEOUT_S:g} s"
        assert body["error"]["details"] == {"timeout_s": HEAD_TIMEOUT_S}
        assert header(head, b"x-request-id") == body["error"]["request_id"].encode()
        assert header(head, b"connection") == b"close"
        assert _server_closed(sock)


def test_a_body_sent_a_byte_at_a_time_gets_a_408_and_never_reaches_the_route(api_port: int) -> None:
    body = json.dumps({"records": ["x" * 40]}).encode()
    with _connect(api_port) as sock:
        sock.sendall(_import_head("/v1/import", len(body)))
        started = time.monotonic()
        stopped = _trickle(sock, body, every_s=0.1)
        status, head, answer = _answer(sock)
        assert status == 408, (head, answer)  # not the route's 200: its read ended with the client gone
        assert 0.8 * BODY_TIMEOUT_S <= stopped - started <= BODY_TIMEOUT_S + 1.5
        assert answer["error"]["code"] == "request_timeout"
        assert answer["error"]["message"] == f"request body not received within {BODY_TIMEOUT_S:g} s"
        # the request id the app gave the request, as on every other answer to it
        assert header(head, b"x-request-id") == answer["error"]["request_id"].encode()
        assert _server_closed(sock)


def test_a_body_that_comes_in_pieces_within_the_timeout_is_served(api_port: int) -> None:
    body = json.dumps({"records": ["x" * 3000]}).encode()
    with _connect(api_port) as sock:
        sock.sendall(_import_head("/v1/import", len(body)))
        for piece in range(3):  # 1.2 s of body, under the 2 s timeout
            time.sleep(0.4)
            sock.sendall(body[piece * len(body) // 3 : (piece + 1) * len(body) // 3])
        assert _answer(sock)[::2] == (200, {"received": len(body)})


def test_time_the_server_does_not_read_is_not_charged_to_the_client(api_port: int) -> None:
    """The route reads the body only after 3 s, longer than the body's timeout: a large body
    fills uvicorn's buffer and reading pauses until then. The client sent it all at once and must
    be served."""
    size = 1_000_000
    with _connect(api_port) as sock:
        sock.sendall(_import_head("/v1/import-later", size) + b"a" * size)
        assert _answer(sock)[::2] == (200, {"received": size})


def test_an_answer_that_takes_longer_than_both_timeouts_is_not_cut(api_port: int) -> None:
    with _connect(api_port) as sock:
        sock.sendall(b"GET /v1/slow-answer HTTP/1.1\r\nhost: api\r\n\r\n")
        status, _, body = _answer(sock)
    assert (status, body) == (200, b"part 0\npart 1\npart 2\npart 3\n")


def test_an_idle_pause_between_requests_is_the_keep_alive_timer_s_not_the_head_timer_s(api_port: int) -> None:
    with _connect(api_port) as sock:
        sock.sendall(_import_head("/v1/import", 2) + b"{}")
        assert _answer(sock)[::2] == (200, {"received": 2})
        time.sleep(HEAD_TIMEOUT_S + 0.5)  # idle: no request has begun
        sock.sendall(_import_head("/v1/import", 2) + b"{}")
        assert _answer(sock)[::2] == (200, {"received": 2})


def test_a_connection_that_never_sends_a_request_is_closed_after_the_idle_timeout(api_port: int) -> None:
    with _connect(api_port) as sock:
        opened = time.monotonic()
        sock.settimeout(IDLE_TIMEOUT_S + 5)
        assert sock.recv(1) == b""  # closed by the server, with nothing said
        assert IDLE_TIMEOUT_S - 0.5 <= time.monotonic() - opened <= IDLE_TIMEOUT_S + 2


def test_slow_clients_do_not_hold_up_others_and_are_all_let_go(api_port: int) -> None:
    slow = [_connect(api_port) for _ in range(50)]
    try:
        for index, sock in enumerate(slow):  # half stall in their headers, half in their bodies
            sock.sendall(_import_head("/v1/import", 100) + b"{" if index % 2 else b"POST /v1/import HTTP/1.1\r\nho")
        with _connect(api_port) as sock:
            started = time.monotonic()
            sock.sendall(_import_head("/v1/import", 2) + b"{}")
            assert _answer(sock)[::2] == (200, {"received": 2})
            assert time.monotonic() - started < 1.0
        time.sleep(BODY_TIMEOUT_S + 0.5)
        answers = [_answer(sock)[0] for sock in slow]
        assert answers == [408] * len(slow)
        assert all(_server_closed(sock) for sock in slow)
    finally:
        for sock in slow:
            sock.close()
