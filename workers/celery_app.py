"""The Celery application: built from :class:`Settings` by :func:`create_celery`.

Run a worker with ``celery -A workers.celery_app worker -Q tenure.heavy,tenure.cheap`` and the
scheduler with ``celery -A workers.celery_app beat``. Clients (OpenSearch, Redis) are created per
worker process in a signal handler (:mod:`workers.resources`), never at import.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from service.config import Settings, get_settings
from service.extraction.queue import (
    TASK_APPLY_RETENTION,
    TASK_DRAIN_PARKED_TURNS,
    TASK_DRAIN_RECEIPTS,
    TASK_MERGE_SEGMENTS,
    TASK_PLAN_COMPACTION,
    TASK_SWEEP_CHANGE_LOGS,
    TASK_SWEEP_TURNS,
    queue_names,
)
from workers import telemetry
from workers.beat import MAX_LOOP_INTERVAL_S
from workers.liveness import ConsumerHeartbeat

TASK_MODULES = [
    "workers.tasks.extraction",
    "workers.tasks.compaction",
    "workers.tasks.audit",
    "workers.tasks.maintenance",
    "workers.tasks.retention",
    "workers.tasks.vocabulary",
]


def create_celery(settings: Settings) -> Celery:
    cheap, heavy = queue_names(settings)
    limits = settings.celery
    longest = max(limits.heavy_time_limit_s, limits.cheap_time_limit_s)
    if limits.visibility_timeout_s <= longest:
        raise ValueError(
            f"celery visibility_timeout_s ({limits.visibility_timeout_s}) must exceed the longest "
            f"task time limit ({longest}), or a running task would be redelivered"
        )
    app = Celery("tenure", broker=settings.broker_url, include=TASK_MODULES)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_queues=[Queue(heavy), Queue(cheap)],  # type: ignore[no-untyped-call]
        task_default_queue=heavy,
        broker_transport_options={"visibility_timeout": limits.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        # touches <schedule>.alive every tick: beat's health check (workers/beat.py)
        beat_scheduler="workers.beat:HeartbeatScheduler",
        beat_max_loop_interval=MAX_LOOP_INTERVAL_S,
        beat_schedule={
            "compaction-plan": {
                "task": TASK_PLAN_COMPACTION,
                "schedule": float(settings.loop.compaction_interval_s),
                "args": [None, False],
                "options": {"queue": heavy, "expires": float(settings.loop.compaction_interval_s)},
            },
            "extraction-sweep": {
                "task": TASK_SWEEP_TURNS,
                "schedule": float(settings.loop.sweep_interval_s),
                "options": {"queue": cheap, "expires": float(settings.loop.sweep_interval_s)},
            },
            "parked-turns-drain": {
                "task": TASK_DRAIN_PARKED_TURNS,
                "schedule": float(settings.loop.parked_drain_interval_s),
                "options": {"queue": cheap, "expires": float(settings.loop.parked_drain_interval_s)},
            },
            "retention": {
                "task": TASK_APPLY_RETENTION,
                "schedule": float(settings.retention.interval_s),
                "options": {"queue": heavy, "expires": float(settings.retention.interval_s)},
            },
            # change-log documents no belief points at (service/storage/change_logs.py), as often as
            # retention: they are only left by a write that crashed or lost a race
            "change-log-sweep": {
                "task": TASK_SWEEP_CHANGE_LOGS,
                "schedule": float(settings.retention.interval_s),
                "options": {"queue": heavy, "expires": float(settings.retention.interval_s)},
            },
            "receipts-drain": {
                "task": TASK_DRAIN_RECEIPTS,
                "schedule": settings.api.receipt_drain_interval_s,
                # a missed tick is not worth running late: the next one drains everything
                "options": {"queue": cheap, "expires": max(1.0, settings.api.receipt_drain_interval_s)},
            },
        },
    )
    if limits.merge_check_interval_s > 0:
        app.conf.beat_schedule["beliefs-merge-segments"] = {
            "task": TASK_MERGE_SEGMENTS,
            "schedule": limits.merge_check_interval_s,
            "options": {"queue": heavy, "expires": limits.merge_check_interval_s},
        }
    if limits.worker_heartbeat_file:
        app.steps["consumer"].add(ConsumerHeartbeat)
    app.conf.tenure_settings = settings
    telemetry.install(settings)
    return app


app = create_celery(get_settings())
