"""The change-log orphan sweep as beat runs it, on a real Celery worker: a pass that stopped at its
budget left the last tenant it swept in Redis, and the next run resumes after it and clears it once
the pass reaches the end; orphans before the cursor wait for the pass after."""

from __future__ import annotations

import uuid

import redis
from opensearchpy import OpenSearch

from service import redis_keys
from service.config import Settings
from service.extraction.queue import TASK_SWEEP_CHANGE_LOGS, TaskQueue
from service.storage.beliefs import BeliefStore
from tests.factories import old_orphan_logs
from tests.memory_loop.conftest import WorkerProcess, wait_until

AFTER_EVERY_TENANT = "\U0010ffff"


def test_the_sweep_resumes_after_its_cursor_and_clears_it_at_the_end(
    worker: WorkerProcess, loop_settings: Settings, os_client: OpenSearch
) -> None:
    store = BeliefStore(os_client, loop_settings.opensearch_namespace)
    tenant = f"t-sweep-{uuid.uuid4().hex[:8]}"
    (orphan,) = old_orphan_logs(os_client, store, [tenant], per_tenant=1)
    broker: redis.Redis[bytes] = redis.Redis.from_url(loop_settings.redis_url)
    cursor = redis_keys.change_log_sweep_cursor(loop_settings.opensearch_namespace)
    queue = TaskQueue(loop_settings)

    def orphan_left() -> bool:
        return bool(os_client.exists(index=store.logs.alias, id=orphan, routing=tenant))

    # the previous pass stopped after the last tenant there is: this run has nothing left to sweep
    broker.set(cursor, AFTER_EVERY_TENANT)
    queue._send(TASK_SWEEP_CHANGE_LOGS, [], queue.heavy)
    wait_until(lambda: broker.get(cursor) is None, timeout=60)
    assert orphan_left()
    # the next pass starts from the first tenant
    queue._send(TASK_SWEEP_CHANGE_LOGS, [], queue.heavy)
    wait_until(lambda: not orphan_left(), timeout=60)
    assert broker.get(cursor) is None
