"""Retention: beat deletes audit events and turns past their tenant's limit (service/storage/retention.py)."""

from __future__ import annotations

from typing import Any

from service.domain.belief import utcnow
from service.extraction.queue import TASK_APPLY_RETENTION
from service.storage.retention import RetentionStore, apply_retention
from workers import resources
from workers.celery_app import app
from workers.tasks.base import TenantTask, logger

_limits = app.conf.tenure_settings.celery


class _Sweep(TenantTask):
    tenant_optional = True  # one sweep covers every tenant, each under its own limit


@app.task(  # type: ignore[untyped-decorator]
    base=_Sweep,
    name=TASK_APPLY_RETENTION,
    soft_time_limit=_limits.heavy_soft_time_limit_s,
    time_limit=_limits.heavy_time_limit_s,
    max_retries=0,  # the next beat run is the retry; deletes by query are idempotent
)
def apply(tenant_id: str | None = None) -> list[dict[str, Any]]:  # noqa: ARG001 - tenant tasks take one
    res = resources.get(app.conf.tenure_settings)
    done = apply_retention(
        RetentionStore(res.client, res.settings.opensearch_namespace), res.settings.retention, utcnow()
    )
    removed = [e.as_dict() for e in done if e.deleted]
    if removed:
        logger.info("retention removed %s", removed)
    return [e.as_dict() for e in done]
