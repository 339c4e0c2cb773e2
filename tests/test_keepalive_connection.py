"""The event loop's OpenSearch connection (service/storage/keepalive.py): answers and errors as
opensearch-py's aiohttp connection gave them, and a socket is reused only when that is safe.

The answers come from the real node; the failures a node rarely shows on demand (an idle socket
closed by the node, an answer that never comes, ``Connection: close``, a chunked answer) from a
few lines of asyncio server on loopback that answer as HTTP/1.1 servers do."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from opensearchpy import AsyncOpenSearch
from opensearchpy.exceptions import ConnectionTimeout, NotFoundError

from service.config import Settings
from service.storage.client import build_async_client, close_async_client
from service.storage.keepalive import KeepAliveConnection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _connection(client: AsyncOpenSearch) -> KeepAliveConnection:
    connection = client.transport.connection_pool.connections[0]
    assert isinstance(connection, KeepAliveConnection)
    return connection


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    return head + (await reader.readexactly(length) if length else b"")


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


_OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


def test_answers_and_status_errors_from_the_node(settings: Settings) -> None:
    async def scenario() -> None:
        client = build_async_client(settings)
        try:
            health = await client.cluster.health()
            assert health["status"] in ("green", "yellow")
            with pytest.raises(NotFoundError):
                await client.get(index="tenure-keepalive-no-such-index", id="x")
            # the 404 answer was whole: the same socket serves the next request
            assert (await client.cluster.health())["status"] in ("green", "yellow")
            assert _connection(client).open_sockets == 1
            # a HEAD's answer has a length but no body: it must not wait for one
            assert await client.indices.exists(index="tenure-keepalive-no-such-index") is False
            assert await client.ping() is True
            # a request's own header replaces the default of that name, whatever its case (the
            # node refuses a request with two Content-Type headers)
            ndjson = '{"index":"tenure-*"}\n{"size":0}\n'
            for name in ("Content-Type", "content-type"):
                answer = await client.transport.perform_request(
                    "POST", "/_msearch", body=ndjson, headers={name: "application/x-ndjson"}
                )
                assert "hits" in answer["responses"][0]
            # many at once: at most pool_maxsize sockets, every answer its own request's
            counts = await asyncio.gather(*(client.count(index="tenure-*") for _ in range(50)))
            assert all("count" in c for c in counts)
            assert 1 <= _connection(client).open_sockets <= max(32, settings.api.thread_pool_size)
        finally:
            await close_async_client(client)
        assert _connection(client).open_sockets == 0

    _run(scenario())


def test_gzip_bodies_with_http_compress(settings: Settings) -> None:
    async def scenario() -> None:
        client = AsyncOpenSearch(
            hosts=[settings.opensearch_url], connection_class=KeepAliveConnection, http_compress=True
        )
        try:
            body = {"query": {"match_all": {}}, "size": 0}
            assert "hits" in await client.search(index="tenure-*", body=body)
        finally:
            await client.close()

    _run(scenario())


def test_a_socket_the_node_closed_while_idle_is_replaced_without_an_error() -> None:
    async def scenario() -> None:
        connections = 0

        async def answer_once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await _read_request(reader)
            writer.write(_OK)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.close()  # an idle keep-alive socket closed by the server

        server, url = await _serve(answer_once_then_close)
        client = AsyncOpenSearch(hosts=[url], connection_class=KeepAliveConnection, max_retries=0)
        try:
            assert await client.transport.perform_request("GET", "/") == {"ok": True}
            await asyncio.sleep(0.2)
            assert await client.transport.perform_request("GET", "/") == {"ok": True}
            assert connections == 2
            # closing, with connection_lost not yet run (a write to it would fail): not taken
            idle = _connection(client)._idle
            assert len(idle) == 1 and idle[0].transport is not None
            idle[0].transport.close()
            assert await client.transport.perform_request("GET", "/") == {"ok": True}
            assert connections == 3
        finally:
            await client.close()
            server.close()

    _run(scenario())


def test_connection_close_and_chunked_answers() -> None:
    async def scenario() -> None:
        connections = 0

        async def chunked_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await _read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
                b'connection: close\r\n\r\n6\r\n{"ok":\r\n5\r\n true\r\n1\r\n}\r\n0\r\n\r\n'
            )
            await writer.drain()
            writer.close()

        server, url = await _serve(chunked_then_close)
        client = AsyncOpenSearch(hosts=[url], connection_class=KeepAliveConnection, max_retries=0)
        try:
            for _ in range(3):
                assert await client.transport.perform_request("GET", "/") == {"ok": True}
            assert connections == 3  # `Connection: close`: never reused
            assert _connection(client).open_sockets == 0
        finally:
            await client.close()
            server.close()

    _run(scenario())


def test_an_answer_that_never_comes_times_out_and_its_socket_is_not_reused() -> None:
    async def scenario() -> None:
        requests = 0

        async def first_never_answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal requests
            while True:
                try:
                    await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                requests += 1
                if requests > 1:
                    writer.write(_OK)
                    await writer.drain()

        server, url = await _serve(first_never_answered)
        client = AsyncOpenSearch(hosts=[url], connection_class=KeepAliveConnection, max_retries=0)
        try:
            with pytest.raises(ConnectionTimeout):
                await client.transport.perform_request("GET", "/", timeout=0.3)
            # a late answer to the first request must never be read as the second's
            assert _connection(client).open_sockets == 0
            assert await client.transport.perform_request("GET", "/", timeout=5) == {"ok": True}
        finally:
            await client.close()
            server.close()

    _run(scenario())


def test_a_cancelled_request_closes_its_socket() -> None:
    async def scenario() -> None:
        async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()

        server, url = await _serve(never_answers)
        client = AsyncOpenSearch(hosts=[url], connection_class=KeepAliveConnection, max_retries=0)
        try:
            request = asyncio.ensure_future(client.transport.perform_request("GET", "/"))
            await asyncio.sleep(0.2)
            assert _connection(client).open_sockets == 1
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            assert _connection(client).open_sockets == 0
        finally:
            await client.close()
            server.close()

    _run(scenario())
