"""The OpenAI-compatible proxy against the scripted upstream: injection in the paper's layout,
sidecar stripped (streaming included, whatever the chunk boundaries), errors, degradation."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from service.app import create_app
from service.auth.tokens import TokenVerifier
from service.config import AuthSettings, Settings
from service.domain.principal import Principal
from service.extraction.sidecar import BEGIN
from service.proxy.prompt import SIDECAR_INSTRUCTIONS
from service.proxy.service import MemoryLoop
from tests.api.conftest import Team, make_team, ok
from tests.memory_loop.conftest import STRICT_GATE_TENANT, WorkerProcess, new_belief, sidecar, wait_turn

ANSWER = "Use allkeys-lru for a pure cache; volatile-lru if some keys must persist."


def chat(api: TestClient, headers: dict[str, str], text: str, **extra: Any) -> Any:
    body = {
        "model": extra.pop("model", "gpt-4o"),
        "messages": extra.pop("messages", [{"role": "user", "content": text}]),
        "metadata": extra.pop("metadata", {"session_id": "sess-1", "scope": "domain:code"}),
        **extra,
    }
    return api.post("/v1/chat/completions", json=body, headers=headers)


def seed_redis(api: TestClient, headers: dict[str, str]) -> str:
    body = {
        "type": "entity",
        "canonical_name": "redis_cache",
        "aliases": ["redis"],
        "content": "Redis is the cache.",
        "why_it_matters": "Shapes cache answers toward Redis.",
        "scope": ["domain:code"],
    }
    return str(ok(api.post("/v1/beliefs", json=body, headers=headers), 201)["id"])


def test_non_streaming_injects_strips_and_records(
    api: TestClient, crew: Team, llm: ScriptedLLM, worker: WorkerProcess
) -> None:
    redis_id = seed_redis(api, crew.h("alice"))
    reply = ANSWER + "\n\n" + sidecar(new_beliefs=[new_belief("redis_eviction_policy", "allkeys-lru.")])
    llm.script(Reply(content=reply))
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What eviction policy for our redis?"},
    ]
    response = chat(api, crew.h("alice"), "", messages=messages)
    body = ok(response)
    assert body["choices"][0]["message"]["content"] == ANSWER
    tenure = body["tenure"]
    assert tenure["session_id"] == "sess-1"
    assert tenure["scope"] == ["domain:code"]
    assert tenure["injected_belief_ids"] == [redis_id]
    assert tenure["parse_status"] == "parsed"
    assert tenure["extraction"] == "queued"
    assert tenure["degraded"] is False
    sent = llm.requests[-1]
    system = sent["messages"][0]["content"]
    assert sent["messages"][0]["role"] == "system"
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]
    assert system.startswith(SIDECAR_INSTRUCTIONS)
    order = [
        system.index(s)
        for s in (
            "You have persistent memory",
            "<pinned_facts>[",
            "<relevant_beliefs>[",
            "You are terse.",
            "append the sidecar block",
        )
    ]
    assert order == sorted(order)
    assert redis_id in system.split("<relevant_beliefs>[")[1]
    assert "metadata" not in sent
    assert sent["_headers"]["authorization"] == "Bearer sk-upstream-test"
    done = wait_turn(api, crew.h("alice"), tenure["turn_id"])
    assert done["result"]["merge"]["ops"][0]["outcome"] == "inserted"


def test_a_whole_answer_s_turn_survives_a_process_killed_right_after_answering(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn (and its sidecar: the memory) is held in Redis before a whole answer goes out and
    stored in the index right after. Here the process "dies" in between (the step after the
    answer never runs): the parked-turn drain the beat runs stores it and enqueues its extraction.
    Stored only after the answer, it used to be lost with the process."""

    def killed_first(*_: Any) -> bool:  # the process dies before this step runs
        return True

    monkeypatch.setattr(MemoryLoop, "settle", killed_first)
    llm.script(Reply(content="Kept." + sidecar(new_beliefs=[new_belief("held_turn_fact", "Held turns survive.")])))
    tenure = ok(chat(api, crew.h("alice"), "do held turns survive?"))["tenure"]
    assert (tenure["turn_recording"], tenure["extraction"]) == ("held_before_response", "queued"), tenure
    assert api.get(f"/v1/turns/{tenure['turn_id']}", headers=crew.h("alice")).status_code == 404
    monkeypatch.undo()
    assert loop_services.loop.parked.drain() >= 1
    stored = ok(api.get(f"/v1/turns/{tenure['turn_id']}", headers=crew.h("alice")))
    assert stored["extraction_status"] in ("pending", "running", "done"), stored


def _sse(response: Any) -> tuple[str, list[dict[str, Any]], str]:
    raw = response.text
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    content = "".join((e["choices"][0].get("delta") or {}).get("content") or "" for e in events if e.get("choices"))
    return raw, events, content


@pytest.mark.parametrize("sizes", [[1], [3], [17], [18], [19], [5, 1, 13, 2], [10_000]])
def test_streaming_never_leaks_the_sidecar(api: TestClient, crew: Team, llm: ScriptedLLM, sizes: list[int]) -> None:
    reply = ANSWER + "\n" + sidecar(entity_updates=[{"canonical_name": "redis_cache", "new_aliases": ["lru"]}])
    llm.script(Reply(content=reply, chunk_sizes=sizes))
    response = chat(api, crew.h("alice"), "eviction?", stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    raw, events, content = _sse(response)
    assert content == ANSWER
    for fragment in ("<<<", "SIDECAR", "entity_updates", "turn_signal"):
        assert fragment not in raw
    assert raw.rstrip().endswith("data: [DONE]")
    tenure = events[-1]["tenure"]
    assert tenure["parse_status"] == "parsed"
    assert tenure["turn_id"]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_streaming_final_piece_with_finish_reason_and_usage_trailer(
    api: TestClient, crew: Team, llm: ScriptedLLM
) -> None:
    for text in (ANSWER, ANSWER + sidecar()):
        llm.script(Reply(content=text, chunk_sizes=[6], finish_with_last=True, usage_chunk=True))
        raw, events, content = _sse(chat(api, crew.h("alice"), "x", stream=True))
        assert content == ANSWER
        assert "<<<" not in raw
        finish = [e for e in events if e.get("choices") and e["choices"][0].get("finish_reason")]
        assert len(finish) == 1
        assert events.index(finish[0]) > max(
            i for i, e in enumerate(events) if e.get("choices") and e["choices"][0].get("delta", {}).get("content")
        )
        assert any("usage" in e for e in events)


def test_streaming_truncated_and_missing_sidecars(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    llm.script(Reply(content=ANSWER + BEGIN + '{"turn_signal": "substantive", "new_bel', chunk_sizes=[2]))
    _, events, content = _sse(chat(api, crew.h("alice"), "x", stream=True))
    assert content == ANSWER
    assert events[-1]["tenure"]["parse_status"] == "needs_repair"
    llm.script(Reply(content="No sidecar today <<<SIDE and that is fine", chunk_sizes=[4]))
    _, events, content = _sse(chat(api, crew.h("alice"), "x", stream=True))
    assert content == "No sidecar today <<<SIDE and that is fine"
    assert events[-1]["tenure"]["parse_status"] == "missing"
    assert events[-1]["tenure"]["extraction"] == "skipped"


def test_upstream_errors_are_openai_style(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    llm.script(Reply(status=500))
    failed = chat(api, crew.h("alice"), "x")
    assert failed.status_code == 502
    assert failed.json()["error"]["code"] == "upstream_error"
    assert failed.json()["error"]["type"] == "upstream_error"
    llm.script(Reply(status=400, error={"error": {"message": "context too long"}}))
    rejected = chat(api, crew.h("alice"), "x", stream=True)
    assert rejected.status_code == 400
    assert "context too long" in rejected.json()["error"]["message"]
    llm.script(Reply(delay_s=3.5))
    timed_out = chat(api, crew.h("alice"), "x")
    assert timed_out.status_code == 504
    assert timed_out.json()["error"]["code"] == "upstream_timeout"


def test_tier_gate_and_bad_input(
    api: TestClient, crew: Team, llm: ScriptedLLM, operator_headers: dict[str, str]
) -> None:
    # below its family's floor: answered, without sidecar instructions and without extraction
    llm.script(Reply(content="an answer from an old model"))
    served = chat(api, crew.h("alice"), "x", model="gpt-4")
    body = ok(served)
    assert served.headers["x-tenure-warning"].startswith('Model "gpt-4" is below the "gpt" floor')
    assert body["choices"][0]["message"]["content"] == "an answer from an old model"
    assert body["tenure"]["extraction"] == "off"
    assert SIDECAR_INSTRUCTIONS not in llm.requests[-1]["messages"][0]["content"]
    # a tenant that asked for strict mode refuses it, before anything reaches the upstream
    strict = make_team(api, operator_headers, tenant=STRICT_GATE_TENANT)
    sent = len(llm.requests)
    refused = chat(api, strict.h("alice"), "x", model="gpt-4")
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "model_not_supported"
    assert len(llm.requests) == sent
    llm.reset()
    llm.script(Reply(content="hi"))
    warned = chat(api, crew.h("alice"), "x", model="llama-3.1-70b")
    assert warned.status_code == 200
    assert warned.headers["x-tenure-warning"].startswith('Model "llama-3.1-70b" is not in a verified tier')
    cases: list[dict[str, Any]] = [
        {"model": "gpt-4o"},
        {"model": "gpt-4o", "messages": []},
        {"model": "gpt-4o", "messages": [{"role": "wizard", "content": "x"}]},
        {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "x"}],
            "metadata": {"scope": "root:/"},
        },
        {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "x"}],
            "metadata": {"scope": 7},
        },
        {"model": "", "messages": [{"role": "user", "content": "x"}]},
    ]
    for body in cases:
        bad = api.post("/v1/chat/completions", json=body, headers=crew.h("alice"))
        assert bad.status_code == 422, body
        assert bad.json()["error"]["code"] == "validation_error"
    garbage = api.post("/v1/chat/completions", content=b"{not json", headers=crew.h("alice"))
    assert garbage.status_code == 422
    assert api.post("/v1/chat/completions", json=cases[0]).status_code == 401
    assert len(llm.requests) == 1  # nothing invalid ever reached the upstream


@pytest.fixture
def broken_store_api(loop_settings: Settings, llm: ScriptedLLM) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The same service with OpenSearch unreachable (a closed port); JWT auth needs no store. Its
    turns cannot be recorded, so they are parked in Redis: under a namespace and queue prefix of its
    own (dropped afterwards), never in the shared test app's parking, where the parked-turn tests
    would find them (they did, when they ran after this module)."""
    auth = AuthSettings(
        jwt_hs256_secret=SecretStr("degraded-test-secret-0123456789abcdef"),
        jwt_algorithms=["HS256"],
    )
    own = f"degraded-{uuid.uuid4().hex[:8]}"
    settings = loop_settings.model_copy(
        update={
            "opensearch_url": "http://127.0.0.1:9",
            "opensearch_timeout_s": 0.5,
            "auth": auth,
            "opensearch_namespace": own,
            "celery": loop_settings.celery.model_copy(update={"queue_prefix": own}),
        }
    )
    token, _ = TokenVerifier(auth).issue_dev_token(Principal(tenant_id="t-degraded", user_id="dana"))
    with TestClient(create_app(settings)) as client:
        yield client, {"Authorization": f"Bearer {token}"}
        services = client.app.state.services  # type: ignore[attr-defined]
        keys = list(services.redis.scan_iter(match=f"{own}:*"))
        if keys:
            services.redis.delete(*keys)


def test_failing_store_degrades_to_answering_without_memory(
    broken_store_api: tuple[TestClient, dict[str, str]], llm: ScriptedLLM
) -> None:
    client, headers = broken_store_api
    llm.script(
        Reply(content="still here" + sidecar()),
        Reply(content="streamed" + sidecar(), chunk_sizes=[3]),
    )
    body = ok(chat(client, headers, "hello"))
    assert body["choices"][0]["message"]["content"] == "still here"
    assert body["tenure"]["degraded"] is True
    assert body["tenure"]["turn_recording"] == "held_before_response"
    assert "memory unavailable: recall failed" in body["tenure"]["degraded_reasons"]
    assert "You have persistent memory" not in llm.requests[-1]["messages"][0]["content"]
    _, events, content = _sse(chat(client, headers, "hello", stream=True))
    assert content == "streamed"
    assert events[-1]["tenure"]["degraded"] is True


def test_per_tenant_upstream(
    api: TestClient, operator_headers: dict[str, str], llm: ScriptedLLM, llm_own: ScriptedLLM
) -> None:
    from tests.api.conftest import make_team
    from tests.memory_loop.conftest import OWN_UPSTREAM_TENANT

    team = make_team(api, operator_headers, tenant=OWN_UPSTREAM_TENANT)
    llm_own.script(Reply(content="from the tenant's own upstream"))
    body = ok(chat(api, team.h("alice"), "hello"))
    assert body["choices"][0]["message"]["content"] == "from the tenant's own upstream"
    assert llm_own.requests[-1]["_headers"]["authorization"] == "Bearer sk-own"
    assert llm.requests == []
    llm_own.reset()


def test_no_upstream_configured_is_a_clear_503(
    loop_settings: Settings, operator_headers: dict[str, str], llm: ScriptedLLM
) -> None:
    """The deployment default (compose, Helm): no provider until an operator sets one. Chat
    answers 503 ``upstream_not_configured`` naming the setting, streaming or not, before any
    recall; ``GET /v1/models`` still answers (a tenant's own upstream: test_per_tenant_upstream)."""
    from tests.api.conftest import make_team

    unset = {"upstream_base_url": None, "upstream_api_key": None, "anthropic_upstream_base_url": None}
    loop = loop_settings.loop.model_copy(update=unset)
    with TestClient(create_app(loop_settings.model_copy(update={"loop": loop}))) as client:
        team = make_team(client, operator_headers)
        sent = len(llm.requests)
        for stream in (False, True):
            refused = chat(client, team.h("alice"), "hello", stream=stream)
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "upstream_not_configured"
            assert error["message"].startswith("no upstream configured")
            assert "TENURE_LOOP_UPSTREAM_BASE_URL" in error["message"]
        assert len(llm.requests) == sent  # nothing was forwarded anywhere
        anthropic = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        refused = client.post("/v1/messages", json=anthropic, headers=team.h("alice"))
        assert refused.status_code == 503, refused.text
        assert "TENURE_LOOP_ANTHROPIC_UPSTREAM_BASE_URL" in refused.json()["error"]["message"]
        assert client.get("/v1/models", headers=team.h("alice")).status_code == 200
