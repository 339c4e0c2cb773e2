"""An OpenSearch outage that outlasts an extraction task's retries must not lose the turn.

Found by the OpenSearch fault drill (docs/fault-drills.md): the worker retried a turn through the
outage; its last retry ran while the node was back but still recovering the beliefs shards, so
the turn could be claimed but the merge's belief lookup failed with 503, and the task, out of
retries, marked the turn ``failed``: final, never swept, the extraction lost although nothing
was wrong with it. Here the beliefs index has no active primary (as during shard recovery)
while the turns index serves, and the worker gets one retry; the turn must stay unfinished with
its attempt handed back, and be extracted once, by the sweep, when the shards are back.
"""

from __future__ import annotations

from pathlib import Path

from deploy.devstack import Service
from tests.api.conftest import ok
from tests.durability.conftest import make_settings, stack_and_procs, start_beat, start_worker
from tests.durability.test_crash_recovery import beliefs_named, turn_body, wait_done
from tests.durability.test_shard_recovery import beliefs_without_primaries
from tests.memory_loop.conftest import new_belief, sidecar


def test_a_turn_outlasting_its_retries_is_left_to_the_sweep(
    module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    with stack_and_procs(settings) as (st, procs):
        with beliefs_without_primaries(st.client, settings.opensearch_namespace):
            worker = start_worker(settings, tmp_path / "worker.log", TENURE_CELERY_MAX_RETRIES="1")
            procs.append(worker)
            answer = "Noted." + sidecar(new_beliefs=[new_belief("outage_fact", "Outages are sat out.")])
            posted = ok(st.api.post("/v1/turns", json=turn_body(answer), headers=st.team.h("alice")), 202)
            turn_id = posted["turn_id"]
            # the task claimed the turn, failed on the beliefs index, retried once, and gave up
            worker.wait_log("raised unexpected: StoreUnavailable", timeout=60)
            turn = st.turn(turn_id)
            assert turn.extraction_status != "failed", f"a store outage failed the turn for good: {turn.error}"
            assert (turn.extraction_status, turn.attempts) == ("pending", 0)
        # only the sweep can bring it back now: the task's message was acknowledged
        procs.append(start_beat(settings, tmp_path))
        wait_done(st, turn_id)
        assert st.turn(turn_id).attempts == 1
        [belief] = beliefs_named(st, "outage_fact")
        assert belief["reinforcement_count"] == 0
