"""Several OpenSearch nodes in ``TENURE_OPENSEARCH_URL``: a node that does not answer costs no
request (the client retries on the next node) and is counted per node in
``tenure_opensearch_node_failures_total``, so an operator sees a lost node in the metrics even
though no caller saw an error (docs/operations.md "Past one machine")."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from deploy.devstack import free_port
from service.config import Settings
from service.storage.client import build_async_client, build_client, close_async_client, close_client


def _failures(node: str) -> float:
    return REGISTRY.get_sample_value("tenure_opensearch_node_failures_total", {"node": node}) or 0.0


def _timed(node: str) -> float:
    """Requests to ``node`` in the per-node latency histogram (answered or not)."""
    return REGISTRY.get_sample_value("tenure_opensearch_node_request_duration_seconds_count", {"node": node}) or 0.0


def test_a_dead_node_is_retried_elsewhere_and_counted(settings: Settings, opensearch_url: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = build_client(settings.model_copy(update={"opensearch_url": f"{dead},{opensearch_url}"}))
    live_before, live_timed = _failures(opensearch_url), _timed(opensearch_url)
    before, dead_timed = _failures(dead), _timed(dead)
    # requests rotate over both nodes: within a few, one goes to the dead node first
    answers = [client.cluster.health()["status"] for _ in range(4)]
    assert all(status in ("green", "yellow") for status in answers), answers
    failed = _failures(dead) - before
    assert failed >= 1
    assert _failures(opensearch_url) == live_before  # the node that answered is not blamed
    # every attempt is timed against its node: the four answers, and the dead node's refusals
    assert _timed(opensearch_url) - live_timed == 4
    assert _timed(dead) - dead_timed == failed
    close_client(client)


def test_the_event_loop_client_counts_a_dead_node_too(settings: Settings, opensearch_url: str) -> None:
    """Recall in the API goes through the asynchronous client: the same count."""
    dead = f"http://127.0.0.1:{free_port()}"

    open_sockets: list[int] = []

    async def four_health_reads() -> list[str]:
        client = build_async_client(settings.model_copy(update={"opensearch_url": f"{dead},{opensearch_url}"}))
        try:
            return [(await client.cluster.health())["status"] for _ in range(4)]
        finally:
            await close_async_client(client)
            open_sockets.extend(c.open_sockets for c in client.transport.connection_pool.orig_connections)

    before = _failures(dead)
    answers = asyncio.run(four_health_reads())
    assert all(status in ("green", "yellow") for status in answers), answers
    assert _failures(dead) - before >= 1
    # the resting node's sockets are closed too (opensearch-py's close() skips it; with aiohttp
    # the API logged "Unclosed client session" at shutdown after a node loss)
    assert open_sockets == [0, 0]


def test_closing_the_client_closes_the_resting_node_too(settings: Settings, opensearch_url: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    client = build_client(settings.model_copy(update={"opensearch_url": f"{dead},{opensearch_url}"}))
    for _ in range(4):  # within a few requests the dead node fails once and rests
        client.cluster.health()
    pool = client.transport.connection_pool
    assert len(pool.connections) == 1  # the dead node rests: opensearch-py's close() would skip it
    close_client(client)
    assert [c.pool for c in pool.orig_connections] == [None, None]


class _Blackholed:
    """A node that never answers a connect, like a lost machine (no TCP reset, unlike a killed
    process): a listening socket whose accept queue is full, so the kernel drops new SYNs."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(0)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.fillers = []
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(self.server.getsockname())
            self.fillers.append(filler)
        time.sleep(0.2)

    def close(self) -> None:
        for sock in [*self.fillers, self.server]:
            sock.close()


@pytest.fixture
def blackholed() -> Iterator[_Blackholed]:
    node = _Blackholed()
    yield node
    node.close()


def _slowest_health_read(client: Any) -> float:
    slowest = 0.0
    for _ in range(3):  # the first or second request goes to the blackholed node
        started = time.monotonic()
        assert client.cluster.health()["status"] in ("green", "yellow")
        slowest = max(slowest, time.monotonic() - started)
    return slowest


def test_a_node_that_never_answers_the_connect_costs_the_connect_timeout(
    settings: Settings, opensearch_url: str, blackholed: _Blackholed
) -> None:
    """Before: the synchronous client waited the whole 10 s request timeout on the connect."""
    bounded = settings.model_copy(
        update={"opensearch_url": f"{blackholed.url},{opensearch_url}", "opensearch_connect_timeout_s": 0.5}
    )
    before = _failures(blackholed.url)
    client = build_client(bounded)
    try:
        assert _slowest_health_read(client) < 5.0  # 0.5 s connect + one answered request; not 10 s
    finally:
        close_client(client)
    assert _failures(blackholed.url) - before == 1  # then it rests: one failure, not one per request


def test_the_event_loop_client_fails_over_from_a_node_that_never_answers_the_connect(
    settings: Settings, opensearch_url: str, blackholed: _Blackholed
) -> None:
    """Before: the asynchronous client (recall) raised ConnectionTimeout after 10 s (a 503 to the
    caller) and, not retrying timeouts, never rested the node: every third recall failed so."""
    bounded = settings.model_copy(
        update={"opensearch_url": f"{blackholed.url},{opensearch_url}", "opensearch_connect_timeout_s": 0.5}
    )
    before = _failures(blackholed.url)

    async def slowest() -> float:
        client = build_async_client(bounded)
        try:
            worst = 0.0
            for _ in range(3):
                started = time.monotonic()
                assert (await client.cluster.health())["status"] in ("green", "yellow")
                worst = max(worst, time.monotonic() - started)
            return worst
        finally:
            await close_async_client(client)

    assert asyncio.run(slowest()) < 5.0
    assert _failures(blackholed.url) - before == 1
