"""An upstream cannot hold a non-streamed answer open for as long as it likes, on both ingresses:
httpx2's timeout applies to each read, so an answer trickled a byte at a time (well within the size
bound) held the client's request, an API task and the upstream connection until its last byte.
The whole answer, from sending the request to its last byte, now ends at
``TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S``: a 504 ``upstream_timeout`` in the client's dialect (an
error answer still arriving then: judged by its status), the upstream connection closed (the
scripted upstream sees the hang-up), no turn recorded. A stream may run long, and one that falls
silent ends at the per-read timeout, but one kept open with keep-alives (comments, empty events) and
no content never did: it now ends at ``TENURE_LOOP_UPSTREAM_STREAM_TIMEOUT_S`` with its in-stream
error event."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from service.proxy import models
from tests.api.conftest import Team
from tests.memory_loop.conftest import wait_until
from tests.memory_loop.test_upstream_limits import (
    ANTHROPIC_OPENING,
    anthropic_delta,
    ask,
    hung_up,
    openai_chunk,
    stream_outcome,
    turns_of,
)

DEADLINE_S = 1.0  # this test's TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S
TRICKLE_S = 0.02  # between the bytes of a trickled answer: each of these takes 10 s or more
SLACK_S = 3.0  # the recall before the upstream call, the hang-up, a loaded machine


@pytest.fixture
def short_deadline(loop_services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_services.loop.settings.loop, "upstream_answer_timeout_s", DEADLINE_S)


@pytest.fixture
def short_stream_deadline(loop_services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_services.loop.settings.loop, "upstream_stream_timeout_s", DEADLINE_S)


def timed(api: TestClient, crew: Team, kind: str, *, stream: bool) -> tuple[Any, float]:
    started = time.monotonic()
    response = ask(api, crew, kind, stream=stream)
    return response, time.monotonic() - started


@pytest.mark.usefixtures("short_deadline")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_trickled_whole_answer_ends_at_the_deadline_with_a_504(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, kind: str
) -> None:
    """~700 bytes a byte every 20 ms: the request lasted until the last one (then was served)."""
    llm.script(Reply(content="Use allkeys-lru. " * 24, trickle_s=TRICKLE_S))
    response, took = timed(api, crew, kind, stream=False)
    assert response.status_code == 504, response.text[:500]
    assert DEADLINE_S <= took < DEADLINE_S + SLACK_S
    body = response.json()
    if kind == "anthropic":
        assert body["type"] == "error"
    error = body["error"]
    assert error["type"] == "timeout_error"
    assert error["code"] == "upstream_timeout"
    assert "TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S" in error["message"]
    hung_up(llm)  # the upstream saw the connection closed
    assert turns_of(loop_services, crew) == []


@pytest.mark.usefixtures("short_deadline")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_upstream_silent_past_the_deadline_is_not_waited_for(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream that sends nothing (not even its status line) until well past the deadline:
    the deadline, checked only as pieces arrived, let the request wait for the first one (up to
    the per-read timeout, minutes); it now ends at the deadline."""
    silent_s = DEADLINE_S + SLACK_S + 2.0
    # per-read waits longer than the upstream's silence, as in production (120 s), not this suite's 3 s
    monkeypatch.setattr(loop_services.loop.upstream.client, "timeout", httpx2.Timeout(silent_s + 5.0))
    llm.script(Reply(content="Use allkeys-lru.", delay_s=silent_s))
    response, took = timed(api, crew, kind, stream=False)
    assert response.status_code == 504, response.text[:500]
    assert took < DEADLINE_S + SLACK_S < silent_s, took
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout"
    assert "TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S" in error["message"]
    time.sleep(max(0.0, silent_s - took))  # the scripted upstream finishes its reply before the next test
    assert turns_of(loop_services, crew) == []


@pytest.mark.usefixtures("short_deadline")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_trickled_error_answer_ends_at_the_deadline_with_its_status(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, kind: str, stream: bool
) -> None:
    """An error answer's message was read to its end (up to 64 kB) with no bound but the per-read
    timeout, for a streamed request too: what arrived by the deadline is its message."""
    message = "overloaded " * 64
    error = {"error": {"message": message, "type": "server_error"}}
    if kind == "anthropic":
        error = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    llm.script(Reply(status=500, error=error, trickle_s=TRICKLE_S))
    response, took = timed(api, crew, kind, stream=stream)
    assert response.status_code == 502, response.text[:500]
    assert DEADLINE_S <= took < DEADLINE_S + SLACK_S
    got = response.json()["error"]
    assert got["code"] == "upstream_error"
    assert got["message"].startswith("upstream answered 500: {")
    hung_up(llm)
    assert turns_of(loop_services, crew) == []


@pytest.mark.usefixtures("short_deadline")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_answer_within_the_deadline_is_served(api: TestClient, crew: Team, llm: ScriptedLLM, kind: str) -> None:
    """The deadline is for the whole answer, not one read: a short one trickled within it is served."""
    llm.script(Reply(content="Use allkeys-lru.", trickle_s=0.0005))
    response, _ = timed(api, crew, kind, stream=False)
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    text = body["choices"][0]["message"]["content"] if kind == "openai" else body["content"][0]["text"]
    assert text == "Use allkeys-lru."


KEEP_ALIVE_PAUSE_S = 0.05  # between keep-alives
KEEP_ALIVES = 200  # what the upstream sends before it stops on its own: 10 s of them


def keep_alive(kind: str, shape: str) -> bytes:
    if shape == "comment":  # an SSE comment: no event at all
        return b": keep-alive\n\n"
    if kind == "openai":  # a chunk without text
        return b"data: " + json.dumps(openai_chunk("")).encode() + b"\n\n"
    return b'event: ping\ndata: {"type": "ping"}\n\n'


@pytest.mark.usefixtures("short_stream_deadline")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("shape", ["comment", "empty-event"])
def test_a_stream_kept_open_without_content_ends_at_its_deadline(
    api: TestClient, crew: Team, llm: ScriptedLLM, loop_services: Services, kind: str, shape: str
) -> None:
    """Each keep-alive arrived well within the per-read timeout, and none of them is text the
    relay holds: the stream lasted as long as the upstream kept sending them (here until it
    stopped on its own, then reported as cut short)."""
    opening = (
        [openai_chunk("Use allkeys-lru.")]
        if kind == "openai"
        else [*ANTHROPIC_OPENING, anthropic_delta("Use allkeys-lru.")]
    )
    ping = keep_alive(kind, shape)
    llm.script(
        Reply(
            events=opening,
            done=False,
            endless=ping,
            endless_max_bytes=KEEP_ALIVES * len(ping),
            endless_pause_s=KEEP_ALIVE_PAUSE_S,
        )
    )
    started = time.monotonic()
    shown, last, _ = stream_outcome(api, crew, kind)
    assert DEADLINE_S <= time.monotonic() - started < DEADLINE_S + SLACK_S
    assert shown == "Use allkeys-lru."
    assert last["error"]["code"] == "upstream_timeout"
    assert "TENURE_LOOP_UPSTREAM_STREAM_TIMEOUT_S" in last["error"]["message"]
    assert hung_up(llm) < KEEP_ALIVES * len(ping)
    assert turns_of(loop_services, crew) == []


@pytest.mark.usefixtures("short_stream_deadline")
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stream_within_its_deadline_is_served(api: TestClient, crew: Team, llm: ScriptedLLM, kind: str) -> None:
    """The deadline bounds the stream, not each event: one that ends before it is relayed whole."""
    llm.script(Reply(content="Use allkeys-lru. " * 4, chunk_sizes=[5]))
    shown, last, _ = stream_outcome(api, crew, kind)
    assert shown == "Use allkeys-lru. " * 4
    assert "error" not in last


def test_a_trickled_model_list_ends_at_its_bound(
    api: TestClient, crew: Team, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /v1/models`` asked the upstream with a timeout for each read: a list trickled a byte
    every 50 ms held the request until its end (~7 s here). Its bound (here 1 s) is now for all of
    it; past it the configured ids answer, as for any upstream failure."""
    monkeypatch.setattr(models, "LIST_TIMEOUT_S", DEADLINE_S)
    llm.models_trickle_s = 0.05
    started = time.monotonic()
    listed = api.get("/v1/models", headers=crew.h("alice"))
    assert time.monotonic() - started < DEADLINE_S + SLACK_S
    assert listed.status_code == 200, listed.text[:500]
    assert listed.json() == {"object": "list", "data": []}  # TENURE_LOOP_MODELS: none in these tests
    wait_until(lambda: llm.models_hung_up, timeout=10)
