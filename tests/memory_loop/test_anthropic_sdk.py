"""The Anthropic Messages ingress (``POST /v1/messages``) as the official ``anthropic`` Python SDK
sees it: the client from ``tenure_client``'s helper, pointed at the app under a real uvicorn, the
scripted Anthropic-compatible upstream on loopback behind it. Memory injected into the top-level
``system``, the sidecar stripped (streaming and not, whatever the chunking), tool use passed
through, the turn recorded and extracted by the real Celery worker with its receipt, typed errors
in Anthropic's shape, and two tenants with two users each seeing only their own memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from fastapi.testclient import TestClient
from tenure_client import Tenure

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from service.app import create_app
from service.config import Settings
from service.domain.principal import Principal, Role
from service.extraction.queue import TaskQueue
from service.extraction.sidecar import BEGIN
from service.storage.audit import AuditQuery
from tests.api.conftest import Team, make_team, ok
from tests.live import serve
from tests.memory_loop.conftest import OWN_ANTHROPIC_TENANT, WorkerProcess, new_belief, sidecar, wait_turn, wait_until
from tests.memory_loop.test_proxy import ANSWER, seed_redis

MODEL = "claude-sonnet-4-6"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TOOL_CALL = {"id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture(scope="module")
def live_url(loop_settings: Settings, api: TestClient) -> Iterator[str]:
    """The memory-loop app under uvicorn on a free loopback port (the TestClient's indices and Redis)."""
    with serve(create_app(loop_settings)) as url:
        yield url


def _claude(url: str, key: str, **kwargs: Any) -> anthropic.Anthropic:
    return Tenure(url, key).anthropic(scopes=["domain:code"], session_id="ant-sess", max_retries=0, **kwargs)


def _system_text(request: dict[str, Any]) -> str:
    blocks = request["system"]
    assert isinstance(blocks, list) and all(b["type"] == "text" for b in blocks)
    return "\n\n".join(b["text"] for b in blocks)


def _ask(client: anthropic.Anthropic, text: str, **extra: Any) -> Any:
    return client.messages.create(
        model=extra.pop("model", MODEL), max_tokens=256, messages=[{"role": "user", "content": text}], **extra
    )


def test_messages_inject_strip_record_and_extract(
    live_url: str,
    api: TestClient,
    crew: Team,
    llm: ScriptedLLM,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
) -> None:
    redis_id = seed_redis(api, crew.h("alice"))
    reply = ANSWER + "\n\n" + sidecar(new_beliefs=[new_belief("redis_eviction_policy", "allkeys-lru.")])
    llm.script(Reply(content=reply))
    message = _ask(
        _claude(live_url, crew.keys["alice"]), "What eviction policy for our redis?", system="You are terse."
    )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == ANSWER
    tenure = (message.model_extra or {})["tenure"]
    assert tenure["injected_belief_ids"] == [redis_id] and tenure["session_id"] == "ant-sess"
    assert tenure["parse_status"] == "parsed" and tenure["extraction"] == "queued"

    sent = llm.requests[-1]
    assert sent["_path"] == "/v1/messages"
    system = _system_text(sent)
    order = [system.index(s) for s in ("SECONDARY TASK", "You have persistent memory", redis_id, "You are terse.")]
    assert order == sorted(order)
    assert [m["role"] for m in sent["messages"]] == ["user"] and "metadata" not in sent
    # the upstream gets the tenant's upstream key; the caller's Tenure key goes nowhere
    assert sent["_headers"]["x-api-key"] == "sk-ant-upstream-test"
    assert sent["_headers"]["anthropic-version"]
    assert "authorization" not in sent["_headers"]
    assert not any(crew.keys["alice"] in str(v) for v in sent["_headers"].values())

    done = wait_turn(api, crew.h("alice"), tenure["turn_id"])
    assert done["result"]["merge"]["ops"][0]["outcome"] == "inserted"
    admin = Principal(tenant_id=crew.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))

    def receipts() -> list[dict[str, Any]]:
        loop_services.audit.refresh()
        events, _ = loop_services.audit.search(admin, AuditQuery(session_id="ant-sess"), size=10, after=None)
        return [e.details or {} for e in events if e.belief_ids == [redis_id]]

    queue = TaskQueue(loop_settings)
    try:
        queue.drain_receipts()
        found = wait_until(receipts, timeout=30)
    finally:
        queue.close()
    assert found[0]["via"] == "proxy" and found[0]["api"] == "anthropic" and found[0]["model"] == MODEL


@pytest.mark.parametrize("sizes", [[1], [3], [17], [19], [5, 1, 13, 2], [10_000]])
def test_streaming_through_the_sdk_never_shows_the_sidecar(
    live_url: str, crew: Team, llm: ScriptedLLM, sizes: list[int]
) -> None:
    reply = ANSWER + "\n" + sidecar(entity_updates=[{"canonical_name": "redis_cache", "new_aliases": ["lru"]}])
    llm.script(Reply(content=reply, chunk_sizes=sizes))
    client = _claude(live_url, crew.keys["alice"])
    with client.messages.stream(
        model=MODEL, max_tokens=256, messages=[{"role": "user", "content": "eviction?"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == ANSWER
    assert final.content[0].text == ANSWER and final.stop_reason == "end_turn"
    assert llm.requests[-1]["stream"] is True


def test_streamed_events_are_anthropics_and_carry_the_turn(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    llm.script(Reply(content=ANSWER + sidecar(), chunk_sizes=[4]))
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    response = api.post("/v1/messages", json=body, headers={"x-api-key": crew.keys["alice"]})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    names = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "<<<" not in response.text and "turn_signal" not in response.text

    delta = next(
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith('data: {"type": "message_delta"')
    )
    assert delta["tenure"]["parse_status"] == "parsed" and delta["tenure"]["turn_id"]


def test_tool_use_passes_through(live_url: str, crew: Team, llm: ScriptedLLM) -> None:
    client = _claude(live_url, crew.keys["alice"])
    llm.script(Reply(content="Let me look that up." + sidecar(), tool_use=TOOL_CALL))
    message = _ask(client, "What is the weather in Paris?", tools=[WEATHER_TOOL])
    assert llm.requests[-1]["tools"] == [WEATHER_TOOL]
    assert [b.type for b in message.content] == ["text", "tool_use"] and message.stop_reason == "tool_use"
    assert message.content[0].text == "Let me look that up."
    assert message.content[1].input == {"city": "Paris"} and message.content[1].id == "toolu_01"

    for sizes in ([1], [6], [10_000]):
        llm.script(Reply(content="Checking." + sidecar(), tool_use=TOOL_CALL, chunk_sizes=sizes))
        with client.messages.stream(
            model=MODEL,
            max_tokens=256,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        ) as stream:
            final = stream.get_final_message()
        assert [b.type for b in final.content] == ["text", "tool_use"]
        assert final.content[0].text == "Checking." and final.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]

    # the tool result goes back upstream as sent; recall still answers the question asked before it
    llm.script(Reply(content="It is sunny in Paris." + sidecar()))
    answer = client.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", **TOOL_CALL}]},  # type: ignore[list-item]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}]},
        ],
    )
    assert answer.content[0].text == "It is sunny in Paris."  # type: ignore[union-attr]
    sent = llm.requests[-1]
    assert sent["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}


def test_sidecar_after_a_tool_call_and_in_a_later_text_block(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """Non-streaming, block by block: text before the marker stays, later text blocks go."""
    from service.extraction.sidecar import split_blocks

    content = [
        {"type": "text", "text": "Visible."},
        {"type": "tool_use", **TOOL_CALL},
        {"type": "text", "text": "More visible.\n" + BEGIN + '{"turn_signal": '},
        {"type": "text", "text": '"substantive"}<<<END_SIDECAR>>>'},
    ]
    assert split_blocks(content, [])[0] == content[:2] + [{"type": "text", "text": "More visible."}]
    only_sidecar = [{"type": "text", "text": sidecar()}, {"type": "tool_use", **TOOL_CALL}]
    assert split_blocks(only_sidecar, [])[0] == only_sidecar[1:]


def test_failures_are_the_sdks_typed_errors(live_url: str, api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    with pytest.raises(anthropic.AuthenticationError) as unauth:
        _ask(_claude(live_url, "tnr_nokey_nosecret"), "hi")
    body = unauth.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "unauthenticated"
    assert body["request_id"] == unauth.value.response.headers["X-Request-ID"]

    client = _claude(live_url, crew.keys["alice"])
    llm.script(Reply(status=429, error={"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}))
    with pytest.raises(anthropic.RateLimitError) as limited:
        _ask(client, "hi")
    assert "slow" in limited.value.message
    llm.script(Reply(status=500))
    with pytest.raises(anthropic.InternalServerError) as failed:
        _ask(client, "hi")
    assert failed.value.status_code == 502 and failed.value.body["error"]["code"] == "upstream_error"  # type: ignore[index]
    llm.script(Reply(delay_s=3.5))
    with pytest.raises(anthropic.APIStatusError) as timed_out:
        _ask(client, "hi")
    assert timed_out.value.status_code == 504 and timed_out.value.body["error"]["type"] == "timeout_error"  # type: ignore[index]

    # a body the proxy refuses, in Anthropic's shape; nothing reaches the upstream
    llm.reset()
    refused = api.post("/v1/messages", json={"model": MODEL, "messages": []}, headers={"x-api-key": crew.keys["alice"]})
    assert refused.status_code == 422 and refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "invalid_request_error"
    missing = api.post(
        "/v1/messages", json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
    )
    assert missing.status_code == 401 and "x-api-key" in missing.json()["error"]["message"]
    assert llm.requests == []


def test_a_model_below_the_floor_is_served_with_a_warning(live_url: str, crew: Team, llm: ScriptedLLM) -> None:
    llm.script(Reply(content="an answer from an old model"))
    raw = _claude(live_url, crew.keys["alice"]).messages.with_raw_response.create(
        model="claude-3-haiku-20240307", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert "below the" in raw.headers["x-tenure-warning"]
    assert raw.parse().content[0].text == "an answer from an old model"  # type: ignore[union-attr]
    assert "SECONDARY TASK" not in _system_text(llm.requests[-1])  # served without extraction


def test_two_tenants_and_two_users_see_only_their_own_memory(
    live_url: str, api: TestClient, crew: Team, other_crew: Team, llm: ScriptedLLM
) -> None:
    private = seed_redis(api, crew.h("alice"))  # domain:code: alice's own
    shared_body = {
        "type": "decision",
        "canonical_name": "payments_queue",
        "aliases": ["redis"],
        "content": "Payments use the redis queue.",
        "why_it_matters": "Shapes payment answers.",
        "scope": ["project:pay"],
    }
    shared = ok(api.post("/v1/beliefs", json=shared_body, headers=crew.h("alice")), 201)["id"]
    seen: dict[tuple[str, str], list[str]] = {}
    for team in (crew, other_crew):
        for user in ("alice", "bob"):
            llm.script(Reply(content="ok" + sidecar()))
            client = Tenure(live_url, team.keys[user]).anthropic(session_id=f"iso-{user}", max_retries=0)
            message = _ask(client, "how do we use redis?")
            seen[(team.tenant, user)] = (message.model_extra or {})["tenure"]["injected_belief_ids"]
            system = _system_text(llm.requests[-1])
            for belief in (private, shared):
                assert (belief in system) == (belief in seen[(team.tenant, user)])
    assert sorted(seen[(crew.tenant, "alice")]) == sorted([private, shared])
    assert seen[(crew.tenant, "bob")] == [shared]  # the project's belief, not alice's own
    assert seen[(other_crew.tenant, "alice")] == [] and seen[(other_crew.tenant, "bob")] == []


def test_per_tenant_anthropic_upstream(
    live_url: str, api: TestClient, operator_headers: dict[str, str], llm: ScriptedLLM, llm_own: ScriptedLLM
) -> None:
    team = make_team(api, operator_headers, tenant=OWN_ANTHROPIC_TENANT)
    llm_own.script(Reply(content="from the tenant's own upstream"))
    message = _ask(Tenure(live_url, team.keys["alice"]).anthropic(max_retries=0), "hello")
    assert message.content[0].text == "from the tenant's own upstream"  # type: ignore[union-attr]
    assert llm_own.requests[-1]["_headers"]["x-api-key"] == "sk-own-ant"
    assert llm.requests == []
    llm_own.reset()
