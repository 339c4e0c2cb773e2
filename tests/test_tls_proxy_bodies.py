"""The TLS proxy (deploy/caddy/Caddyfile, run by the real Caddy binary) never cuts an answer.

Go's proxy transport (Caddy 2.6.2 on Go 1.19 and Caddy 2.11.9 on Go 1.26 alike) copies a streamed
request body to the API, then reads it once more. When the API's answer comes first, writing the
answer's headers to the client makes Go's server close the client's body; that last read then
fails, and the transport drops the API connection with the answer's body still on it. The client
gets the status and headers, then nothing (``peer closed connection without sending complete
message body``). Seen on the compose stack about once in 40,000 requests, on recalls the API
answered within a few milliseconds (docs/operations.md "Answers cut by the proxy").

Here the race is made likely: the client sends its body 5 ms after its headers, the stand-in
API answers the headers at once and the body 50 ms later, and busy loops keep every core taken
(Go's goroutines then wait for a thread, which is what opens the window on a loaded host).
Without ``request_buffers`` (Caddy 2.11.9), 9 of 80 answers were cut, and 5 of 40 with the body
chunked; with Caddy 2.6.2 and no buffering, 5, 7 and 6 of 80. On an idle machine, none of 30.

A large body streams on after its first 100 kB (the proxy never holds more of a request), and
the API may refuse it before it has read it (over the body limit): a test sends such imports
through the proxy to the service's own body limit under uvicorn, and the client must get the
whole 413. What takes the race away at its root is the proxy's full-duplex mode: Go's server
then leaves the client's body to the proxy once the answer is written, and a stand-in that
refuses early and reads on must get every byte the client sent.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from deploy.compose_check import local_caddyfile
from deploy.devstack import free_port
from tests.caddy import caddy_binary
from tests.served_app import uvicorn_serving, wait_until_serving
from tests.wire import chunks, content_length, read_chunks, read_head

ANSWER = b"x" * 3000  # a recall's answer is ~3 kB
ANSWER_HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(ANSWER)
SMALL_BODY = 100_000  # the Caddyfile reads bodies under this whole before passing them on (request_buffers)
ROUNDS = 80


@dataclass
class EagerApi:
    """An upstream that answers the headers of a small or chunked request before it has read the
    body, as a fast API does whenever Go's transport is slow to finish with the body. A large body
    is read first (the real API reads an import before it answers)."""

    bodies: list[int] = field(default_factory=list)
    heads_at: list[float] = field(default_factory=list)  # when each request's headers arrived

    def serve(self, port: int) -> socketserver.ThreadingTCPServer:
        api = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while head := read_head(self.rfile):
                    api.heads_at.append(time.monotonic())
                    chunked = b"transfer-encoding: chunked" in head.lower()
                    length = content_length(head)
                    if chunked or length < SMALL_BODY:
                        self.wfile.write(ANSWER_HEAD)
                        self.wfile.flush()
                    api.bodies.append(len(read_chunks(self.rfile) if chunked else self.rfile.read(length)))
                    if chunked or length < SMALL_BODY:
                        time.sleep(0.05)
                        self.wfile.write(ANSWER)
                    else:
                        self.wfile.write(ANSWER_HEAD + ANSWER)
                    self.wfile.flush()

        return serve_in_thread(port, Handler)


@contextmanager
def caddy_in_front(tmp_path: Path, **settings: str) -> Iterator[tuple[int, int]]:
    """The Caddyfile as the compose check runs it (every port on loopback: compose_check's own
    rewrite), with ``settings`` as its compose environment; yields its HTTPS port and the API
    port it forwards to."""
    home = str(tmp_path)  # Caddy's internal CA and state
    ports = {name: str(free_port()) for name in ("CADDY_ADMIN_PORT", "HTTP_PORT", "HTTPS_PORT", "API_PORT")}
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "XDG_DATA_HOME": home, "XDG_CONFIG_HOME": home}
    env |= {"PUBLIC_HOST": "localhost", "TLS_CERTIFICATES": "internal", **settings}
    (tmp_path / "Caddyfile").write_text(local_caddyfile(ports))
    port = int(ports["HTTPS_PORT"])
    with (tmp_path / "caddy.log").open("w") as log:
        run = [caddy_binary(), "run", "--config", str(tmp_path / "Caddyfile"), "--adapter", "caddyfile"]
        process = subprocess.Popen(run, env=env, stderr=log)
    try:
        wait_until_serving(lambda: _tls(port), process, "caddy")
        yield port, int(ports["API_PORT"])
    finally:
        process.terminate()
        process.wait(timeout=10)


class Upstream(Protocol):
    def serve(self, port: int) -> socketserver.ThreadingTCPServer: ...


U = TypeVar("U", bound=Upstream)


@contextmanager
def upstream_behind_proxy(tmp_path: Path, api: U, **settings: str) -> Iterator[tuple[int, U]]:
    """``api`` served behind the proxy (``settings``: its compose environment); yields the
    proxy's HTTPS port and ``api``."""
    with caddy_in_front(tmp_path, **settings) as (port, api_port):
        upstream = api.serve(api_port)
        try:
            yield port, api
        finally:
            upstream.shutdown()
            upstream.server_close()


def serve_in_thread(port: int, handler: type[socketserver.BaseRequestHandler]) -> socketserver.ThreadingTCPServer:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[int, EagerApi]]:
    """The proxy in front of :class:`EagerApi`."""
    with upstream_behind_proxy(tmp_path, EagerApi()) as served:
        yield served


def _tls(port: int) -> ssl.SSLSocket:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # Caddy's internal CA; what is tested is the HTTP exchange
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="localhost")


def _post(port: int, body: bytes, body_delay_s: float, split: int = 0, *, chunked: bool = False) -> tuple[bytes, bytes]:
    """The status line and the body of the answer to one POST whose body (from byte ``split``
    on) follows its headers after ``body_delay_s``; a body cut short comes back short.
    ``chunked``: no ``Content-Length``, the body sent as one chunk after the delay."""
    with _tls(port) as connection:
        head = b"POST /v1/recall HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        if chunked:
            connection.sendall(head + b"transfer-encoding: chunked\r\n\r\n")
            rest = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        else:
            connection.sendall(head + b"content-length: %d\r\n\r\n" % len(body) + body[:split])
            rest = body[split:]
        time.sleep(body_delay_s)
        connection.sendall(rest)
        stream = connection.makefile("rb")
        answer_head = read_head(stream)
        return answer_head.split(b"\r\n", 1)[0], stream.read(content_length(answer_head))


@contextmanager
def every_core_busy() -> Iterator[None]:
    """Two busy loops per core (up to 4 cores), for as long as the block runs."""
    count = 2 * min(os.cpu_count() or 2, 4)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_an_answer_that_comes_before_the_body_is_read_reaches_the_client_whole(proxy: tuple[int, EagerApi]) -> None:
    port, api = proxy
    body = json.dumps({"query": "how do we deploy", "scopes": ["domain:code"]}).encode()
    with every_core_busy():
        answers = [_post(port, body, body_delay_s=0.005) for _ in range(ROUNDS)]
    cut = [len(answer) for status, answer in answers if answer != ANSWER]
    assert not cut, f"{len(cut)} of {ROUNDS} answers cut short (bytes received: {cut})"
    assert all(status == b"HTTP/1.1 200 OK" for status, _ in answers)
    assert api.bodies == [len(body)] * ROUNDS  # and every body reached the API whole


def test_a_large_body_still_streams_to_the_api(proxy: tuple[int, EagerApi]) -> None:
    """Bodies of 100 kB and more (imports) are not held by the proxy until they are complete:
    the API sees the request while the client is still sending, and gets the body intact."""
    port, api = proxy
    body = b"[" + b"1," * 150_000 + b"1]"
    sent_first_half = time.monotonic()
    status, answer = _post(port, body, body_delay_s=0.5, split=len(body) // 2)
    assert (status, answer) == (b"HTTP/1.1 200 OK", ANSWER)
    assert api.bodies == [len(body)]
    assert api.heads_at[0] - sent_first_half < 0.4, "the proxy held the request until its body was complete"


def test_a_small_body_reaches_the_api_only_once_complete(proxy: tuple[int, EagerApi]) -> None:
    """The other side of the fix: a small body is read whole first (``request_buffers``), so the
    API sees the request only after the client's last byte."""
    port, api = proxy
    started = time.monotonic()
    status, answer = _post(port, b'{"query": "x"}', body_delay_s=0.3)
    assert (status, answer) == (b"HTTP/1.1 200 OK", ANSWER)
    assert api.heads_at[0] - started >= 0.3


def test_a_small_chunked_body_is_read_whole_and_its_answer_reaches_the_client(proxy: tuple[int, EagerApi]) -> None:
    """A client that sends a small body chunked (no Content-Length) gets the same protection: the
    proxy reads it whole (it stays chunked on the way to the API), so a fast answer is never cut."""
    port, api = proxy
    body = json.dumps({"query": "how do we deploy", "scopes": ["domain:code"]}).encode()
    with every_core_busy():
        answers = [_post(port, body, body_delay_s=0.005, chunked=True) for _ in range(ROUNDS // 2)]
    cut = [len(answer) for status, answer in answers if answer != ANSWER]
    assert not cut, f"{len(cut)} of {ROUNDS // 2} answers cut short (bytes received: {cut})"
    assert api.bodies == [len(body)] * (ROUNDS // 2)  # and the API got each body whole


# The service's own body limit and error rendering, under uvicorn with the service's HTTP protocol:
# a route that reads the whole body and answers its length.
LIMITED_APP = """
from fastapi import FastAPI, Request
from service.api.errors import RequestContextMiddleware, install_error_handlers

app = FastAPI()
install_error_handlers(app)
app.add_middleware(RequestContextMiddleware, max_body_bytes={limit})


@app.post("/v1/import")
async def read_it_all(request: Request) -> dict[str, int]:
    return {{"received": len(await request.body())}}
"""
BODY_LIMIT = 200_000


@pytest.fixture
def limited_api(tmp_path: Path) -> Iterator[int]:
    """The proxy in front of :data:`LIMITED_APP`; yields the proxy's HTTPS port."""
    with (
        caddy_in_front(tmp_path) as (port, api_port),
        uvicorn_serving(tmp_path, LIMITED_APP.format(limit=BODY_LIMIT), api_port),
    ):
        yield port


def _post_large(port: int, size: int, *, chunked: bool) -> tuple[bytes, dict[str, Any]]:
    """One import of ``size`` bytes sent in 64 kB pieces (declared, or chunked with no length);
    the answer's status line and JSON body. The client keeps sending while the API has already
    refused, as a real client does."""
    with _tls(port) as connection:
        framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % size
        connection.sendall(b"POST /v1/import HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n")
        connection.sendall(framing + b"\r\n\r\n")
        piece = b"a" * 65_536
        try:
            for start in range(0, size, len(piece)):
                data = piece[: size - start]
                connection.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            if chunked:
                connection.sendall(b"0\r\n\r\n")
        except OSError:  # the proxy may stop reading once the answer is out: the answer still counts
            pass
        stream = connection.makefile("rb")
        head = read_head(stream)
        return head.split(b"\r\n", 1)[0], json.loads(stream.read(content_length(head)) or b"null")


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_refused_large_body_gets_the_whole_413_through_the_proxy(limited_api: int, chunked: bool) -> None:
    """A body over the API's limit streams through the proxy (it is over 100 kB), and the API
    refuses it before it has all of it: by its declared length at once, or, chunked, as soon as
    the count passes the limit. The client must get the service's 413 whole, never a cut answer
    or the proxy's 502, with every core busy (what opens the proxy's windows)."""
    with every_core_busy():
        answers = [_post_large(limited_api, 3_000_000, chunked=chunked) for _ in range(12)]
    for status, body in answers:
        assert status == b"HTTP/1.1 413 Request Entity Too Large", (status, body)
        assert body["error"]["code"] == "payload_too_large"
        assert body["error"]["details"] == {"limit": BODY_LIMIT}
    # and a body under the limit, but over the size the proxy reads whole, still goes through
    status, body = _post_large(limited_api, BODY_LIMIT - 10, chunked=chunked)
    assert (status, body) == (b"HTTP/1.1 200 OK", {"received": BODY_LIMIT - 10})


@dataclass
class RefusingApi:
    """An upstream that refuses a body as soon as it has read ``limit`` bytes of it (as the API's
    body limit does), then reads the rest and notes how much of the body reached it in all."""

    limit: int
    received: list[int] = field(default_factory=list)

    def serve(self, port: int) -> socketserver.ThreadingTCPServer:
        api = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while head := read_head(self.rfile):
                    received = 0
                    try:
                        for piece in _body_pieces(self.rfile, head):
                            received += piece
                            if received - piece <= api.limit < received:
                                self.wfile.write(b"HTTP/1.1 413 Request Entity Too Large\r\n")
                                self.wfile.write(b"content-length: %d\r\n\r\n%s" % (len(REFUSAL), REFUSAL))
                                self.wfile.flush()
                    finally:  # a connection dropped mid-body counts what came
                        api.received.append(received)

        return serve_in_thread(port, Handler)


REFUSAL = b'{"error": {"code": "payload_too_large"}}'
REFUSED_ROUNDS = 6  # without full duplex every run of 3 or 6 rounds had a body 256 kB short or cut off


def _body_pieces(stream: Any, head: bytes) -> Iterator[int]:
    """The sizes of a request body's pieces as they are read (declared or chunked)."""
    if b"transfer-encoding: chunked" not in head.lower():
        left = content_length(head)
        while left and (data := stream.read(min(left, 65_536))):
            left -= len(data)
            yield len(data)
        return
    for chunk in chunks(stream):
        yield len(chunk)


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_the_proxy_passes_on_the_whole_of_a_body_the_api_refused_early(tmp_path: Path, chunked: bool) -> None:
    """Why a refused import's 413 reaches the client whole: once the API has answered, the proxy
    goes on passing the body to it (``enable_full_duplex``). Without it Go's HTTP server, on
    writing the answer's headers to the client, reads up to 256 kB of the client's body itself,
    racing the proxy's own copy of it (2,737,855 of 3,000,000 bytes reached the API), and may close
    that body under it: then the transport drops the API connection and the client gets the
    status with no body (once in CI, 2026-12-06)."""
    with upstream_behind_proxy(tmp_path, RefusingApi(limit=BODY_LIMIT)) as (port, api):
        answers = []
        for round_ in range(REFUSED_ROUNDS):
            answers.append(_post_large(port, 3_000_000, chunked=chunked))
            # the answer came before the body's end: let the stand-in finish reading it
            deadline = time.monotonic() + 10
            while len(api.received) <= round_ and time.monotonic() < deadline:
                time.sleep(0.01)
    assert answers == [(b"HTTP/1.1 413 Request Entity Too Large", json.loads(REFUSAL))] * REFUSED_ROUNDS
    assert api.received == [3_000_000] * REFUSED_ROUNDS


# ------------------------------------------------------------ slow clients

STREAMED_PARTS = 4  # one a second: the answer takes longer than the request timeouts below


@dataclass
class StreamingApi:
    """An upstream that reads a request whole, then streams its answer chunk by chunk, one a
    second (a chat answer's server-sent events)."""

    heads: int = 0

    def serve(self, port: int) -> socketserver.ThreadingTCPServer:
        api = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while head := read_head(self.rfile):
                    api.heads += 1
                    self.rfile.read(content_length(head))
                    self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
                    self.wfile.write(b"transfer-encoding: chunked\r\n\r\n")
                    for part in range(STREAMED_PARTS):
                        event = b"data: %d\n\n" % part
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                        time.sleep(1.0)
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()

        return serve_in_thread(port, Handler)


@pytest.fixture
def impatient_proxy(tmp_path: Path) -> Iterator[tuple[int, StreamingApi]]:
    """The proxy with its request timeouts at 1 s (headers) and 2 s (the whole request), in
    front of :class:`StreamingApi`."""
    timeouts = {"TLS_READ_HEADER_TIMEOUT": "1s", "TLS_READ_BODY_TIMEOUT": "2s"}
    with upstream_behind_proxy(tmp_path, StreamingApi(), **timeouts) as served:
        yield served


@pytest.mark.parametrize("stalls_in", ["headers", "body"])
def test_a_request_trickled_to_the_proxy_is_dropped_and_never_reaches_the_api(
    impatient_proxy: tuple[int, StreamingApi], stalls_in: str
) -> None:
    """A client that sends its request a byte every 0.1 s (slowloris) is let go by the proxy once
    the request's time is up; its small body is read whole first, so the API never sees it."""
    port, api = impatient_proxy
    head = b"POST /v1/recall HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
    head += b"content-length: 200\r\n\r\n"
    with _tls(port) as connection:
        if stalls_in == "body":
            connection.sendall(head)
        started = time.monotonic()
        connection.settimeout(0.1)
        answer = b""
        for byte in (head if stalls_in == "headers" else b"") + b"x" * 200:
            try:
                connection.sendall(bytes([byte]))
                answer = connection.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            break  # an answer, or the end of the stream: the proxy has let go
        held_s = time.monotonic() - started
    assert 0.8 <= held_s <= (2.0 if stalls_in == "headers" else 3.5), held_s
    assert not answer.startswith(b"HTTP/1.1 200"), answer
    assert api.heads == 0


def test_a_streamed_answer_may_take_longer_than_the_request_timeouts(impatient_proxy: tuple[int, StreamingApi]) -> None:
    """Only the request is timed: an answer streamed over 4 s, past both timeouts, arrives whole."""
    port, api = impatient_proxy
    with _tls(port) as connection:
        connection.settimeout(10)
        body = b'{"query": "x"}'
        connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n")
        connection.sendall(b"content-length: %d\r\n\r\n%s" % (len(body), body))
        stream = connection.makefile("rb")
        assert read_head(stream).startswith(b"HTTP/1.1 200 OK")
        events = read_chunks(stream)
    assert events == b"".join(b"data: %d\n\n" % part for part in range(STREAMED_PARTS))
    assert api.heads == 1
