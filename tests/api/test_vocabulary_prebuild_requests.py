"""A belief write through the API asks a worker to prebuild the tenant's recall vocabulary
(service/extraction/queue.py, ``TaskQueue.prebuild_vocabularies``): one message per tenant while
one waits, whatever the number of writes, and a broker that does not answer never fails a write.
(What the worker then does: tests/memory_loop/test_vocabulary_prebuild.py.)"""

from __future__ import annotations

import base64
import json
import time

from fastapi.testclient import TestClient

from deploy.devstack import free_port
from service.api.state import Services
from service.config import Settings
from service.extraction.queue import TASK_PREBUILD_VOCABULARY, TaskQueue, queue_names
from tests.api.conftest import Team, belief_body, ok


def _prebuilds_waiting(services: Services, tenant: str) -> int:
    """Messages of ``vocabulary.prebuild`` for ``tenant`` in the API's cheap queue."""
    cheap, _ = queue_names(services.settings)
    count = 0
    for raw in services.redis.lrange(cheap, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] != TASK_PREBUILD_VOCABULARY:
            continue
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        count += args == [tenant]
    return count


def test_a_burst_of_writes_asks_for_one_prebuild_per_tenant(
    client: TestClient, services: Services, team: Team, other_team: Team
) -> None:
    for n in range(3):
        ok(client.post("/v1/beliefs", json=belief_body(f"release_train_{n}"), headers=team.h("alice")), 201)
    ok(client.post("/v1/beliefs", json=belief_body("release_train"), headers=other_team.h("alice")), 201)
    assert _prebuilds_waiting(services, team.tenant) == 1
    assert _prebuilds_waiting(services, other_team.tenant) == 1
    # a worker took it: the next write asks again
    services.loop.queue.prebuild_taken(team.tenant)
    ok(client.post("/v1/beliefs", json=belief_body("release_train_9"), headers=team.h("alice")), 201)
    assert _prebuilds_waiting(services, team.tenant) == 2


def test_a_broker_that_does_not_answer_loses_the_prebuild_not_the_write(settings: Settings) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    queue = TaskQueue(settings.model_copy(update={"celery_broker_url": nowhere}))
    try:
        started = time.monotonic()
        queue.prebuild_vocabularies(["t-a", "t-b"])  # logged, not raised
        assert time.monotonic() - started < 30
    finally:
        queue.close()
