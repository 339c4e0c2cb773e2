"""Log lines an operator can search: one JSON object per line on stderr, every line inside a
request or task carrying its ``request_id``, ``tenant_id`` and ``latency_ms`` (elapsed so far; the
access line's is the request's total).

:func:`configure_logging` is called once per process (the API factory, the Celery worker and beat
through ``setup_logging``) and is idempotent: it replaces only the handler it installed. Uvicorn's
own loggers are routed through it, and its access log is replaced by the API's access line
(:mod:`service.api.observe`), which knows the route, tenant and latency.

Housekeeping that runs every few seconds (the receipt drain every second, parked-turn drain, the
sweep) would otherwise make an idle stack write a line per tick from Celery itself ("received",
"succeeded", beat's "sending due task"): those lines are DEBUG-only here, so an idle stack is quiet
at INFO and failures of those tasks still log at WARNING/ERROR.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from service.telemetry import context

HANDLER_NAME = "tenure"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s %(tenant_id)s %(latency_ms)sms] %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Celery's per-task and per-tick INFO lines (their loggers), quiet for these tasks
_CHATTY_LOGGERS = frozenset({"celery.app.trace", "celery.worker.strategy", "celery.beat"})
_quiet_tasks: frozenset[str] = frozenset()


class ContextFilter(logging.Filter):
    """Adds the current request's or task's fields to every record (None outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        work = context.current()
        if not hasattr(record, "request_id"):
            record.request_id = work.request_id if work else None
        if not hasattr(record, "tenant_id"):
            record.tenant_id = work.tenant_id if work else None
        if not hasattr(record, "latency_ms"):
            record.latency_ms = work.elapsed_ms() if work else None
        if work is not None and work.task and not hasattr(record, "task"):
            record.task = work.task
        return True


class HousekeepingFilter(logging.Filter):
    """Drops Celery's INFO bookkeeping lines about the frequent housekeeping tasks."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or record.name not in _CHATTY_LOGGERS:
            return True
        return not any(name in _quiet_tasks for name in _task_names(record.args))


def _task_names(args: Any) -> list[str]:
    if isinstance(args, dict):
        return [str(args.get("name", ""))]
    if isinstance(args, tuple):
        return [str(a) for a in args]
    return []


def quiet_tasks(names: set[str] | frozenset[str]) -> None:
    """Declare tasks whose routine Celery lines are DEBUG-only (see the module docstring)."""
    global _quiet_tasks
    _quiet_tasks = frozenset(names)


def configure_logging(fmt: str = "json", level: str = "INFO", stream: TextIO | None = None) -> None:
    root = logging.getLogger()
    for existing in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(existing)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(HANDLER_NAME)
    if fmt == "json":
        handler.setFormatter(
            JsonFormatter(JSON_FIELDS, rename_fields={"asctime": "time", "levelname": "level", "name": "logger"})
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    if level != "DEBUG":
        handler.addFilter(HousekeepingFilter())
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn's loggers: through this handler; its access log is replaced by the API's own line
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    access.disabled = True
    # client libraries log every request at INFO/DEBUG: their failures surface as our errors
    for name in ("opensearch", "urllib3", "httpx", "httpcore", "httpx2", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)
