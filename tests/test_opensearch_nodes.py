"""Several OpenSearch nodes in ``TENURE_OPENSEARCH_URL``: a node that does not answer costs no
request (the client retries on the next node) and is counted per node in
``tenure_opensearch_node_failures_total``, so an operator sees a lost node in the metrics even
though no caller saw an error (docs/operations.md "Past one machine")."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from deploy.devstack import free_port
from service.config import Settings
from service.storage.client import build_async_client, build_client


def _failures(node: str) -> float:
    return REGISTRY.get_sample_value("tenure_opensearch_node_failures_total", {"node": node}) or 0.0


def test_a_dead_node_is_retried_elsewhere_and_counted(settings: Settings, opensearch_url: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = build_client(settings.model_copy(update={"opensearch_url": f"{dead},{opensearch_url}"}))
    live_before = _failures(opensearch_url)
    before = _failures(dead)
    # requests rotate over both nodes: within a few, one goes to the dead node first
    answers = [client.cluster.health()["status"] for _ in range(4)]
    assert all(status in ("green", "yellow") for status in answers), answers
    assert _failures(dead) - before >= 1
    assert _failures(opensearch_url) == live_before  # the node that answered is not blamed


def test_the_event_loop_client_counts_a_dead_node_too(settings: Settings, opensearch_url: str) -> None:
    """Recall in the API goes through the asynchronous client: the same count."""
    dead = f"http://127.0.0.1:{free_port()}"

    async def four_health_reads() -> list[str]:
        client = build_async_client(settings.model_copy(update={"opensearch_url": f"{dead},{opensearch_url}"}))
        try:
            return [(await client.cluster.health())["status"] for _ in range(4)]
        finally:
            await client.close()
            # the transport closes only the live connections; the resting one's session too
            for connection in client.transport.connection_pool.orig_connections:
                await connection.close()

    before = _failures(dead)
    answers = asyncio.run(four_health_reads())
    assert all(status in ("green", "yellow") for status in answers), answers
    assert _failures(dead) - before >= 1
