"""A proxy turn whose record cannot be written (OpenSearch refusing writes) after its answer went
out is parked in Redis, then stored and extracted exactly once when the beat drains the parking;
a replayed drain applies nothing twice. POST /v1/turns does not park: its caller gets 503."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from service.config import Settings
from service.extraction.queue import TaskQueue, queue_names
from service.proxy.service import MemoryLoop
from service.storage.turns import TURNS, TurnRecord
from tests.api.conftest import Team, ok
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn, wait_until
from tests.memory_loop.test_extraction_worker import beliefs_named


@pytest.fixture
def turns_write_blocked(loop_services: Services, loop_settings: Settings) -> Iterator[None]:
    """A real OpenSearch condition: the turns index refuses writes (what a reindex or the disk
    flood stage does), while recall keeps working."""
    index = ",".join(loop_services.opensearch.indices.get_alias(name=TURNS.alias(loop_settings.opensearch_namespace)))
    loop_services.opensearch.indices.put_settings(index=index, body={"index": {"blocks": {"write": True}}})
    try:
        yield
    finally:
        loop_services.opensearch.indices.put_settings(index=index, body={"index": {"blocks": {"write": False}}})


def _chat(api: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "we settled the release train"}],
        "metadata": {"session_id": "parked-1", "scope": "domain:code"},
    }
    return dict(ok(api.post("/v1/chat/completions", json=body, headers=headers)))


def _queues_idle(rds: redis.Redis[bytes], settings: Settings) -> bool:
    return all(rds.llen(q) == 0 for q in queue_names(settings))


def test_a_turn_answered_while_its_record_is_refused_is_parked_then_extracted_once(
    api: TestClient,
    crew: Team,
    worker: WorkerProcess,
    llm: ScriptedLLM,
    loop_services: Services,
    loop_settings: Settings,
    turns_write_blocked: None,
) -> None:
    loop: MemoryLoop = api.app.state.services.loop  # type: ignore[attr-defined]
    llm.script(Reply(content="Noted." + sidecar(new_beliefs=[new_belief("release_train", "Weekly release train.")])))
    answer = _chat(api, crew.h("alice"))
    assert answer["choices"][0]["message"]["content"] == "Noted."
    turn_id = answer["tenure"]["turn_id"]
    # the background step ran (TestClient waits for it): the record was refused, the turn parked
    [(_, fields)] = loop_services.redis.xrange(loop.parked.outbox.key)
    parked = TurnRecord.model_validate_json(fields[b"e"])
    assert parked.turn_id == turn_id and parked.sidecar_raw
    assert api.get(f"/v1/turns/{turn_id}", headers=crew.h("alice")).status_code == 404

    loop_services.opensearch.indices.put_settings(
        index=TURNS.alias(loop_settings.opensearch_namespace), body={"index": {"blocks": {"write": False}}}
    )
    queue = TaskQueue(loop_settings)
    try:
        queue.drain_parked_turns()  # what the beat sends every loop.parked_drain_interval_s
        wait_until(lambda: loop.parked.outbox.pending() == 0, timeout=30)
        assert wait_turn(api, crew.h("alice"), turn_id)["extraction_status"] == "done"
        [belief] = beliefs_named(api, crew.h("alice"), "release_train")
        assert loop.parked.outbox.pending() == 0

        # a drain that died after storing, before deleting its batch, delivers the turn again
        assert loop.parked.park(parked)
        queue.drain_parked_turns()
        wait_until(lambda: loop.parked.outbox.pending() == 0 and _queues_idle(loop_services.redis, loop_settings))
        time.sleep(1.0)  # the re-sent extraction, if any, has run on the idle worker
    finally:
        queue.close()
    [again] = beliefs_named(api, crew.h("alice"), "release_train")
    assert again["id"] == belief["id"] and again["reinforcement_count"] == belief["reinforcement_count"]
    assert again["updated_at"] == belief["updated_at"]


def test_post_turns_does_not_park_its_caller_retries_on_503(
    api: TestClient, crew: Team, turns_write_blocked: None
) -> None:
    loop: MemoryLoop = api.app.state.services.loop  # type: ignore[attr-defined]
    before = loop.parked.outbox.pending()
    body = {"model": "gpt-4o", "scope": ["domain:code"], "user_message": "hi", "assistant_message": "Noted."}
    refused = api.post("/v1/turns", json=body, headers=crew.h("alice"))
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert loop.parked.outbox.pending() == before
