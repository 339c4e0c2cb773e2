"""Logs and metrics of the Celery worker and beat (service/telemetry does the work).

- ``setup_logging``: Celery leaves logging alone when this signal has a receiver; the process
  logs JSON like the API, and the housekeeping tasks' routine lines are DEBUG-only (an idle stack
  is quiet at INFO).
- ``task_prerun``/``task_postrun``: every log line of a task carries its id, name and tenant;
  tasks are counted and timed by name and final state.
- ``worker_init``: with ``TENURE_OBSERVABILITY_WORKER_METRICS_PORT`` set, the worker's main
  process serves ``/metrics`` for its whole pool (multi-process mode: ``PROMETHEUS_MULTIPROC_DIR``
  must be set for a prefork pool, or the children's counters would be invisible).
"""

from __future__ import annotations

import contextlib
import logging
import time
from contextvars import Token
from typing import Any

from celery import signals
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import multiprocess as prom_multiprocess

from service.config import Settings
from service.extraction.queue import TASK_DRAIN_PARKED_TURNS, TASK_DRAIN_RECEIPTS, TASK_SWEEP_TURNS
from service.telemetry import context, metrics
from service.telemetry.logs import configure_logging, quiet_tasks

log = logging.getLogger("tenure.workers")

# run every few seconds: their routine "received / succeeded / sending due task" lines are DEBUG
HOUSEKEEPING_TASKS = frozenset({TASK_DRAIN_RECEIPTS, TASK_DRAIN_PARKED_TURNS, TASK_SWEEP_TURNS})
_running: dict[str, tuple[Token[context.WorkContext | None], context.WorkContext]] = {}


def install(settings: Settings) -> None:
    """Connect the signal receivers (idempotent: Celery keeps one receiver per function)."""
    observability = settings.observability

    def setup_logging(**_: Any) -> None:
        quiet_tasks(HOUSEKEEPING_TASKS)
        configure_logging(observability.log_format, observability.log_level)
        if observability.tracing_enabled:
            from service.telemetry.tracing import configure_tracing

            configure_tracing("tenure-worker")

    def serve_metrics(**_: Any) -> None:
        port = observability.worker_metrics_port
        if not port:
            return
        if metrics.multiprocess_dir():
            registry = CollectorRegistry()
            prom_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            start_http_server(port, registry=registry)
        else:
            log.warning("PROMETHEUS_MULTIPROC_DIR is not set: /metrics shows this process only, not its pool")
            start_http_server(port)
        log.info("worker metrics on :%d/metrics", port)

    signals.setup_logging.connect(setup_logging, weak=False)
    signals.worker_init.connect(serve_metrics, weak=False)
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_finished, weak=False)


def _task_started(task_id: str | None = None, task: Any = None, args: Any = None, **_: Any) -> None:
    tenant = args[0] if args and isinstance(args[0], str) else None
    work = context.WorkContext(request_id=task_id, tenant_id=tenant, task=getattr(task, "name", None))
    if task_id:
        _running[task_id] = (context.begin(work), work)


def _task_finished(task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    started = _running.pop(task_id, None) if task_id else None
    name = getattr(task, "name", "unknown")
    metrics.TASKS.labels(name, (state or "UNKNOWN").lower()).inc()
    if started is None:
        return
    token, work = started
    metrics.TASK_LATENCY.labels(name).observe(time.perf_counter() - work.started)
    with contextlib.suppress(ValueError):  # reset from another context (an eager task in a task)
        context.end(token)
