"""CPU per request of an httpx client with N requests in flight: one httpx pool, one httpx2 pool
(the maintained fork whose pool assigns requests in one pass: pydantic/httpx2#974 and #1075) and
:class:`~loadtest.http.LaneTransport`.

A loopback HTTP/1.1 server answers each request after ``--answer-ms`` (a slow upstream, as the
proxy's model calls are); N workers send ``--requests`` requests each, once to open the
connections and once timed. The CPU is this process's (client and the small server together, the
same server for both clients), per request. The pool is configured like the proxy's upstream
client (``service/proxy/upstream.py``: 200 connections, 50 kept alive).

    python -m benchmarks.httpx_pool_cost --in-flight 10,50,100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

import httpx
import httpx2

from loadtest.http import LaneTransport


async def _answer_slowly(delay_s: float, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        while await reader.readuntil(b"\r\n\r\n"):
            await asyncio.sleep(delay_s)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
    writer.close()


KINDS = ("pool", "httpx2", "lanes")


def _client(kind: str) -> httpx.AsyncClient | httpx2.AsyncClient:
    if kind == "pool":
        return httpx.AsyncClient(limits=httpx.Limits(max_connections=200, max_keepalive_connections=50))
    if kind == "httpx2":
        return httpx2.AsyncClient(limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50))
    return httpx.AsyncClient(transport=LaneTransport(200))


async def cpu_per_request_ms(kind: str, in_flight: int, requests: int, answer_s: float) -> float:
    server = await asyncio.start_server(lambda r, w: _answer_slowly(answer_s, r, w), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    async with _client(kind) as http:

        async def worker() -> None:
            for _ in range(requests):
                (await http.get(url)).raise_for_status()

        await asyncio.gather(*(worker() for _ in range(in_flight)))  # the connections open
        t0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        cpu_s = time.process_time() - t0
    server.close()
    return cpu_s * 1000 / (in_flight * requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--in-flight", default="10,50,100,150")
    parser.add_argument("--requests", type=int, default=10, help="per worker, per pass")
    parser.add_argument("--answer-ms", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print("| in flight | round | httpx pool (200, 50 kept alive) | httpx2 pool (the same limits) | LaneTransport |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.in_flight.split(",")):
        for r in range(args.rounds):
            kinds = KINDS if r % 2 == 0 else KINDS[::-1]  # alternating order: no kind always first
            ms = {k: asyncio.run(cpu_per_request_ms(k, n, args.requests, args.answer_ms / 1000)) for k in kinds}
            print(f"| {n} | {r + 1} | " + " | ".join(f"{ms[k]:.2f} ms" for k in KINDS) + " |", flush=True)


if __name__ == "__main__":
    main()
