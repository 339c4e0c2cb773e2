"""The unit of work a log line belongs to: an HTTP request or a Celery task.

One :class:`WorkContext` per request (set by the API's middleware) or task (set by the worker's
signals), held in a context variable. It is a mutable object on purpose: FastAPI runs sync
dependencies in a thread with a *copy* of the context, so authentication cannot set a new context
variable the middleware would see, but it can fill in ``tenant_id`` on the shared object.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from dataclasses import dataclass, field


@dataclass
class WorkContext:
    request_id: str | None = None
    tenant_id: str | None = None
    task: str | None = None  # a Celery task's name; None for HTTP requests
    started: float = field(default_factory=time.perf_counter)

    def elapsed_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)


_current: ContextVar[WorkContext | None] = ContextVar("tenure_work_context", default=None)


def current() -> WorkContext | None:
    return _current.get()


def begin(context: WorkContext) -> Token[WorkContext | None]:
    return _current.set(context)


def end(token: Token[WorkContext | None]) -> None:
    _current.reset(token)


def set_tenant(tenant_id: str) -> None:
    """Name the tenant of the current request or task (no-op outside one)."""
    context = _current.get()
    if context is not None:
        context.tenant_id = tenant_id
