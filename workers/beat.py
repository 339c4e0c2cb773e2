"""Celery beat with a liveness file, and the health check that reads it.

beat has no ping (``celery inspect`` talks to workers only), and a hung scheduler looks alive to a
process check while sweeps, drains and retention silently stop. So every scheduler tick touches
``<schedule file>.alive``; ``python -m workers.beat check <schedule file>`` exits 0 only while that
file is fresh. Ticks come at least every ``beat_max_loop_interval`` (the receipt drain, every
second by default, keeps them far more frequent).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from celery.beat import PersistentScheduler

from workers.liveness import run_check, stale

DEFAULT_MAX_AGE_S = 120.0
MAX_LOOP_INTERVAL_S = 30.0  # celery's default is 300 s; the health check needs ticks well inside its max age


def alive_file(schedule_filename: str) -> Path:
    return Path(f"{schedule_filename}.alive")


class HeartbeatScheduler(PersistentScheduler):  # type: ignore[misc]
    """The default persistent scheduler, touching its liveness file on every tick."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        alive_file(self.schedule_filename).touch()
        interval: float = super().tick(*args, **kwargs)
        return interval


def check(schedule_filename: str, max_age_s: float = DEFAULT_MAX_AGE_S) -> str | None:
    """None when beat ticked within ``max_age_s``, else what is wrong."""
    return stale(alive_file(schedule_filename), max_age_s, "beat", done="ticked", last="ticked")


def main(argv: list[str]) -> int:
    return run_check(argv, "python -m workers.beat check <schedule file> [max age in s]", check, DEFAULT_MAX_AGE_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
