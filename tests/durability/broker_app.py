"""The service's Celery app (``create_celery``: acks late, prefetch 1, the visibility timeout) with
one extra task that holds a pool process for a while, so a test can lose the broker while a
message is unacknowledged. Run as ``celery -A tests.durability.broker_app worker ...``."""

from __future__ import annotations

import time
from pathlib import Path

from service.config import get_settings
from workers.celery_app import create_celery

TASK_HOLD = "tests.hold"

app = create_celery(get_settings())


@app.task(name=TASK_HOLD)  # type: ignore[untyped-decorator]
def hold(seconds: float, done_file: str, label: str) -> str:
    time.sleep(seconds)
    with Path(done_file).open("a") as out:
        out.write(label + "\n")
    return label
