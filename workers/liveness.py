"""The worker's consumer heartbeat, and the health check that reads it.

A Celery worker can be alive and not consume: the Redis fault drill saw Celery 5.7.0's consumer die
on a broker reconnect while the process stayed up, and 51 acknowledged turns waited until a person
restarted it. A process check (or ``celery inspect ping``, which needs a healthy broker connection
anyway) does not tell that apart from a busy worker. So a consumer bootstep, started once the task
consumer consumes and stopped whenever the consumer restarts (a lost broker) or shuts down, touches
``TENURE_CELERY_WORKER_HEARTBEAT_FILE`` from the consumer's own event loop every
``worker_heartbeat_interval_s`` and sets ``tenure_worker_consumer_heartbeat_timestamp_seconds``.
``python -m workers.liveness check <file> [max age in s]`` exits 0 only while that file is fresh:
compose's and Helm's health checks and deploy/localstack's supervisor use it, and restart a worker
whose heartbeat went stale. A stale heartbeat means the worker has not been consuming for that long
(wedged, or unable to reach its broker), and its turns wait: once a new worker consumes, the queued
messages run and the beat sweep re-sends the turns whose message was lost with the old one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import bootsteps

from service.telemetry import metrics

log = logging.getLogger("tenure.workers.liveness")

DEFAULT_MAX_AGE_S = 60.0


def touch(path: Path) -> None:
    path.touch()
    metrics.WORKER_CONSUMER_HEARTBEAT.set(time.time())


def stale(path: Path, max_age_s: float, what: str, *, done: str = "beaten", last: str = "beat") -> str | None:
    """None while ``path`` was touched within ``max_age_s``, else what is wrong: "<what> has not
    <done> yet" or "<what> last <last> N s ago"."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return f"{path} does not exist: {what} has not {done} yet"
    return None if age <= max_age_s else f"{what} last {last} {age:.0f} s ago (limit {max_age_s:.0f} s)"


class ConsumerHeartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer bootstep: beats from the consumer's event loop while the task consumer runs."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        celery = parent.app.conf.tenure_settings.celery
        self.path = Path(celery.worker_heartbeat_file)
        self.interval_s = float(celery.worker_heartbeat_interval_s)
        self._timer: Any = None

    def start(self, parent: Any) -> None:
        touch(self.path)
        self._timer = parent.timer.call_repeatedly(self.interval_s, touch, (self.path,), priority=10)
        log.debug("consumer heartbeat every %.1f s to %s", self.interval_s, self.path)

    def stop(self, _parent: Any) -> None:
        # a consumer restart (the broker connection was lost) or shutdown: no beats until it consumes again
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    shutdown = stop


def run_check(argv: list[str], usage: str, check: Callable[[str, float], str | None], max_age_s: float) -> int:
    """The health-check command line: ``check <file> [max age in s]``, exit 0 when fresh, 1 with
    what is wrong on stderr, 2 on a usage error."""
    if len(argv) not in (2, 3) or argv[0] != "check":
        sys.stderr.write(f"usage: {usage}\n")
        return 2
    problem = check(argv[1], float(argv[2]) if len(argv) == 3 else max_age_s)
    if problem:
        sys.stderr.write(problem + "\n")
        return 1
    return 0


def main(argv: list[str]) -> int:
    return run_check(
        argv,
        "python -m workers.liveness check <heartbeat file> [max age in s]",
        lambda path, max_age_s: stale(Path(path), max_age_s, "the worker's consumer"),
        DEFAULT_MAX_AGE_S,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
