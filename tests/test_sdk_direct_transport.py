"""The SDK hands a call straight to its own keep-alive transport when it created the client over
it (``Tenure._request``, ``AsyncTenure._request``): the server must receive the very bytes the
``httpx`` client would have sent, failures must be the same errors and retries, and a client the
caller passed in must always be used as it is (its event hooks run).

The servers are the loopback ones of tests/test_sdk_keepalive_transport.py."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from tenure_client import AsyncTenure, ConnectionFailed, RateLimited, Tenure
from tenure_client import _calls as calls
from tenure_client.keepalive import KeepAliveSyncTransport, KeepAliveTransport

from tests.test_sdk_keepalive_sync_transport import served
from tests.test_sdk_keepalive_transport import _OK, _run, _Server

KEY = "tnr_k_secret"
_LIMITED = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 0\r\ncontent-length: 63\r\n\r\n"
    b'{"error":{"code":"rate_limited","message":"slow down","x":"y"}}'
)


def _calls_made() -> list[calls.Call[object]]:
    """A recall (JSON body), a listing with repeated query parameters, a delete (no body)."""
    return [
        calls.as_json(calls.recall("kafka setup", ["domain:code", "project:pay"], "s-1", None, False)),
        calls.Call("GET", "/v1/beliefs", calls.raw, params={"scope": ["project:pay", "domain:code"], "q": "a b"}),
        calls.Call("DELETE", "/v1/beliefs/b%2F1", calls.raw),
    ]


async def _ok(_: bytes, __: int) -> bytes:
    return _OK


def test_direct_calls_send_the_bytes_the_httpx_client_sends() -> None:
    direct_server, client_server = _Server(_ok), _Server(_ok)
    with served(direct_server) as direct_url, served(client_server) as client_url:
        direct = Tenure(direct_url, KEY, transport=KeepAliveSyncTransport())
        assert direct._direct is not None
        through = Tenure(
            client_url, KEY, http_client=httpx.Client(base_url=client_url, transport=KeepAliveSyncTransport())
        )
        assert through._direct is None
        with direct, through:
            for call in _calls_made():
                assert direct.send(call) == through.send(call) == {"ok": True}
        through.http.close()
    # the same requests, byte for byte, but for the port in the Host header
    sent = [r.replace(direct_url.rsplit(":", 1)[1].encode(), b"PORT") for r in direct_server.requests]
    expected = [r.replace(client_url.rsplit(":", 1)[1].encode(), b"PORT") for r in client_server.requests]
    assert sent == expected and len(sent) == 3
    assert b"authorization: bearer tnr_k_secret" in sent[0].lower() and b'"session_id":"s-1"' in sent[0]
    assert direct_server.connections == 1  # one kept-alive socket for all three


def test_async_direct_calls_send_the_bytes_the_httpx_client_sends() -> None:
    direct_server, client_server = _Server(_ok), _Server(_ok)

    async def scenario() -> None:
        async with direct_server as direct_url, client_server as client_url:
            async with (
                AsyncTenure(direct_url, KEY, transport=KeepAliveTransport()) as direct,
                httpx.AsyncClient(base_url=client_url, transport=KeepAliveTransport()) as http,
            ):
                through = AsyncTenure(client_url, KEY, http_client=http)
                assert direct._direct is not None and through._direct is None
                for call in _calls_made():
                    assert await direct.send(call) == await through.send(call) == {"ok": True}
            port_a, port_b = direct_url.rsplit(":", 1)[1].encode(), client_url.rsplit(":", 1)[1].encode()
            assert [r.replace(port_a, b"PORT") for r in direct_server.requests] == [
                r.replace(port_b, b"PORT") for r in client_server.requests
            ]

    _run(scenario())
    assert len(direct_server.requests) == 3 and direct_server.connections == 1


def test_a_direct_call_is_retried_after_a_429_and_names_the_error() -> None:
    async def limited_then_ok(_: bytes, n: int) -> bytes:
        return _LIMITED if n == 1 else _OK

    async def always_limited(_: bytes, __: int) -> bytes:
        return _LIMITED

    recall = calls.as_json(calls.recall("q", [], None, None, False))
    server = _Server(limited_then_ok)
    with served(server) as url, Tenure(url, KEY, max_retries=2, transport=KeepAliveSyncTransport()) as tenure:
        assert tenure.send(recall) == {"ok": True}
    assert len(server.requests) == 2 and server.connections == 1  # the 429's socket was reused

    server = _Server(always_limited)
    with (
        served(server) as url,
        Tenure(url, KEY, max_retries=1, transport=KeepAliveSyncTransport()) as tenure,
        pytest.raises(RateLimited) as limited,
    ):
        tenure.send(recall)
    assert limited.value.code == "rate_limited" and limited.value.status == 429
    assert len(server.requests) == 2


def test_a_dead_url_is_a_connection_failure_with_httpx_s_cause_both_ways() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    with (
        Tenure(url, KEY, max_retries=0, transport=KeepAliveSyncTransport()) as dead,
        pytest.raises(ConnectionFailed) as failed,
    ):
        dead.whoami()
    assert failed.value.url == url and isinstance(failed.value.__cause__, httpx.ConnectError)

    async def scenario() -> None:
        async with AsyncTenure(url, KEY, max_retries=0, transport=KeepAliveTransport()) as dead:
            with pytest.raises(ConnectionFailed) as failed:
                await dead.whoami()
        assert isinstance(failed.value.__cause__, httpx.ConnectError)

    _run(scenario())


def test_a_slow_answer_is_a_read_timeout_on_the_direct_path() -> None:
    async def slow(_: bytes, __: int) -> bytes:
        await asyncio.sleep(1.0)
        return _OK

    server = _Server(slow)
    with (
        served(server) as url,
        Tenure(url, KEY, timeout=0.2, max_retries=0, transport=KeepAliveSyncTransport()) as tenure,
        pytest.raises(ConnectionFailed) as failed,
    ):
        tenure.send(calls.as_json(calls.recall("q", [], None, None, False)))
    assert isinstance(failed.value.__cause__, httpx.ReadTimeout)


def test_a_client_passed_in_is_used_as_it_is() -> None:
    seen: list[str] = []
    server = _Server(_ok)
    with served(server) as url:
        http = httpx.Client(
            base_url=url,
            transport=KeepAliveSyncTransport(),
            event_hooks={"request": [lambda request: seen.append(request.url.path)]},
            headers={"X-Team": "pay"},
        )
        with http, Tenure(url, KEY, http_client=http) as tenure:
            assert tenure.send(_calls_made()[0]) == {"ok": True}
    assert seen == ["/v1/recall"]
    assert b"x-team: pay" in server.requests[0].lower()
