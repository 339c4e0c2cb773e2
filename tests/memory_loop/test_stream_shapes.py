"""Streams shaped as real providers send them, through ``/v1/chat/completions`` and
``/v1/messages``: several choices interleaved (``n`` > 1), the role chunk that opens an OpenAI
stream, and streams that end before the answer is complete. The client must never see any part
of a sidecar, must get every field the upstream sent for the visible answer, and must be told when
the answer was cut short."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from tenure_client import Tenure

from loadtest.scripted_llm import Reply, ScriptedLLM
from tests.api.conftest import Team
from tests.memory_loop.conftest import sidecar

LEAKS = ("<<<", ">>>", "SIDECAR", "turn_signal", "entity_updates")
BLOCK = sidecar(entity_updates=[{"canonical_name": "redis_cache", "new_aliases": ["lru"]}])


def chunk(delta: dict[str, Any], index: int = 0, finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-shapes",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish, **choice}],
    }


def openai_stream(api: TestClient, crew: Team, llm: ScriptedLLM, reply: Reply, **body: Any) -> tuple[str, list[Any]]:
    """(raw response, its JSON events) of one streamed chat completion."""
    llm.script(reply)
    request = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "eviction?"}], **body}
    response = api.post("/v1/chat/completions", json=request, headers=crew.h("alice"))
    assert response.status_code == 200, response.text
    return response.text, [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


def texts_by_choice(events: list[Any]) -> dict[int, str]:
    out: dict[int, str] = {}
    for event in events:
        for choice in event.get("choices") or []:
            out[choice["index"]] = out.get(choice["index"], "") + (choice["delta"].get("content") or "")
    return out


def test_interleaved_choices_each_lose_their_own_sidecar(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """``n=2``: the upstream interleaves the two choices' chunks, every marker cut across them."""
    answers = {0: "Alpha: use allkeys-lru.", 1: "Beta: volatile-lru keeps keys."}
    replies = {i: text + BLOCK for i, text in answers.items()}
    for size in (1, 3, 5, 7):
        events = []
        for at in range(0, max(len(r) for r in replies.values()), size):
            events += [chunk({"content": r[at : at + size]}, i) for i, r in replies.items() if r[at : at + size]]
        events += [chunk({}, 0, "stop"), chunk({}, 1, "stop")]
        raw, out = openai_stream(api, crew, llm, Reply(events=events), n=2)
        assert texts_by_choice(out) == answers, size
        assert [fragment for fragment in LEAKS if fragment in raw] == [], size
        finishes = [c["index"] for e in out for c in e.get("choices") or [] if c.get("finish_reason")]
        assert sorted(finishes) == [0, 1]
        assert out[-1]["tenure"]["parse_status"] == "parsed"


def test_the_opening_role_chunk_reaches_the_client(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """OpenAI opens every stream with ``{"role": "assistant", "content": ""}``: dropped, the SDK's
    accumulated message had ``role=None`` and sending it back in the next request was refused."""
    answer = "Use allkeys-lru."
    pieces = [answer[:4], answer[4:], BLOCK[:9], BLOCK[9:]]
    events = [chunk({"role": "assistant", "content": ""}), *(chunk({"content": p}) for p in pieces)]
    reply = Reply(events=[*events, chunk({}, finish="stop")])
    raw, out = openai_stream(api, crew, llm, reply)
    assert out[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert texts_by_choice(out) == {0: answer}
    assert [fragment for fragment in LEAKS if fragment in raw] == []

    llm.script(reply)
    client = Tenure("http://testserver", crew.keys["alice"]).openai(http_client=api, max_retries=0)
    with client.chat.completions.stream(model="gpt-4o", messages=[{"role": "user", "content": "eviction?"}]) as s:
        message = s.get_final_completion().choices[0].message
    assert (message.role, message.content) == ("assistant", answer)


def test_a_tool_call_beside_held_back_text_is_not_lost(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """A delta carrying a tool call beside text the stripper holds back (it could begin a marker)."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    events = [chunk({"role": "assistant", "content": "Checking <<"}), chunk({"content": "", "tool_calls": [call]})]
    _, out = openai_stream(api, crew, llm, Reply(events=[*events, chunk({}, finish="tool_calls")]))
    calls = [c["delta"]["tool_calls"] for e in out for c in e.get("choices") or [] if "tool_calls" in c["delta"]]
    assert calls == [[call]]
    assert texts_by_choice(out) == {0: "Checking <<"}
    assert [c["finish_reason"] for e in out for c in e.get("choices") or [] if c.get("finish_reason")] == ["tool_calls"]


def test_a_chat_stream_that_stops_mid_answer_ends_in_an_error(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """The upstream closes the stream cleanly but mid-answer (no finish_reason, no ``[DONE]``):
    the client used to get ``[DONE]`` and a turn record, as if the half answer were complete."""
    events = [chunk({"role": "assistant", "content": "Use all"}), chunk({"content": "keys-"})]
    _, out = openai_stream(api, crew, llm, Reply(events=events, done=False))
    assert texts_by_choice(out) == {0: "Use allkeys-"}
    assert out[-1]["error"]["code"] == "upstream_error"
    assert "ended before the answer was complete" in out[-1]["error"]["message"]
    assert not any("tenure" in e for e in out)


def test_a_messages_stream_that_stops_mid_answer_ends_in_an_error(
    api: TestClient, crew: Team, llm: ScriptedLLM
) -> None:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6", "content": []}
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Use allkeys-"}},
    ]
    llm.script(Reply(events=events))
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    response = api.post("/v1/messages", json=body, headers={"x-api-key": crew.keys["alice"]})
    assert response.status_code == 200, response.text
    out = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert [e["type"] for e in out] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert "ended before the answer was complete" in out[-1]["error"]["message"]


def test_the_upstreams_own_error_event_ends_the_chat_stream(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """OpenAI reports a failure mid-stream as ``data: {"error": …}``: it was held back to the end,
    behind the finish and a ``tenure`` chunk of a turn recorded as if the answer were whole."""
    error = {"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}
    events = [chunk({"role": "assistant", "content": "Use all"}), error, chunk({"content": "keys-lru"}, finish="stop")]
    raw, out = openai_stream(api, crew, llm, Reply(events=events))
    assert texts_by_choice(out) == {0: "Use all"}
    assert out[-1] == error
    assert raw.rstrip().endswith("data: [DONE]")
    assert not any("tenure" in e for e in out)


def _entries(tokens: list[str]) -> list[dict[str, Any]]:
    return [{"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": []} for t in tokens]


def _tokens(text: str, size: int) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)]


def test_log_probabilities_never_carry_the_sidecars_tokens(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """``logprobs: true`` lists every token the model wrote: the sidecar's too, streamed or not."""
    answer = "Use allkeys-lru."  # 16 characters: whole tokens of 1, 2, 4 and 8
    for size in (1, 2, 4, 8):
        tokens = _tokens(answer + "\n" + BLOCK, size)
        events = [chunk({"content": t}, logprobs={"content": _entries([t])}) for t in tokens]
        raw, out = openai_stream(api, crew, llm, Reply(events=[*events, chunk({}, finish="stop")]), logprobs=True)
        assert texts_by_choice(out) == {0: answer}, size
        sent = [
            e["token"]
            for ev in out
            for c in ev.get("choices") or []
            for e in (c.get("logprobs") or {}).get("content") or []
        ]
        assert "".join(sent) == answer, size
        assert [fragment for fragment in LEAKS if fragment in raw] == [], size

        message = {"role": "assistant", "content": answer + "\n" + BLOCK}
        whole = {"index": 0, "message": message, "logprobs": {"content": _entries(tokens)}, "finish_reason": "stop"}
        llm.script(
            Reply(completion={"id": "chatcmpl-lp", "object": "chat.completion", "model": "gpt-4o", "choices": [whole]})
        )
        request = {"model": "gpt-4o", "logprobs": True, "messages": [{"role": "user", "content": "eviction?"}]}
        response = api.post("/v1/chat/completions", json=request, headers=crew.h("alice"))
        choice = response.json()["choices"][0]
        assert choice["message"]["content"] == answer
        assert "".join(e["token"] for e in choice["logprobs"]["content"]) == answer, size
        assert [fragment for fragment in LEAKS if fragment in response.text] == [], size


def test_an_answer_given_as_a_list_of_parts_loses_its_sidecar(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """Some OpenAI-compatible providers answer ``message.content`` as a list of parts; only a
    string was stripped, so the whole sidecar reached the client and the turn was recorded without it."""
    parts = [{"type": "text", "text": "Use allkeys-lru."}, {"type": "text", "text": "\n" + BLOCK}]
    message = {"role": "assistant", "content": parts}
    completion = {
        "id": "chatcmpl-parts",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    llm.script(Reply(completion=completion))
    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "eviction?"}]}
    response = api.post("/v1/chat/completions", json=request, headers=crew.h("alice"))
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["message"]["content"] == [{"type": "text", "text": "Use allkeys-lru."}]
    shown = json.dumps(answer["choices"])
    assert not any(leak in shown for leak in LEAKS), shown
    assert answer["tenure"]["parse_status"] == "parsed"


def test_a_tool_call_after_the_sidecar_reaches_the_client(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    """OpenAI models send tool_calls after their text: once the sidecar's marker was seen every
    later delta without text was dropped, so the client got finish_reason 'tool_calls' and no
    call (the whole answer and the Anthropic relay keep them)."""
    call = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    events = [
        chunk({"role": "assistant", "content": "Looking it up.\n"}),
        chunk({"content": BLOCK}),
        chunk({"tool_calls": [call]}),
        chunk({}, finish="tool_calls"),
    ]
    raw, out = openai_stream(api, crew, llm, Reply(events=events))
    calls = [c["delta"]["tool_calls"] for e in out for c in e.get("choices") or [] if c["delta"].get("tool_calls")]
    assert calls == [[call]]
    assert texts_by_choice(out) == {0: "Looking it up."}
    assert not any(leak in raw for leak in LEAKS), raw
    assert [c["finish_reason"] for e in out for c in e.get("choices") or [] if c.get("finish_reason")] == ["tool_calls"]
