"""The tenant-aware base task: fails closed without a tenant, retries transient store failures.

Every task's first argument is ``tenant_id`` (maintenance tasks that scan all tenants opt out
explicitly with ``tenant_optional = True`` and may pass None). A missing or malformed tenant is a
programming error: the task raises :class:`MissingTenant` *before* running, is not retried, and the
message is acknowledged (nothing runs with a guessed or default tenant).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from celery import Task

from service.extraction.pipeline import TRANSIENT_ERRORS

logger = logging.getLogger("tenure.workers")
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class MissingTenant(Exception):
    """A tenant task was called without a valid tenant id."""


class TenantTask(Task):  # type: ignore[misc]
    abstract = True
    tenant_optional = False
    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    autoretry_for = TRANSIENT_ERRORS
    retry_backoff = 2
    retry_backoff_max = 300
    retry_jitter = True
    max_retries = 5

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tenant = args[0] if args else kwargs.get("tenant_id")
        if tenant is None and self.tenant_optional:
            return super().__call__(*args, **kwargs)
        if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
            logger.error("task %s refused: no valid tenant_id (got %r)", self.name, type(tenant).__name__)
            raise MissingTenant(f"task {self.name} needs a tenant_id as its first argument")
        return super().__call__(*args, **kwargs)
