"""Audit tasks: move pending injection receipts from the Redis outbox into the audit index."""

from __future__ import annotations

from service.extraction.queue import TASK_DRAIN_RECEIPTS
from workers import resources
from workers.celery_app import app
from workers.tasks.base import TenantTask

_limits = app.conf.tenure_settings.celery


class _Drain(TenantTask):
    tenant_optional = True  # receipts of every tenant share one outbox


@app.task(  # type: ignore[untyped-decorator]
    base=_Drain,
    name=TASK_DRAIN_RECEIPTS,
    soft_time_limit=_limits.cheap_soft_time_limit_s,
    time_limit=_limits.cheap_time_limit_s,
    max_retries=0,  # the next beat tick is the retry
)
def drain_receipts() -> int:
    """Beat: bulk-create pending receipts (idempotent: a replayed receipt is already there)."""
    return resources.get(app.conf.tenure_settings).receipts.drain()
