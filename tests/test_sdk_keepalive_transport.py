"""The SDK's opt-in keep-alive transport (clients/python/tenure_client/keepalive.py): answers as
httpx's own transport gives them, httpx's exceptions for every failure, and a socket reused only
when that is safe.

The answers of the real service are in tests/api/test_sdk.py; the failures a server rarely shows
on demand (a slow answer, ``Connection: close``, a chunked answer, an idle socket closed by the
server) come from a few lines of asyncio server on loopback that answer as HTTP/1.1 servers do."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tenure_client import AsyncTenure, ConnectionFailed
from tenure_client.keepalive import KeepAliveTransport, TransportClosed

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

_OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
_LATE = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n{"late":1}'


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    return head + (await reader.readexactly(length) if length else b"")


class _Server:
    """An asyncio server on loopback that counts its connections and keeps what it was sent."""

    def __init__(self, answer: Callable[[bytes, int], Awaitable[bytes | None]]):
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                request = await _read_request(reader)
                self.requests.append(request)
                answer = await self.answer(request, len(self.requests))
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if b"connection: close" in answer.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


class HangsUpWhenIdle(_Server):
    """Answers one request per connection with keep-alive, then closes it soon after, as uvicorn
    does after its keep-alive timeout."""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.requests.append(await _read_request(reader))
        writer.write(_OK)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()


async def _ok(_: bytes, __: int) -> bytes:
    return _OK


async def _late_first(_: bytes, n: int) -> bytes:
    """The first answer comes late and differs from the others (read as a later request's answer,
    it would show)."""
    if n == 1:
        await asyncio.sleep(0.5)
        return _LATE
    return _OK


def assert_sent_as_httpx_built(server: _Server) -> None:
    """Five ``POST /v1/recall`` then one ``GET /v1/beliefs`` arrived over one socket, each as
    httpx built it (headers, the JSON body and its length; a GET without a body states none)."""
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/recall HTTP/1.1\r\n")
    assert b"\r\nx-trace: t\r\n" in first.lower() and b"\r\nhost: 127.0.0.1:" in first.lower()
    assert first.endswith(b'{"query":"q0"}') and b"content-length: 14\r\n" in first.lower()
    assert server.requests[-1].startswith(b"GET /v1/beliefs?scope=project%3Apay&q=a+b HTTP/1.1\r\n")
    assert b"content-length" not in server.requests[-1].lower()


def test_sequential_requests_share_one_socket_and_send_what_httpx_built() -> None:
    async def scenario() -> None:
        server = _Server(_ok)
        async with server as url, httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            for n in range(5):
                answer = await http.post("/v1/recall", json={"query": f"q{n}"}, headers={"X-Trace": "t"})
                assert answer.status_code == 200 and answer.json() == {"ok": True}
                assert answer.http_version == "HTTP/1.1"
            got = await http.get("/v1/beliefs", params={"scope": "project:pay", "q": "a b"})
            assert got.json() == {"ok": True}
        assert_sent_as_httpx_built(server)

    _run(scenario())


def test_a_chunked_answer_and_a_closing_one() -> None:
    chunked = b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n'
    closing = b"HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"

    async def answer(_: bytes, n: int) -> bytes:
        return chunked if n == 1 else closing

    async def scenario() -> None:
        server = _Server(answer)
        async with server as url, httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            assert (await http.get("/a")).json() == {"a": 1}
            closed = await http.post("/b", content=b"x")
            assert closed.status_code == 201 and closed.json() == {}
            assert (await http.get("/c")).status_code == 201  # a new socket after the close
        assert server.connections == 2

    _run(scenario())


def test_a_socket_the_server_closed_while_idle_is_not_used() -> None:
    async def scenario() -> None:
        server = HangsUpWhenIdle(_ok)
        async with server as url, httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            assert (await http.get("/one")).status_code == 200
            await asyncio.sleep(0.2)  # the close has arrived: the idle socket is known dead
            assert (await http.get("/two")).status_code == 200
        assert server.connections == 2

    _run(scenario())


def test_idle_sockets_expire_before_the_server_would_close_them() -> None:
    async def scenario() -> None:
        server = _Server(_ok)
        transport = KeepAliveTransport(keepalive_expiry=0.2)
        async with server as url, httpx.AsyncClient(base_url=url, transport=transport) as http:
            await http.get("/one")
            await http.get("/two")
            await asyncio.sleep(0.3)
            await http.get("/three")
        assert server.connections == 2

    _run(scenario())


def test_a_slow_answer_is_a_read_timeout_and_its_socket_is_not_reused() -> None:
    async def scenario() -> None:
        server = _Server(_late_first)
        timeout = httpx.Timeout(5.0, read=0.2)
        async with (
            server as url,
            httpx.AsyncClient(base_url=url, transport=KeepAliveTransport(), timeout=timeout) as http,
        ):
            with pytest.raises(httpx.ReadTimeout):
                await http.get("/slow")
            # the late answer to /slow must never be read as the answer to the next request
            assert (await http.get("/next")).json() == {"ok": True}
        assert server.connections == 2

    _run(scenario())


def test_a_cancelled_request_closes_its_socket() -> None:
    async def scenario() -> None:
        server = _Server(_late_first)
        async with server as url, httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            task = asyncio.create_task(http.get("/slow"))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await http.get("/next")).json() == {"ok": True}
        assert server.connections == 2

    _run(scenario())


def test_connections_per_origin_are_bounded_and_the_pool_timeout_holds() -> None:
    async def slow(_: bytes, __: int) -> bytes:
        await asyncio.sleep(0.2)
        return _OK

    async def scenario() -> None:
        server = _Server(slow)
        transport = KeepAliveTransport(max_connections=2)
        async with server as url, httpx.AsyncClient(base_url=url, transport=transport) as http:
            answers = await asyncio.gather(*(http.get(f"/{n}") for n in range(6)))
            assert [a.status_code for a in answers] == [200] * 6
            assert server.connections == 2
            short = httpx.Timeout(5.0, pool=0.05)
            busy = [asyncio.create_task(http.get(f"/busy{n}")) for n in range(2)]
            await asyncio.sleep(0.05)
            with pytest.raises(httpx.PoolTimeout):
                await http.get("/waits", timeout=short)
            await asyncio.gather(*busy)

    _run(scenario())


def test_a_malformed_answer_is_a_protocol_error() -> None:
    async def garbage(_: bytes, __: int) -> bytes:
        return b"NOT HTTP AT ALL\r\n\r\n"

    async def scenario() -> None:
        async with _Server(garbage) as url, httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get("/x")

    _run(scenario())


def test_a_server_that_hangs_up_without_answering_is_a_read_error() -> None:
    async def hang_up(_: bytes, __: int) -> bytes | None:
        return None

    async def scenario() -> None:
        async with _Server(hang_up) as url, httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
            with pytest.raises(httpx.ReadError):
                await http.get("/x")

    _run(scenario())


def test_the_sdk_over_it_names_a_dead_url_and_retries_as_before() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there

    async def scenario() -> None:
        dead = AsyncTenure(
            f"http://127.0.0.1:{port}", "tnr_x_y", max_retries=1, max_retry_wait_s=0.01, transport=KeepAliveTransport()
        )
        async with dead:
            with pytest.raises(ConnectionFailed) as failed:
                await dead.whoami()
        assert failed.value.url == f"http://127.0.0.1:{port}"
        assert isinstance(failed.value.__cause__, httpx.ConnectError)

    _run(scenario())


def test_clients_sharing_a_transport_leave_it_open_for_each_other() -> None:
    """A transport handed to a client is the caller's: closing one client of two sharing it used
    to close it under the other."""

    async def scenario() -> Any:
        async with _Server(_ok) as url, KeepAliveTransport() as shared:
            first = AsyncTenure(url, "tnr_a_x", transport=shared)
            second = AsyncTenure(url, "tnr_b_y", transport=shared)
            await first.recall_json("q")
            await first.aclose()
            answer = await second.recall_json("q")
            await second.aclose()
        async with AsyncTenure(url, "tnr_a_x", transport=shared) as late:
            with pytest.raises(ConnectionFailed) as failed:
                await late.recall_json("q")
        assert isinstance(failed.value.__cause__, TransportClosed)
        return answer

    assert _run(scenario()) == {"ok": True}


def test_only_http_and_https() -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(transport=KeepAliveTransport()) as http:
            with pytest.raises(httpx.UnsupportedProtocol):
                await http.get("ftp://127.0.0.1/x")

    _run(scenario())
    with pytest.raises(ValueError, match="at least 1"):
        KeepAliveTransport(max_connections=0)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by itself."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key_file


def test_tls_verifies_the_server_and_reuses_the_socket(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        server = _Server(_ok)
        server.server = await asyncio.start_server(server._handle, "127.0.0.1", 0, ssl=served)
        url = f"https://127.0.0.1:{server.server.sockets[0].getsockname()[1]}"
        try:
            transport = KeepAliveTransport(ssl_context=trusting)
            async with httpx.AsyncClient(base_url=url, transport=transport) as http:
                assert (await http.get("/one")).json() == {"ok": True}
                assert (await http.get("/two")).json() == {"ok": True}
            assert server.connections == 1
            # the default context does not trust a self-signed certificate: no request is sent
            async with httpx.AsyncClient(base_url=url, transport=KeepAliveTransport()) as http:
                with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
                    await http.get("/three")
            assert len(server.requests) == 2
        finally:
            server.server.close()

    _run(scenario())
