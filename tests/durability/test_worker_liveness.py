"""A worker that is alive but not consuming is seen by its health check, and once it is replaced
every acknowledged turn is extracted exactly once (real worker, redis-server, OpenSearch).

"Wedged" is a SIGSTOP of the worker's main process: the process and its pool children exist, a
process check passes, and nothing consumes, which is what the Redis fault drill's worker looked like
after Celery 5.7.0's consumer died on a reconnect. The health check (``python -m workers.liveness
check``, what compose, Helm and deploy/localstack's supervisor run) must fail within its max age;
the replacement worker runs the messages that waited and the beat sweep re-sends the turn whose
message the wedged worker had taken.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.devstack import Service
from deploy.localstack import LocalStack, StackConfig, wait_until
from tests.api.conftest import ok
from tests.durability.conftest import Proc, make_settings, stack, start_beat, start_worker
from tests.durability.test_crash_recovery import beliefs_named, turn_body, wait_done
from tests.memory_loop.conftest import new_belief, sidecar

MAX_AGE_S = 3.0


def liveness(heartbeat: Path, max_age_s: float = MAX_AGE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.liveness", "check", str(heartbeat), str(max_age_s)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_wedged_worker_fails_its_check_and_its_replacement_extracts_every_turn_once(
    module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    heartbeat = tmp_path / "worker.alive"
    beat_env = {
        "TENURE_CELERY_WORKER_HEARTBEAT_FILE": str(heartbeat),
        "TENURE_CELERY_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    }
    procs: list[Proc] = []
    try:
        with stack(settings) as st:
            assert liveness(heartbeat).returncode == 1  # no worker yet: no heartbeat
            worker = start_worker(settings, tmp_path / "worker-a.log", **beat_env)
            procs += [worker, start_beat(settings, tmp_path)]
            wait_until(lambda: liveness(heartbeat).returncode == 0, 30, "a consuming worker's check passes")

            def post(name: str) -> str:
                answer = "Noted." + sidecar(new_beliefs=[new_belief(name, f"Fact {name}.")])
                posted = ok(st.api.post("/v1/turns", json=turn_body(answer), headers=st.team.h("alice")), 202)
                return str(posted["turn_id"])

            first = post("fact_before")
            wait_done(st, first)

            os.kill(worker.pid, signal.SIGSTOP)  # wedged: alive, pool children alive, no consuming
            turns = [post(f"fact_wedged_{n}") for n in range(3)]  # acknowledged, their messages wait
            time.sleep(MAX_AGE_S + 1.0)
            check = liveness(heartbeat)
            assert check.returncode == 1 and "last beat" in check.stderr, check.stderr
            assert worker.proc.poll() is None, "the wedged worker is alive: a process check would pass"
            assert all(st.turn(t).extraction_status == "pending" for t in turns)

            worker.kill9()  # what the supervisor does with a worker whose check fails
            procs.append(start_worker(settings, tmp_path / "worker-b.log", **beat_env))
            for turn_id in turns:
                wait_done(st, turn_id, timeout=90)
            assert liveness(heartbeat).returncode == 0
            for name in ["fact_before", *(f"fact_wedged_{n}" for n in range(3))]:
                [belief] = beliefs_named(st, name)  # exactly once
                assert belief["reinforcement_count"] == 0, f"{name} was applied twice"
    finally:
        for p in procs:
            p.stop()


@pytest.mark.timeout(300)
def test_localstack_restarts_a_worker_whose_heartbeat_went_stale(
    module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    config = StackConfig(
        root=tmp_path / "stack",
        opensearch_url=module_node.url,
        redis_url=own_redis.url,
        api_workers=1,
        worker_concurrency=1,
        with_llm=False,
        with_beat=False,
        worker_stale_after_s=4.0,
        worker_heartbeat_interval_s=0.5,
    )
    with LocalStack(config) as local:
        pid = local.pids()["worker"][0]  # the worker's main process (its pool children follow)
        wait_until(lambda: liveness(local.heartbeat_file("worker")).returncode == 0, 30, "heartbeat")
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: local.supervisor_restarts, 60, "the supervisor restarts the wedged worker")
        [(_, name, why)] = local.supervisor_restarts
        assert name == "worker" and "last beat" in why, why
        wait_until(lambda: liveness(local.heartbeat_file("worker")).returncode == 0, 120, "the new worker beats")
        assert local.pids()["worker"][0] != pid

        local.kill("worker")  # stopped on purpose (a drill): left down
        time.sleep(config.worker_stale_after_s + 2.0)
        assert len(local.supervisor_restarts) == 1 and "worker" not in local.pids()
