"""Crash tests for "every acknowledged write survives a crash of any one process".

Each test acknowledges a write through the real code path, SIGKILLs one real process (a Celery
worker, redis-server, the OpenSearch node, the uvicorn API), restarts it on the same data where
it has data, and checks that the write is there and that the work it implies is done exactly once.
See docs/architecture.md, "Crash tests", for what is proven and the windows that remain.
"""

from __future__ import annotations

import json
import os
import re
import signal
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from deploy.devstack import Service, free_port, start_opensearch, start_redis
from loadtest.scripted_llm import Reply, ScriptedLLM
from service.config import Settings
from tests.api.conftest import belief_body, ok
from tests.durability.conftest import (
    HEAP,
    Proc,
    Stack,
    kill9,
    make_settings,
    process_env,
    stack,
    start_beat,
    start_worker,
    wait_until,
)
from tests.durability.gate import HoldingGate
from tests.factories import make_belief, put_all
from tests.memory_loop.conftest import new_belief, sidecar

# the worker's final write of a turn ("done"): held by the gate so the crash lands after the
# merge has written its beliefs and before the turn is marked finished, the worst moment
HOLD_TURN_DONE = re.compile(rb'"extraction_status"\s*:\s*"done"')
SEEDED = "CI runs tests in a matrix."


def turn_body(answer: str) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "scope": ["domain:code"],
        "session_id": "s-crash",
        "user_message": "what did we decide?",
        "assistant_message": answer,
    }


def beliefs_named(st: Stack, name: str) -> list[dict[str, Any]]:
    page = ok(st.api.get("/v1/beliefs", params={"limit": 200}, headers=st.team.h("alice")))
    items = page["items"] if isinstance(page, dict) else page
    return [b for b in items if b["canonical_name"] == name]


def wait_done(st: Stack, turn_id: str, timeout: float = 60.0) -> None:
    wait_until(lambda: st.turn(turn_id).extraction_status == "done", timeout, f"turn {turn_id} extracted")


def pool_children(pid: int) -> list[int]:
    """Child pids of a process (the prefork pool of a Celery worker), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            # the fields after the parenthesised command: state, ppid, ...
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("victim", ["pool_process", "whole_worker"])
def test_worker_killed_mid_extraction_finishes_exactly_once(
    victim: str, module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    gate = HoldingGate(int(urlparse(module_node.url).port or 0), HOLD_TURN_DONE).start()
    procs: list[Proc] = []
    try:
        with stack(settings) as st:
            tenant = st.team.tenant
            put_all(
                st.services.store,
                make_belief(tenant, "alice", "ci_matrix", id="b-ci", type="decision", content=SEEDED),
            )
            # the first worker reaches OpenSearch through the gate
            worker = start_worker(settings, tmp_path / "worker-a.log", TENURE_OPENSEARCH_URL=gate.url)
            procs.append(worker)
            answer = "Noted." + sidecar(
                new_beliefs=[
                    new_belief("release_day", "Releases go out on Tuesdays."),
                    new_belief("ci_matrix", SEEDED),
                ]
            )
            turn_id = ok(st.api.post("/v1/turns", json=turn_body(answer), headers=st.team.h("alice")), 202)["turn_id"]
            assert gate.held.wait(60), f"the worker never finished the merge: {worker.log()[-3000:]}"

            # mid-task, proven: claimed, beliefs written, turn not finished
            turn = st.turn(turn_id)
            assert (turn.extraction_status, turn.attempts) == ("running", 1)
            [fact] = beliefs_named(st, "release_day")
            assert fact["reinforcement_count"] == 0
            [ci] = beliefs_named(st, "ci_matrix")
            assert ci["reinforcement_count"] == 1

            if victim == "pool_process":
                # the process running the task dies; the worker's main process notices
                # (task_reject_on_worker_lost) and puts the message back: redelivery, no sweep
                [child] = pool_children(worker.pid)
                os.kill(child, signal.SIGKILL)
                assert worker.proc.poll() is None
            else:
                # the whole worker dies, message unacknowledged in Redis (restored by the broker
                # only after the 1 h visibility timeout): the beat sweep must find the turn
                worker.kill9()
                procs.append(start_worker(settings, tmp_path / "worker-b.log"))
                procs.append(start_beat(settings, tmp_path))

            wait_done(st, turn_id)
            turn = st.turn(turn_id)
            assert turn.attempts == 2
            outcomes = [(o["section"], o["outcome"]) for o in (turn.result or {})["merge"]["ops"]]
            # the re-run reports what an uninterrupted run would have
            assert outcomes == [("new_beliefs", "inserted"), ("new_beliefs", "reinforced")]
            [fact] = beliefs_named(st, "release_day")
            assert fact["reinforcement_count"] == 0, "the re-run reinforced the belief its own turn inserted"
            full = ok(st.api.get(f"/v1/beliefs/{fact['id']}", headers=st.team.h("alice")))
            assert [e["trigger"] for e in full["change_log"]] == ["created (extraction)"]
            [ci] = beliefs_named(st, "ci_matrix")
            assert ci["reinforcement_count"] == 1, "the reinforcement was applied twice"
    finally:
        for p in procs:
            p.stop()
        gate.close()


def test_worker_killed_between_turn_done_and_the_flywheel_send(
    module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    """The window after the turn is marked done and before ``aliases.enrich`` is enqueued: the
    redelivered extraction finds the turn final and must still send the flywheel task."""
    settings = make_settings(module_node.url, own_redis.url)
    # the worker reaches Redis through the gate; its send of aliases.enrich is held
    gate = HoldingGate(int(urlparse(own_redis.url).port or 0), re.compile(rb"aliases\.enrich")).start()
    procs: list[Proc] = []
    try:
        with stack(settings) as st:
            put_all(
                st.services.store,
                make_belief(st.team.tenant, "alice", "redis_cache", id="b-redis", type="entity", aliases=["redis"]),
            )
            worker = start_worker(
                settings, tmp_path / "worker.log", TENURE_REDIS_URL=f"redis://127.0.0.1:{gate.port}/0"
            )
            procs.append(worker)
            candidate = {"surface": "eviction sweeps", "possible_entities": ["redis_cache"], "confidence": "high"}
            body = {
                **turn_body("ok" + sidecar(possible_alias_candidates=[candidate])),
                "user_message": "our eviction sweeps are slow",
            }
            turn_id = ok(st.api.post("/v1/turns", json=body, headers=st.team.h("alice")), 202)["turn_id"]
            assert gate.held.wait(60), f"the worker never sent aliases.enrich: {worker.log()[-3000:]}"
            assert st.turn(turn_id).extraction_status == "done"
            [child] = pool_children(worker.pid)
            os.kill(child, signal.SIGKILL)  # the send never reached Redis

            def aliases() -> list[str]:
                return list(ok(st.api.get("/v1/beliefs/b-redis", headers=st.team.h("alice")))["aliases"])

            wait_until(lambda: "eviction sweeps" in aliases(), 30, "the flywheel ran after the crash")
            assert st.turn(turn_id).attempts == 1  # the redelivery did not extract the turn again
    finally:
        for p in procs:
            p.stop()
        gate.close()


def test_enqueued_task_survives_a_redis_crash(module_node: Service, tmp_path: Path) -> None:
    home, port = tmp_path / "redis", free_port()
    rds = start_redis(home, port)
    settings = make_settings(module_node.url, rds.url)
    procs: list[Proc] = []
    try:
        with stack(settings) as st:
            answer = "Noted." + sidecar(new_beliefs=[new_belief("queue_fact", "The queue survived.")])
            posted = ok(st.api.post("/v1/turns", json=turn_body(answer), headers=st.team.h("alice")), 202)
            # acknowledged: the turn is written and the LPUSH answered; no worker is running
            assert st.queued() == 1
            # no wait for the once-per-second fsync: a process crash keeps what redis write()'s to
            # the AOF before it replies (the page cache survives; a machine crash would not)
            kill9(rds.process)
            rds = start_redis(home, port, fresh=False)
            assert st.queued() == 1, "the acknowledged enqueue was lost with redis-server"
            assert st.turn(posted["turn_id"]).extraction_status == "pending"
            # a worker and no beat: only the replayed message can run the extraction
            procs.append(start_worker(settings, tmp_path / "worker.log"))
            wait_done(st, posted["turn_id"])
            [belief] = beliefs_named(st, "queue_fact")
            assert belief["provenance"]["turn_id"] == posted["turn_id"]
            assert st.queued() == 0
    finally:
        for p in procs:
            p.stop()
        rds.stop()


def test_acknowledged_writes_survive_an_opensearch_crash(own_redis: Service, tmp_path: Path) -> None:
    home, port = tmp_path / "opensearch", free_port()
    node = start_opensearch(home, port, heap=HEAP)
    try:
        settings = make_settings(node.url, own_redis.url)
        with stack(settings) as st:
            alice = st.team.h("alice")
            for index in (f"{settings.opensearch_namespace}-beliefs", f"{settings.opensearch_namespace}-turns"):
                found = st.client.indices.get_settings(index=index, include_defaults=True)
                for conf in found.values():
                    durability = (
                        conf["settings"]["index"].get("translog", {}).get("durability")
                        or conf["defaults"]["index"]["translog"]["durability"]
                    )
                    assert str(durability).lower() == "request", (index, durability)
            belief = ok(st.api.post("/v1/beliefs", json=belief_body("crash_safe"), headers=alice), 201)
            # a turn is acknowledged without a refresh: only the translog holds it
            turn_id = ok(st.api.post("/v1/turns", json=turn_body("no sidecar"), headers=alice), 202)["turn_id"]
            kill9(node.process)  # right after the acknowledgements: no flush, no refresh, no shutdown
            node = start_opensearch(home, port, heap=HEAP, fresh=False)
            got = ok(st.api.get(f"/v1/beliefs/{belief['id']}", headers=alice))
            assert (got["canonical_name"], got["content"]) == ("crash_safe", "Content of crash_safe.")
            assert [b["id"] for b in beliefs_named(st, "crash_safe")] == [belief["id"]]  # searchable again
            turn = ok(st.api.get(f"/v1/turns/{turn_id}", headers=alice))
            assert turn["extraction_status"] == "skipped"
    finally:
        node.stop()


def wait_http(url: str, timeout: float = 60.0) -> None:
    def up() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout, f"{url} up")


def start_api(settings: Settings, port: int, log: Path, upstream: str) -> Proc:
    env = {"TENURE_LOOP_UPSTREAM_BASE_URL": upstream, "TENURE_LOOP_UPSTREAM_API_KEY": "sk-upstream"}
    proc = Proc(
        ["uvicorn", "service.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        process_env(settings, **env),
        log,
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/readyz")
    return proc


def streamed_tenure(base: str, headers: dict[str, str], question: str) -> dict[str, Any]:
    """Stream one proxied chat to [DONE]; the ``tenure`` object of the last chunk."""
    body = {
        "model": "gpt-4o",
        "stream": True,
        "messages": [{"role": "user", "content": question}],
        "metadata": {"scope": ["domain:code"], "session_id": "s-crash"},
    }
    tenure: dict[str, Any] = {}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                tenure = json.loads(line[6:]).get("tenure") or tenure
    return tenure


def test_turns_acknowledged_by_a_killed_api_are_extracted(
    module_node: Service, own_redis: Service, tmp_path: Path
) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    llm = ScriptedLLM().start()
    procs: list[Proc] = []
    try:
        with stack(settings) as st:  # the in-process app only provisions the team here
            alice = st.team.h("alice")
            api = start_api(settings, port, tmp_path / "api-1.log", llm.base_url)
            procs.append(api)
            # 1. a streamed proxy turn: recorded and enqueued before the final ``tenure`` chunk
            llm.script(Reply("Sure." + sidecar(new_beliefs=[new_belief("streamed_fact", "Streams are kept.")])))
            tenure = streamed_tenure(base, alice, "what do we keep?")
            assert (tenure["turn_recording"], tenure["extraction"]) == ("before_response", "queued"), tenure
            # 2. a client-posted turn: recorded and enqueued before the 202
            answer = "Noted." + sidecar(new_beliefs=[new_belief("api_crash_fact", "Acknowledged means kept.")])
            resp = httpx.post(f"{base}/v1/turns", json=turn_body(answer), headers=alice, timeout=30)
            assert resp.status_code == 202, resp.text
            api.kill9()  # right after the acknowledgements
            turn_ids = [tenure["turn_id"], resp.json()["turn_id"]]
            assert [st.turn(t).extraction_status for t in turn_ids] == ["pending", "pending"]
            procs.append(start_api(settings, port, tmp_path / "api-2.log", llm.base_url))
            procs.append(start_worker(settings, tmp_path / "worker.log"))
            procs.append(start_beat(settings, tmp_path))

            def extracted(turn_id: str) -> dict[str, Any] | None:
                body: dict[str, Any] = httpx.get(f"{base}/v1/turns/{turn_id}", headers=alice, timeout=10).json()
                return body if body["extraction_status"] == "done" else None

            for turn_id in turn_ids:
                done = wait_until(partial(extracted, turn_id), 60, f"extraction of {turn_id} after the API crash")
                assert [o["outcome"] for o in done["result"]["merge"]["ops"]] == ["inserted"]
            for name in ("streamed_fact", "api_crash_fact"):
                [belief] = beliefs_named(st, name)
                assert belief["reinforcement_count"] == 0
    finally:
        for p in procs:
            p.stop()
        llm.stop()
