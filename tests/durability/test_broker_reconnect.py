"""A worker that loses its Redis broker mid-task consumes again once Redis is back.

Found by the Redis fault drill: with Celery 5.7.0 the worker's consumer, on a lost broker
connection, ran ``collect()`` (which clears the kombu transport's ``client``) and then ``close()``
on the same connection; when the task channel had not finished closing in ``collect()`` (its BRPOP
was in flight and the pubsub connection of the remote-control channel noticed the loss first),
that second close restored the channel's unacknowledged message through a transport without a
client: ``AttributeError: 'NoneType' object has no attribute 'hostname'`` in kombu's
``restore_unacked``, "Unrecoverable error", and the worker never consumed again (the drill's 51
pending turns). Celery 5.6.3 only collects (pinned ``<5.7`` in pyproject.toml).

The test reproduces exactly that state with real parts: a worker (the service's Celery config,
concurrency 2) runs one long task, so it holds one unacknowledged message and waits in BRPOP for
the next; the broker's pubsub clients are disconnected and redis-server is SIGKILLed right after,
so the remote-control channel sees the loss first. Celery 5.7.0 failed this every time (2 of 2 by
hand, and the drill); the worker must instead reconnect and run tasks sent after the restart.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from deploy.devstack import free_port, start_redis
from deploy.localstack import wait_until
from tests.durability.broker_app import TASK_HOLD, app
from tests.durability.conftest import Proc, make_settings, process_env


def _done(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_worker_consumes_again_after_redis_dies_under_an_unacknowledged_task(tmp_path: Path) -> None:
    home, port = tmp_path / "redis", free_port()
    rds = start_redis(home, port)
    # OpenSearch is never reached: the held task only sleeps
    settings = make_settings("http://127.0.0.1:9", rds.url)
    heavy = f"{settings.celery.queue_prefix}.heavy"
    done = tmp_path / "done"
    worker = Proc(
        [
            "celery", "-A", "tests.durability.broker_app", "worker", "-Q", heavy, "--pool=prefork",
            "--concurrency=2", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
        ],
        process_env(settings),
        tmp_path / "worker.log",
    )  # fmt: skip
    app.conf.broker_url = rds.url
    try:
        worker.wait_log("ready.")
        app.send_task(TASK_HOLD, args=[4.0, str(done), "before"], queue=heavy)
        worker.wait_log(f"Task {TASK_HOLD}[")  # received: one message unacknowledged, BRPOP for the next
        time.sleep(0.5)

        broker: redis.Redis[bytes] = redis.Redis.from_url(rds.url)
        broker.client_kill_filter(_type="pubsub")  # the remote-control channel notices first ...
        broker.close()
        os.killpg(rds.process.pid, signal.SIGKILL)  # ... and the broker is gone when it cleans up
        rds.process.wait(timeout=30)
        worker.wait_log("Connection to broker lost")
        time.sleep(3)
        rds = start_redis(home, port, fresh=False)

        for n in range(3):
            app.send_task(TASK_HOLD, args=[0.1, str(done), f"after-{n}"], queue=heavy)
        wait_until(
            lambda: {"after-0", "after-1", "after-2"} <= set(_done(done)),
            90,
            f"tasks sent after the restart run (worker log: {worker.log()[-3000:]})",
        )
        assert worker.proc.poll() is None
        assert "Unrecoverable error" not in worker.log()
    finally:
        worker.stop()
        app.close()
        rds.stop()
