"""A misbehaving upstream cannot make the proxy hold an unbounded answer, on both ingresses: a
whole answer past ``TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES`` (with its length announced, or sent
chunked without end) is a 502 ``upstream_answer_too_large``; a stream whose line never ends, or
that holds back text without end (whitespace that could precede the sidecar marker, a sidecar that
never ends), or whose text passes the body bound, ends with the in-stream error event. Each time
the upstream connection is closed (the scripted upstream sees the hang-up long before it would
have stopped sending), and no turn is recorded. A compressed answer (a decompression bomb: a few kB
on the wire, gigabytes decoded) is bounded by what it decodes to."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from service.domain.principal import Principal, Role
from service.extraction.sidecar import BEGIN
from tests.api.conftest import Team
from tests.memory_loop.conftest import wait_until

CODE = "upstream_answer_too_large"
MiB = 1024 * 1024
STREAM_SENDS = 8 * MiB  # what an endless stream sends before it stops on its own (past every bound)
BODY_SENDS = 48 * MiB  # an endless whole answer (past 16 MiB, and what the sockets buffer)
PAUSE_S = 0.002  # between 64 kB pieces of an endless answer
BOMB_SENDS = 1024 * MiB  # what an endless compressed answer decodes to before it stops (~1 MB sent)


def ask(api: TestClient, crew: Team, kind: str, *, stream: bool) -> Any:
    message = [{"role": "user", "content": "which eviction policy?"}]
    if kind == "openai":
        body = {"model": "gpt-4o", "messages": message, "stream": stream}
        return api.post("/v1/chat/completions", json=body, headers=crew.h("alice"))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": message, "stream": stream}
    return api.post("/v1/messages", json=body, headers={"x-api-key": crew.keys["alice"]})


def error_of(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The error in the client's dialect: OpenAI's ``error`` object, Anthropic's ``type: error``."""
    if kind == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "api_error"
    else:
        assert body["error"]["type"] == "upstream_error"
    error: dict[str, Any] = body["error"]
    return error


def turns_of(services: Services, crew: Team) -> list[tuple[str, int]]:
    admin = Principal(tenant_id=crew.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    return services.loop.turns.outcome_counts(admin)


def hung_up(llm: ScriptedLLM) -> int:
    """How much of its endless part the upstream sent before the proxy closed the connection."""
    (request,) = llm.requests
    sent: int = wait_until(lambda: request.get("_hung_up", -1) + 1, timeout=10) - 1
    return sent


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("shape", ["announced", "chunked"])
def test_a_whole_answer_past_the_bound_is_a_502(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, kind: str, shape: str
) -> None:
    """The answer was read whole, whatever its size, and held (then parsed, split, recorded)."""
    if shape == "announced":  # 16 MiB of text: past the default bound (16 MiB of body) once in JSON
        llm.script(Reply(content="x" * (16 * MiB)))
    else:
        llm.script(Reply(endless=b"y" * 65_536, endless_max_bytes=BODY_SENDS, endless_pause_s=PAUSE_S))
    response = ask(api, crew, kind, stream=False)
    assert response.status_code == 502, response.text[:500]
    error = error_of(kind, response.json())
    assert error["code"] == CODE
    assert "TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES" in error["message"]
    assert hung_up(llm) < BODY_SENDS
    assert turns_of(loop_services, crew) == []


def openai_chunk(text: str) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o", "choices": [choice]}


ANTHROPIC_OPENING = [
    {
        "type": "message_start",
        "message": {"id": "m1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6", "content": []},
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
]


def anthropic_delta(text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}


def endless_stream(kind: str, first: str, again: str | None) -> Reply:
    """A stream that opens with the text ``first``, then sends ``again`` as one more text event,
    or, None, a line that never ends, for ever (until the proxy hangs up)."""
    if kind == "openai":
        opening = [openai_chunk(first)]
        event = b"data: " + json.dumps(openai_chunk(again)).encode() + b"\n\n" if again is not None else b""
    else:
        opening = [*ANTHROPIC_OPENING, anthropic_delta(first)]
        delta = json.dumps(anthropic_delta(again)).encode() if again is not None else b""
        event = b"event: content_block_delta\ndata: " + delta + b"\n\n" if again is not None else b""
    endless = event * (65_536 // len(event) + 1) if event else b"z" * 65_536  # no newline: a line for ever
    return Reply(events=opening, done=False, endless=endless, endless_max_bytes=STREAM_SENDS, endless_pause_s=PAUSE_S)


def stream_outcome(api: TestClient, crew: Team, kind: str) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(the text the client was shown, the last event, every event) of one streamed request."""
    response = ask(api, crew, kind, stream=True)
    assert response.status_code == 200, response.text[:500]
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    if kind == "openai":
        assert response.text.rstrip().endswith("data: [DONE]")
        shown = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices") or [])
    else:
        shown = "".join(e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta")
    return shown, events[-1], events


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("what", "again", "setting"),
    [
        pytest.param("a line that never ends", None, "TENURE_LOOP_UPSTREAM_MAX_EVENT_BYTES", id="endless-line"),
        pytest.param("whitespace", " " * 4096, "TENURE_LOOP_UPSTREAM_MAX_HELD_CHARS", id="endless-whitespace"),
        pytest.param(
            "a sidecar that never ends",
            '{"new_beliefs": [], ' * 200,
            "TENURE_LOOP_UPSTREAM_MAX_HELD_CHARS",
            id="endless-sidecar",
        ),
    ],
)
def test_a_stream_that_holds_without_end_ends_in_the_error_event(
    api: TestClient,
    crew: Team,
    llm: ScriptedLLM,
    loop_services: Services,
    kind: str,
    what: str,
    again: str | None,
    setting: str,
) -> None:
    """Held back unshown (the stripper keeps trailing whitespace in case a marker follows, and
    everything after the marker), the text grew with the upstream's answer; a line without end
    was cut at httpx2's own 1 MB, reported as any broken stream."""
    first = "Use allkeys-lru." + (BEGIN if what.startswith("a sidecar") else "")
    llm.script(endless_stream(kind, first, again))
    shown, last, events = stream_outcome(api, crew, kind)
    assert shown == "Use allkeys-lru.", what
    error = error_of(kind, last)
    assert error["code"] == CODE, what
    assert setting in error["message"], what
    assert not any("tenure" in e for e in events)
    assert hung_up(llm) < STREAM_SENDS, what
    assert turns_of(loop_services, crew) == []


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_streamed_answer_whose_text_passes_the_body_bound_ends_in_the_error_event(
    api: TestClient,
    crew: Team,
    llm: ScriptedLLM,
    loop_services: Services,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """Shown as it comes, a stream's text is still kept whole (the turn record, the sidecar at its
    end): it is bounded as a whole answer is."""
    monkeypatch.setattr(loop_services.loop.settings.loop, "upstream_max_body_bytes", 200_000)
    llm.script(endless_stream(kind, "Use allkeys-lru.", "lru-" * 1000))
    shown, last, events = stream_outcome(api, crew, kind)
    assert 100_000 < len(shown) <= 200_000
    error = error_of(kind, last)
    assert error["code"] == CODE
    assert "TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES" in error["message"]
    assert not any("tenure" in e for e in events)
    assert hung_up(llm) < STREAM_SENDS
    assert turns_of(loop_services, crew) == []


def asked_uncompressed(llm: ScriptedLLM) -> bool:
    (request,) = llm.requests
    return bool(request["_headers"].get("accept-encoding") == "identity")


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(("shape", "encoding"), [("announced", "gzip"), ("endless", "gzip"), ("endless", "deflate")])
def test_a_compressed_whole_answer_is_bounded_by_what_it_decodes_to(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, kind: str, shape: str, encoding: str
) -> None:
    """A decompression bomb: the proxy asked for gzip and deflate (httpx2's default) and left the
    decoding to httpx2, so the bound depended on how much httpx2 decodes of one read at once. It
    now asks for no compression, and an upstream that compresses anyway is decoded in bounded
    pieces: the bound holds for the decoded answer (with its compressed length announced, ~40 kB
    for 40 MiB, or sent without end), and the connection is closed."""
    if shape == "announced":
        llm.script(Reply(content="x" * (40 * MiB), content_encoding=encoding))
    else:
        llm.script(
            Reply(endless=b"y" * MiB, endless_max_bytes=BOMB_SENDS, endless_pause_s=PAUSE_S, content_encoding=encoding)
        )
    response = ask(api, crew, kind, stream=False)
    assert response.status_code == 502, response.text[:500]
    error = error_of(kind, response.json())
    assert error["code"] == CODE
    assert "TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES" in error["message"]
    assert asked_uncompressed(llm)
    if shape == "endless":
        assert hung_up(llm) < BOMB_SENDS
    assert turns_of(loop_services, crew) == []


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("again", "setting"),
    [
        pytest.param(None, "TENURE_LOOP_UPSTREAM_MAX_EVENT_BYTES", id="endless-line"),
        pytest.param("lru-" * 1000, "TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES", id="endless-text"),
    ],
)
def test_a_compressed_stream_is_bounded_by_what_it_decodes_to(
    api: TestClient,
    crew: Team,
    llm: ScriptedLLM,
    loop_services: Services,
    kind: str,
    again: str | None,
    setting: str,
) -> None:
    """The stream's bounds (an event, the text kept) count its decoded bytes, as they grow."""
    reply = endless_stream(kind, "Use allkeys-lru.", again)
    llm.script(dataclasses.replace(reply, content_encoding="gzip", endless_max_bytes=BOMB_SENDS))
    shown, last, events = stream_outcome(api, crew, kind)
    assert shown.startswith("Use allkeys-lru.")
    error = error_of(kind, last)
    assert error["code"] == CODE
    assert setting in error["message"]
    assert not any("tenure" in e for e in events)
    assert asked_uncompressed(llm)
    assert hung_up(llm) < BOMB_SENDS
    assert turns_of(loop_services, crew) == []


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_compressed_answer_within_the_bounds_is_served(
    api: TestClient, crew: Team, llm: ScriptedLLM, kind: str, stream: bool
) -> None:
    """An upstream that compresses unasked, within the bounds: its answer is decoded as before."""
    llm.script(Reply(content="Use allkeys-lru. " * 2000, chunk_sizes=[300], content_encoding="gzip"))
    if stream:
        text, _, _ = stream_outcome(api, crew, kind)
    else:
        response = ask(api, crew, kind, stream=False)
        assert response.status_code == 200, response.text[:500]
        body = response.json()
        text = body["choices"][0]["message"]["content"] if kind == "openai" else body["content"][0]["text"]
    assert text == "Use allkeys-lru. " * 2000
    assert asked_uncompressed(llm)


def test_an_answer_in_a_coding_the_proxy_cannot_bound_is_refused(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services
) -> None:
    """Brotli, zstd or stacked codings are not decoded (httpx2 decodes them only when their
    optional packages are installed, and read an answer in one it could not decode as if plain)."""
    llm.script(Reply(content="Use allkeys-lru.", headers={"Content-Encoding": "br"}))
    response = ask(api, crew, "openai", stream=False)
    assert response.status_code == 502, response.text[:500]
    error = error_of("openai", response.json())
    assert error["code"] == "upstream_error"
    assert "'br'" in error["message"]
    assert turns_of(loop_services, crew) == []
