"""An upstream cannot hold a non-streamed answer open for as long as it likes, on both ingresses:
httpx2's timeout applies to each read, so an answer trickled a byte at a time (well within the size
bound) held the client's request, an API task and the upstream connection until its last byte.
The whole answer, from sending the request to its last byte, now ends at
``TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S``: a 504 ``upstream_timeout`` in the client's dialect (an
error answer still arriving then: judged by its status), the upstream connection closed (the
scripted upstream sees the hang-up), no turn recorded."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from tests.api.conftest import Team
from tests.memory_loop.test_upstream_limits import ask, hung_up, turns_of

DEADLINE_S = 1.0  # this test's TENURE_LOOP_UPSTREAM_ANSWER_TIMEOUT_S
TRICKLE_S = 0.02  # between the bytes of a trickled answer: each of these takes 10 s or more
SLACK_S = 3.0  # the recall before the upstream call, the hang-up, a loaded machine


@pytest.fixture
def short_deadline(loop_services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_services.loop.settings.loop, "upstream_answer_timeout_s", DEADLINE_S)


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
