"""Compaction tasks: the planner (beat, or the admin trigger for one tenant) fans out one task
per bucket; each bucket task takes the bucket key (ids and the tenant, never objects)."""

from __future__ import annotations

from typing import Any

from service.extraction.queue import TASK_COMPACT_BUCKET, TASK_PLAN_COMPACTION
from service.storage.lookup import BucketKey
from workers import resources
from workers.celery_app import app
from workers.tasks.base import TenantTask

_limits = app.conf.tenure_settings.celery


def _res() -> resources.Resources:
    return resources.get(app.conf.tenure_settings)


class _Planner(TenantTask):
    tenant_optional = True  # the beat plans every tenant; the admin trigger passes its own


@app.task(  # type: ignore[untyped-decorator]
    base=_Planner,
    name=TASK_PLAN_COMPACTION,
    soft_time_limit=_limits.cheap_soft_time_limit_s,
    time_limit=_limits.cheap_time_limit_s,
)
def plan_compaction(tenant_id: str | None, force: bool = False) -> int:
    """Find buckets over their thresholds (and out of cooldown) and enqueue one task each."""
    res = _res()
    buckets = res.compactor.plan(tenant_id=tenant_id, force=force)
    for b in buckets:
        res.queue.compact_bucket(b.tenant_id, b.owner_id, b.scope, b.type, b.subtype, force)
    return len(buckets)


@app.task(  # type: ignore[untyped-decorator]
    base=TenantTask,
    name=TASK_COMPACT_BUCKET,
    soft_time_limit=_limits.heavy_soft_time_limit_s,
    time_limit=_limits.heavy_time_limit_s,
)
def compact_bucket(
    tenant_id: str, owner_id: str, scope: str, type_: str, subtype: str | None, force: bool = False
) -> dict[str, Any]:
    """Compact one (tenant, owner, scope, type) bucket; idempotent (ids derive from sources)."""
    key = BucketKey(tenant_id, owner_id, scope, type_, subtype, 0)
    return _res().compactor.compact(key, force=force).as_dict()
