"""The sweep re-sends a turn whose message is gone, not one that is waiting behind a backlog.

Found by the fault drills (docs/fault-drills.md, "Sweep duplicates"): after a worker or Redis
outage the turns waiting in the queue were older than ``sweep_stale_after_s``, so every sweep
sent each of them again; the duplicates were no-ops but lengthened the backlog (188 of 329
extraction tasks in the Redis drill). Here only the cheap queue is served (the sweep runs, the
extraction waits, as behind a backlog): however many sweeps pass, the turn's one message stays
the only one, and a heavy worker then extracts it once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from deploy.devstack import Service
from tests.api.conftest import ok
from tests.durability.conftest import (
    Proc,
    make_settings,
    process_env,
    stack_and_procs,
    start_beat,
    start_worker,
    wait_until,
)
from tests.durability.test_crash_recovery import beliefs_named, turn_body, wait_done
from tests.memory_loop.conftest import new_belief, sidecar

STALE_AFTER_S = 2  # tests/durability/conftest.process_env: stale after 2 s, a sweep every second


WAITING = "sweep re-enqueued 0 turns: 1 stale ones still waiting in the queue"


def sweeps_that_left_it_waiting(proc: Proc) -> int:
    """Sweeps that found the stale turn and did not send it again because its message waits: each
    says so at DEBUG (the worker below logs at DEBUG; at INFO an idle backlog is quiet)."""
    return sum(1 for line in proc.log().splitlines() if WAITING in line and "turns.sweep" in line)


def resends(proc: Proc) -> int:
    """Sweeps that sent a turn again (INFO, the only sweep line at INFO)."""
    return sum(1 for line in proc.log().splitlines() if "sweep re-enqueued" in line and WAITING not in line)


def test_a_turn_waiting_in_the_queue_is_not_sent_again(
    module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    with stack_and_procs(settings) as (st, procs):
        answer = "Noted." + sidecar(new_beliefs=[new_belief("backlog_fact", "Backlogs drain.")])
        posted = ok(st.api.post("/v1/turns", json=turn_body(answer), headers=st.team.h("alice")), 202)
        assert st.queued() == 1
        cheap_only = Proc(
            ["celery", "-A", "workers.celery_app", "worker", "-Q", f"{settings.celery.queue_prefix}.cheap",
             "--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
             "-n", f"cheap-{uuid.uuid4().hex[:6]}@%h"],
            process_env(settings, TENURE_OBSERVABILITY_LOG_LEVEL="DEBUG"),
            tmp_path / "cheap.log",
        )  # fmt: skip
        procs.append(cheap_only)
        cheap_only.wait_log("ready.")
        time.sleep(STALE_AFTER_S + 0.5)  # the turn is stale from now on
        procs.append(start_beat(settings, tmp_path))
        wait_until(lambda: sweeps_that_left_it_waiting(cheap_only) >= 3, 30, "three sweeps of the stale turn")
        assert st.queued() == 1, "the sweep sent a turn again that was still waiting in the queue"
        assert resends(cheap_only) == 0
        # the backlog is served: one delivery, one extraction
        procs.append(start_worker(settings, tmp_path / "worker.log"))
        wait_done(st, posted["turn_id"])
        assert st.turn(posted["turn_id"]).attempts == 1
        [belief] = beliefs_named(st, "backlog_fact")
        assert belief["reinforcement_count"] == 0
