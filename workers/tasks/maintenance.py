"""Index maintenance on a beat schedule: merge the beliefs index's segments after bulk imports;
delete change-log documents no belief points at."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from service import redis_keys
from service.extraction.queue import TASK_MERGE_SEGMENTS, TASK_SWEEP_CHANGE_LOGS
from service.storage.change_logs import ChangeLogStore, SweepPace
from service.storage.operations import merge_if_fragmented
from service.storage.templates import BELIEFS
from workers import resources
from workers.celery_app import app
from workers.tasks.base import TenantTask

_settings = app.conf.tenure_settings


class _Maintenance(TenantTask):
    tenant_optional = True  # one index holds every tenant's beliefs


@app.task(  # type: ignore[untyped-decorator]
    base=_Maintenance,
    name=TASK_MERGE_SEGMENTS,
    soft_time_limit=_settings.celery.heavy_soft_time_limit_s,
    time_limit=_settings.celery.heavy_time_limit_s,
    max_retries=0,  # the next beat tick is the retry
)
def merge_segments() -> dict[str, Any] | None:
    """Beat: force-merge the beliefs index when it holds more segments per shard than the setting
    allows (a bulk import just ran); nothing otherwise. A merge that outlives the task's time limit
    still completes inside OpenSearch."""
    client = resources.get(_settings).client
    return merge_if_fragmented(
        client,
        BELIEFS.alias(_settings.opensearch_namespace),
        above=_settings.celery.merge_above_segments_per_shard,
    )


@app.task(  # type: ignore[untyped-decorator]
    base=_Maintenance,
    name=TASK_SWEEP_CHANGE_LOGS,
    soft_time_limit=_settings.celery.heavy_soft_time_limit_s,
    time_limit=_settings.celery.heavy_time_limit_s,
    max_retries=0,  # the next beat tick is the retry; deleting an orphan twice is a no-op
)
def sweep_change_logs(tenant_id: str | None = None) -> dict[str, Any]:
    """Beat: delete change-log documents older than ten minutes that their belief does not point
    at (a write that crashed between its log and its belief), paced and within a budget
    (``SweepPace``). A run over every tenant that stops at its budget keeps the last tenant it swept
    in Redis, and the next run resumes after it; a run for one tenant (an admin's) leaves that
    cursor alone. Returns what it did."""
    held = resources.get(_settings)
    cursor = redis_keys.change_log_sweep_cursor(_settings.opensearch_namespace)
    after = None if tenant_id is not None else _text(held.redis.get(cursor))
    pace = SweepPace(
        work_fraction=_settings.celery.change_log_sweep_work_fraction,
        budget_s=_settings.celery.change_log_sweep_budget_s,
    )
    done = ChangeLogStore(held.client, _settings.opensearch_namespace).sweep_orphans(
        tenant_id=tenant_id, pace=pace, resume_after=after
    )
    if tenant_id is None:
        if done.resume_after is None:
            held.redis.delete(cursor)
        else:
            held.redis.set(cursor, done.resume_after)
    return {**asdict(done), "resumed_after": after}


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()
