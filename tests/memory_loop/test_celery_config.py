"""Celery hygiene is configuration, checked here without a broker."""

from __future__ import annotations

import pytest

from service.config import CelerySettings, Settings
from service.extraction.queue import (
    TASK_COMPACT_BUCKET,
    TASK_ENRICH_ALIASES,
    TASK_EXTRACT,
    TASK_PLAN_COMPACTION,
    TASK_PREBUILD_VOCABULARY,
    TASK_SWEEP_CHANGE_LOGS,
    TASK_SWEEP_TURNS,
)
from workers.celery_app import app, create_celery
from workers.tasks import compaction as _compaction_tasks  # noqa: F401  (registers the tasks)
from workers.tasks import extraction as _extraction_tasks  # noqa: F401
from workers.tasks import maintenance as _maintenance_tasks  # noqa: F401
from workers.tasks import vocabulary as _vocabulary_tasks  # noqa: F401
from workers.tasks.base import MissingTenant, TenantTask


def test_app_settings() -> None:
    conf = create_celery(Settings(celery=CelerySettings(queue_prefix="x"))).conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert {q.name for q in conf.task_queues} == {"x.cheap", "x.heavy"}
    assert conf.broker_transport_options["visibility_timeout"] > CelerySettings().heavy_time_limit_s
    beat = conf.beat_schedule
    assert beat["compaction-plan"]["task"] == TASK_PLAN_COMPACTION
    assert beat["compaction-plan"]["schedule"] == 1800.0
    assert beat["extraction-sweep"]["task"] == TASK_SWEEP_TURNS
    assert beat["change-log-sweep"]["task"] == TASK_SWEEP_CHANGE_LOGS
    assert beat["change-log-sweep"]["options"]["queue"] == "x.heavy"
    assert all(entry["options"]["expires"] > 0 for entry in beat.values())


def test_visibility_timeout_must_exceed_the_longest_task() -> None:
    with pytest.raises(ValueError, match="visibility_timeout"):
        create_celery(Settings(celery=CelerySettings(visibility_timeout_s=200, heavy_time_limit_s=300)))


def test_tasks_are_tenant_tasks_with_limits() -> None:
    for name, queue_kind in (
        (TASK_EXTRACT, "heavy"),
        (TASK_ENRICH_ALIASES, "cheap"),
        (TASK_COMPACT_BUCKET, "heavy"),
        (TASK_PLAN_COMPACTION, "heavy"),
        (TASK_SWEEP_TURNS, "cheap"),
        (TASK_SWEEP_CHANGE_LOGS, "heavy"),
        (TASK_PREBUILD_VOCABULARY, "cheap"),
    ):
        task = app.tasks[name]
        assert isinstance(task, TenantTask), name
        assert task.acks_late and task.soft_time_limit and task.time_limit > task.soft_time_limit, name
        assert queue_kind in ("heavy", "cheap")
    assert not app.tasks[TASK_EXTRACT].tenant_optional
    assert not app.tasks[TASK_PREBUILD_VOCABULARY].tenant_optional
    assert app.tasks[TASK_SWEEP_TURNS].tenant_optional
    assert app.tasks[TASK_SWEEP_CHANGE_LOGS].tenant_optional


@pytest.mark.parametrize("bad", [None, "", "a b", "../x", 17, "x" * 200])
def test_missing_or_malformed_tenant_fails_closed_before_running(bad: object) -> None:
    with pytest.raises(MissingTenant):
        app.tasks[TASK_EXTRACT](bad, "turn-1")
    with pytest.raises(MissingTenant):
        app.tasks[TASK_COMPACT_BUCKET](bad, "alice", "domain:code", "entity", None)
