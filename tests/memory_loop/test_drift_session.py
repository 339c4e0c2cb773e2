"""End to end: the paper's drift session driven through the proxy, with the scripted model writing
the sidecars the paper's harness simulated. Turn 4's sidecar creates the CI decision; turn 9's
entity_update adds the allkeys-lru aliases to the Redis belief (the flywheel); turn 10 must then
recall b-redis-code and nothing else, and the cross-session turn must find it too."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from evals.cases import paper_case_set
from evals.judge import Tiers, judge
from evals.runner import load_corpus
from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from tests.api.conftest import Team, auth, ok
from tests.memory_loop.conftest import WorkerProcess, sidecar, wait_turn

CASES = paper_case_set()


def _sidecar_for(turn: Any) -> str:
    """What a faithful model emits for this turn: the paper's mutations, as sidecar items."""
    if turn.create_belief:
        record = turn.create_belief
        item = {
            k: record[k]
            for k in (
                "type",
                "canonical_name",
                "aliases",
                "content",
                "why_it_matters",
                "scope",
                "confidence",
            )
        }
        return sidecar(
            new_beliefs=[
                {
                    **item,
                    "subtype": None,
                    "epistemic_status": "active",
                    "resolves_open_question": None,
                }
            ]
        )
    if turn.add_aliases:
        return sidecar(entity_updates=[{"canonical_name": "redis_cache", "new_aliases": turn.add_aliases[1]}])
    return sidecar()


def _translate(expect: Any, ids: dict[str, str]) -> Any:
    if isinstance(expect, dict):
        return {k: _translate(v, ids) for k, v in expect.items()}
    if isinstance(expect, list):
        return [ids.get(v, v) if isinstance(v, str) else v for v in expect]
    return expect


def test_paper_drift_session_through_the_proxy(
    api: TestClient,
    crew: Team,
    operator_headers: dict[str, str],
    llm: ScriptedLLM,
    worker: WorkerProcess,
    loop_services: Services,
) -> None:
    ok(
        api.post(
            f"/v1/admin/tenants/{crew.tenant}/users",
            json={"user_id": "test-user"},
            headers=operator_headers,
        ),
        201,
    )
    key = ok(
        api.post(
            f"/v1/admin/tenants/{crew.tenant}/users/test-user/keys",
            json={"name": "s"},
            headers=operator_headers,
        ),
        201,
    )
    headers = auth(key["key"])
    load_corpus(loop_services.store, crew.tenant, CASES)
    created: dict[str, str] = {}
    failures: list[str] = []
    for session in CASES.sessions:
        for turn in session.turns:
            llm.script(
                Reply(
                    content=f"Answer to turn {turn.index}.\n" + _sidecar_for(turn),
                    chunk_sizes=[1, 7, 18],
                )
            )
            stream = turn.index % 2 == 1
            body = {
                "model": "claude-sonnet-4-5",
                "stream": stream,
                "messages": [{"role": "user", "content": turn.user_message}],
                "metadata": {"session_id": session.case_id, "scope": turn.scope},
            }
            response = api.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text
            tenure = _tenure(response, stream=stream)
            tiers = tenure["injected_tiers"]
            verdict = judge(
                f"{session.case_id}#{turn.index}",
                _translate(turn.expect, created),
                Tiers(
                    persona=None,
                    pinned=tiers["pinned"],
                    relevant=tiers["relevant"],
                    questions=tiers["questions"],
                ),
            )
            if not verdict.passed:
                failures.append(f"{verdict.case_id}: {verdict.failures}")
            assert verdict.drift in (None, 0.0)
            done = wait_turn(api, headers, tenure["turn_id"])  # extraction lands before the next turn
            assert done["extraction_status"] == "done", done
            for op in done["result"]["merge"]["ops"]:
                assert op["outcome"] in ("inserted", "aliases_added"), op
                if op["outcome"] == "inserted":
                    created["b-ci-parallel-decision"] = op["belief_id"]
    assert failures == []
    assert "b-ci-parallel-decision" in created
    redis = ok(api.get("/v1/beliefs/b-redis-code", headers=headers))
    assert {
        "allkeys-lru",
        "eviction policy",
        "maxmemory",
        "eviction sweeps",
        "volatile-lru",
    } <= set(redis["aliases"])


def _tenure(response: Any, *, stream: bool) -> dict[str, Any]:
    if not stream:
        tenure: dict[str, Any] = response.json()["tenure"]
        return tenure
    import json

    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert "<<<" not in response.text
    return dict(events[-1]["tenure"])
