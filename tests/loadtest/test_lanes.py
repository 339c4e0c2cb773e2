"""The load clients' connections (loadtest.http.LaneTransport): one request per keep-alive
connection at a time, against a loopback HTTP/1.1 server that counts its connections."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from loadtest.http import LaneTransport, make_client


class Server:
    """Answers every request with 200 and a small JSON body after ``delay_s``; counts connections
    and the most requests it had in progress at once."""

    def __init__(self, delay_s: float = 0.0, *, hang_up_first: bool = False):
        self.delay_s = delay_s
        self.hang_up_first = hang_up_first
        self.connections = 0
        self.busy = 0
        self.most_busy = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = self.connections == 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                if first and self.hang_up_first:
                    return  # the first connection dies without an answer
                self.busy += 1
                self.most_busy = max(self.most_busy, self.busy)
                await asyncio.sleep(self.delay_s)
                self.busy -= 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n")
                writer.write(b'{"ok":true}')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_more_requests_than_lanes_all_answer_over_at_most_that_many_connections() -> None:
    async def scenario() -> None:
        async with Server(delay_s=0.01) as server, make_client(5.0, 4) as http:
            answers = await asyncio.gather(*(http.get(f"{server.url}/x") for _ in range(40)))
            assert [a.json() for a in answers] == [{"ok": True}] * 40
            assert server.connections == 4  # kept alive and reused, never more than the lanes
            assert server.most_busy == 4
            transport = http._transport
            assert isinstance(transport, LaneTransport) and transport.free == 4

    _run(scenario)


def test_a_streamed_answer_holds_its_lane_until_closed_and_waiters_time_out() -> None:
    async def scenario() -> None:
        async with Server() as server, make_client(5.0, 1) as http:
            transport = http._transport
            assert isinstance(transport, LaneTransport)
            async with http.stream("GET", f"{server.url}/x") as streamed:
                assert transport.free == 0
                short = httpx.Timeout(5.0, pool=0.05)
                with pytest.raises(httpx.PoolTimeout):
                    await http.get(f"{server.url}/y", timeout=short)
                await streamed.aread()
            assert transport.free == 1  # closed: given back once, the timed-out wait took nothing
            assert (await http.get(f"{server.url}/z")).json() == {"ok": True}
            assert transport.free == 1

    _run(scenario)


def test_a_cancelled_wait_and_a_failed_request_give_no_lane_away() -> None:
    async def scenario() -> None:
        async with Server(delay_s=0.05, hang_up_first=True) as server, make_client(5.0, 1) as http:
            transport = http._transport
            assert isinstance(transport, LaneTransport)
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(f"{server.url}/dies")  # the server hangs up without an answer
            assert transport.free == 1
            holder = asyncio.create_task(http.get(f"{server.url}/slow"))
            await asyncio.sleep(0.01)
            waiter = asyncio.create_task(http.get(f"{server.url}/waits"))
            await asyncio.sleep(0.01)
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            assert (await holder).json() == {"ok": True}
            assert transport.free == 1
            assert (await http.get(f"{server.url}/again")).json() == {"ok": True}

    _run(scenario)


def test_each_origin_keeps_its_own_connections() -> None:
    # a load test against several API servers sends to them in turn: no reconnect per request
    async def scenario() -> None:
        async with Server() as first, Server() as second, make_client(5.0, 2) as http:
            for _ in range(5):
                assert (await http.get(f"{first.url}/x")).json() == {"ok": True}
                assert (await http.get(f"{second.url}/x")).json() == {"ok": True}
            assert (first.connections, second.connections) == (1, 1)
            transport = http._transport
            assert isinstance(transport, LaneTransport) and transport.free == 4

    _run(scenario)


def test_a_lane_transport_needs_a_lane() -> None:
    with pytest.raises(ValueError, match="at least one lane"):
        LaneTransport(0)
