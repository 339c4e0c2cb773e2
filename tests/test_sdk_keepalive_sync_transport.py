"""The synchronous SDK's opt-in keep-alive transport (``KeepAliveSyncTransport``,
clients/python/tenure_client/keepalive.py): answers as httpx's own transport gives them (streamed
too), httpx's exceptions for every failure, a socket reused only when that is safe, and safe to
share between threads.

The servers are those of tests/test_sdk_keepalive_transport.py (a few lines of asyncio on
loopback that answer as HTTP/1.1 servers do), run on a loop in a thread of their own."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tenure_client import ConnectionFailed, Tenure
from tenure_client.keepalive import KeepAliveSyncTransport, TransportClosed

from tests.test_sdk_keepalive_transport import (
    _OK,
    HangsUpWhenIdle,
    _late_first,
    _ok,
    _self_signed,
    _Server,
    assert_sent_as_httpx_built,
)


@contextmanager
def served(server: _Server, ssl_context: ssl.SSLContext | None = None) -> Iterator[str]:
    """``server`` listening on loopback from a thread of its own; yields its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> str:
        server.server = await asyncio.start_server(server._handle, "127.0.0.1", 0, ssl=ssl_context)
        scheme = "https" if ssl_context else "http"
        return f"{scheme}://127.0.0.1:{server.server.sockets[0].getsockname()[1]}"

    try:
        yield asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    finally:

        async def stop() -> None:
            assert server.server is not None
            server.server.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def client(url: str, **kwargs: Any) -> httpx.Client:
    transport = kwargs.pop("transport", None) or KeepAliveSyncTransport()
    return httpx.Client(base_url=url, transport=transport, **kwargs)


def test_sequential_requests_share_one_socket_and_send_what_httpx_built() -> None:
    server = _Server(_ok)
    with served(server) as url, client(url) as http:
        for n in range(5):
            answer = http.post("/v1/recall", json={"query": f"q{n}"}, headers={"X-Trace": "t"})
            assert answer.status_code == 200 and answer.json() == {"ok": True}
            assert answer.http_version == "HTTP/1.1"
        assert http.get("/v1/beliefs", params={"scope": "project:pay", "q": "a b"}).json() == {"ok": True}
    assert_sent_as_httpx_built(server)


def test_a_chunked_answer_streams_and_a_closing_one_is_not_kept() -> None:
    chunked = b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n'
    closing = b"HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"

    async def answer(_: bytes, n: int) -> bytes:
        return chunked if n in (1, 2) else closing

    server = _Server(answer)
    with served(server) as url, client(url) as http:
        assert http.get("/a").json() == {"a": 1}
        with http.stream("GET", "/export") as streamed:
            assert b"".join(streamed.iter_raw()) == b'{"a":1}'
        closed = http.post("/b", content=b"x")
        assert closed.status_code == 201 and closed.json() == {}
        assert http.get("/c").status_code == 201  # a new socket after the close
    assert server.connections == 2


def test_a_stream_closed_before_its_end_does_not_leave_its_socket_for_the_next() -> None:
    long = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"5\r\nline\n\r\n" * 3

    async def answer(request: bytes, n: int) -> bytes:
        if n == 1:
            return long  # the last chunk never comes: the answer stays unfinished
        return _OK

    server = _Server(answer)
    with served(server) as url, client(url, timeout=httpx.Timeout(5.0, read=0.5)) as http:
        with http.stream("GET", "/export") as streamed:
            first = next(streamed.iter_raw())
            assert first.startswith(b"line")
        assert http.get("/next").json() == {"ok": True}
    assert server.connections == 2


def test_a_socket_the_server_closed_while_idle_is_not_used() -> None:
    server = HangsUpWhenIdle(_ok)
    with served(server) as url, client(url) as http:
        assert http.get("/one").status_code == 200
        time.sleep(0.2)  # the close has arrived: the idle socket reads as ready (end of file)
        assert http.get("/two").status_code == 200
    assert server.connections == 2


def test_idle_sockets_expire_before_the_server_would_close_them() -> None:
    server = _Server(_ok)
    with served(server) as url, client(url, transport=KeepAliveSyncTransport(keepalive_expiry=0.2)) as http:
        http.get("/one")
        http.get("/two")
        time.sleep(0.3)
        http.get("/three")
    assert server.connections == 2


def test_a_slow_answer_is_a_read_timeout_and_its_socket_is_not_reused() -> None:
    server = _Server(_late_first)
    with served(server) as url, client(url, timeout=httpx.Timeout(5.0, read=0.2)) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.get("/slow")
        # the late answer to /slow must never be read as the answer to the next request
        assert http.get("/next").json() == {"ok": True}
    assert server.connections == 2


def test_connections_per_origin_are_bounded_across_threads_and_the_pool_timeout_holds() -> None:
    async def slow(_: bytes, __: int) -> bytes:
        await asyncio.sleep(0.2)
        return _OK

    server = _Server(slow)
    with served(server) as url, client(url, transport=KeepAliveSyncTransport(max_connections=2)) as http:
        with ThreadPoolExecutor(6) as threads:
            answers = list(threads.map(lambda n: http.get(f"/{n}"), range(6)))
        assert [a.status_code for a in answers] == [200] * 6
        assert server.connections == 2
        with ThreadPoolExecutor(2) as threads:
            busy = [threads.submit(http.get, f"/busy{n}") for n in range(2)]
            time.sleep(0.05)
            with pytest.raises(httpx.PoolTimeout):
                http.get("/waits", timeout=httpx.Timeout(5.0, pool=0.05))
            assert [b.result().status_code for b in busy] == [200, 200]
        assert server.connections == 2


def test_a_malformed_answer_is_a_protocol_error() -> None:
    async def garbage(_: bytes, __: int) -> bytes:
        return b"NOT HTTP AT ALL\r\n\r\n"

    with served(_Server(garbage)) as url, client(url) as http, pytest.raises(httpx.RemoteProtocolError):
        http.get("/x")


def test_a_server_that_hangs_up_without_answering_is_a_read_error() -> None:
    async def hang_up(_: bytes, __: int) -> bytes | None:
        return None

    with served(_Server(hang_up)) as url, client(url) as http, pytest.raises(httpx.ReadError):
        http.get("/x")


def test_the_sdk_over_it_names_a_dead_url_and_retries_as_before() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    dead = Tenure(
        f"http://127.0.0.1:{port}", "tnr_x_y", max_retries=1, max_retry_wait_s=0.01, transport=KeepAliveSyncTransport()
    )
    with dead, pytest.raises(ConnectionFailed) as failed:
        dead.whoami()
    assert failed.value.url == f"http://127.0.0.1:{port}"
    assert isinstance(failed.value.__cause__, httpx.ConnectError)


def test_only_http_and_https_and_no_request_after_close() -> None:
    transport = KeepAliveSyncTransport()
    with httpx.Client(transport=transport) as http, pytest.raises(httpx.UnsupportedProtocol):
        http.get("ftp://127.0.0.1/x")
    with pytest.raises(TransportClosed, match="closed"):  # an httpx.TransportError, not a RuntimeError
        transport.handle_request(httpx.Request("GET", "http://127.0.0.1:1/"))
    with pytest.raises(ValueError, match="at least 1"):
        KeepAliveSyncTransport(max_connections=0)


def test_clients_sharing_a_transport_leave_it_open_for_each_other() -> None:
    """A transport handed to a client is the caller's: closing one client of two sharing it used
    to close it under the other (``RuntimeError: the transport is closed``)."""
    with served(_Server(_ok)) as url, KeepAliveSyncTransport() as shared:
        first = Tenure(url, "tnr_a_x", transport=shared)
        second = Tenure(url, "tnr_b_y", transport=shared)
        first.recall_json("q")
        first.close()
        assert second.recall_json("q") == {"ok": True}
        second.close()
    with Tenure(url, "tnr_a_x", max_retries=2, transport=shared) as late, pytest.raises(ConnectionFailed) as failed:
        late.recall_json("q")  # closed by its owner: the SDK's error, not retried
    assert isinstance(failed.value.__cause__, TransportClosed)


def test_tls_verifies_the_server_and_reuses_the_socket(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    served_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served_tls.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))
    server = _Server(_ok)
    with served(server, served_tls) as url:
        with client(url, transport=KeepAliveSyncTransport(ssl_context=trusting)) as http:
            assert http.get("/one").json() == {"ok": True}
            assert http.get("/two").json() == {"ok": True}
        assert server.connections == 1
        # the default context does not trust a self-signed certificate: no request is sent
        with client(url) as http, pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            http.get("/three")
        assert len(server.requests) == 2


def test_an_idle_socket_numbered_above_select_s_limit_is_still_reused() -> None:
    """A process with many open files (a worker with a thousand sockets) gets descriptors above
    1023, which ``select`` refuses: the idle check must not drop every such socket."""
    held = []
    try:
        while True:  # push this process's next descriptors past 1023
            held.append(socket.socket())
            if held[-1].fileno() > 1030:
                break
    except OSError:
        pytest.skip("this process may not open 1,030 descriptors")
    server = _Server(_ok)
    try:
        with served(server) as url, client(url) as http:
            for _ in range(3):
                assert http.get("/x").json() == {"ok": True}
    finally:
        for s in held:
            s.close()
    assert server.connections == 1
