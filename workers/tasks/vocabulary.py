"""Recall vocabularies built after a belief write through the API (service/recall/prebuild.py).

A worker's own writes are prebuilt after each of its tasks (``workers/resources.py``); this task
is how the API asks for the same after its writes. Thin: it notes the tenant, and the prebuild runs
after the task like any other task's."""

from __future__ import annotations

from service.extraction.queue import TASK_PREBUILD_VOCABULARY
from workers import resources
from workers.celery_app import app
from workers.tasks.base import TenantTask

_settings = app.conf.tenure_settings


@app.task(  # type: ignore[untyped-decorator]
    base=TenantTask,
    name=TASK_PREBUILD_VOCABULARY,
    soft_time_limit=_settings.celery.cheap_soft_time_limit_s,
    time_limit=_settings.celery.cheap_time_limit_s,
    max_retries=0,  # an optimisation: without it the next recall builds
)
def prebuild_vocabulary(tenant_id: str) -> None:
    """Build the tenant's vocabulary at its current write version and share it (after the task)."""
    res = resources.get(_settings)
    res.queue.prebuild_taken(tenant_id)  # before the version is read: a later write sends another
    if res.prebuilder is not None:
        res.prebuilder.note([tenant_id])
