"""The extraction queue's waiting markers, on a real Redis broker (no worker: messages stay)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from service import redis_keys
from service.config import CelerySettings, Settings
from service.extraction.queue import TASK_EXTRACT, TaskQueue, extraction_task_id


@pytest.fixture
def queue(redis_url: str) -> Iterator[TaskQueue]:
    settings = Settings(
        redis_url=redis_url,
        opensearch_namespace=f"q-{uuid.uuid4().hex[:8]}",
        celery=CelerySettings(queue_prefix=f"q-{uuid.uuid4().hex[:8]}"),
    )
    q = TaskQueue(settings)
    try:
        yield q
    finally:
        q.close()


def _queued_ids(queue: TaskQueue) -> list[str]:
    broker: redis.Redis[bytes] = redis.Redis.from_url(queue.settings.broker_url)
    try:
        envelopes = [json.loads(raw) for raw in broker.lrange(queue.heavy, 0, -1)]
    finally:
        broker.close()
    return [e["headers"]["id"] for e in envelopes if e["headers"]["task"] == TASK_EXTRACT]


def test_the_sweep_sends_a_turn_again_only_when_no_message_of_it_waits(queue: TaskQueue) -> None:
    queue.extract("t1", "turn-1")  # the API's send, after the turn is written
    task_id = extraction_task_id("t1", "turn-1")
    assert _queued_ids(queue) == [task_id]  # deterministic id, derived from tenant and turn
    assert queue.extract_unless_waiting("t1", "turn-1") is False  # still waiting: not sent again
    assert _queued_ids(queue) == [task_id]

    queue.taken("t1", "turn-1")  # a worker took it (and, say, died with it)
    assert queue.extract_unless_waiting("t1", "turn-1") is True
    assert queue.extract_unless_waiting("t1", "turn-1") is False
    assert _queued_ids(queue) == [task_id, task_id]

    assert queue.extract_unless_waiting("t1", "turn-2") is True  # never sent: sent now
    assert queue.extract_unless_waiting("t2", "turn-1") is True  # another tenant's turn of that id


def test_the_marker_expires_with_the_message_under_the_namespace(queue: TaskQueue) -> None:
    queue.extract("t1", "turn-9")
    marker = redis_keys.queued_task(queue.settings.opensearch_namespace, extraction_task_id("t1", "turn-9"))
    broker: redis.Redis[bytes] = redis.Redis.from_url(queue.settings.broker_url)
    try:
        ttl = broker.ttl(marker)
    finally:
        broker.close()
    assert 0 < ttl <= queue.settings.celery.task_expires_s


def test_a_marker_from_an_earlier_redis_run_does_not_hold_the_turn_back(queue: TaskQueue) -> None:
    # Redis killed and restarted from its AOF: the marker came back, the message written after it
    # did not. The marker names the server run that wrote it, so the sweep sends the turn again.
    task_id = extraction_task_id("t1", "turn-7")
    marker = redis_keys.queued_task(queue.settings.opensearch_namespace, task_id)
    broker: redis.Redis[bytes] = redis.Redis.from_url(queue.settings.broker_url)
    try:
        broker.set(marker, "run-before-the-restart", ex=queue.settings.celery.task_expires_s)
        assert queue.extract_unless_waiting("t1", "turn-7") is True
        assert _queued_ids(queue) == [task_id]
        assert queue.extract_unless_waiting("t1", "turn-7") is False  # now it really waits
        assert broker.get(marker) == str(broker.info("server")["run_id"]).encode()
    finally:
        broker.close()
    assert _queued_ids(queue) == [task_id]


def test_a_drained_queue_says_a_marker_left_set_is_a_lost_message(queue: TaskQueue) -> None:
    # the sweep trusts a waiting marker only while messages wait: a worker that popped the message
    # and was killed or wedged leaves the marker set and the queue empty
    assert queue.extraction_queue_drained() is True
    queue.extract("t1", "turn-3")
    assert queue.extraction_queue_drained() is False
    broker: redis.Redis[bytes] = redis.Redis.from_url(queue.settings.broker_url)
    try:
        assert broker.rpop(queue.heavy) is not None  # popped by a worker that then wedged
    finally:
        broker.close()
    assert queue.extraction_queue_drained() is True
    assert queue.extract_unless_waiting("t1", "turn-3") is False  # the marker alone would hold it back
