"""Upstream failures as the client sees them, on both ingresses: the upstream's own words are
passed on, never the tenant's upstream key, whatever the provider echoes."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from tests.api.conftest import Team

KEYS = {"openai": "sk-upstream-test", "anthropic": "sk-ant-upstream-test"}  # tests/memory_loop/conftest.py


def ask(api: TestClient, crew: Team, kind: str, **extra: Any) -> Any:
    message = [{"role": "user", "content": "which eviction policy?"}]
    if kind == "openai":
        body = {"model": "gpt-4o", "messages": message, **extra}
        return api.post("/v1/chat/completions", json=body, headers=crew.h("alice"))
    body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": message, **extra}
    return api.post("/v1/messages", json=body, headers={"x-api-key": crew.keys["alice"]})


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("shape", ["json", "text"])
def test_an_upstream_echoing_its_key_does_not_hand_it_to_the_caller(
    api: TestClient, crew: Team, llm: ScriptedLLM, kind: str, stream: bool, shape: str
) -> None:
    key = KEYS[kind]
    said = f"Incorrect API key provided: {key}. You can find your API key at https://example.test."
    error = {"error": {"type": "authentication_error", "message": said}} if shape == "json" else None
    llm.script(Reply(status=401, error=error or {"detail": said}))
    response = ask(api, crew, kind, stream=stream)
    assert response.status_code == 502
    assert key not in response.text
    assert "Incorrect API key provided" in response.json()["error"]["message"]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_rate_limit_keeps_its_retry_after(
    api: TestClient, crew: Team, llm: ScriptedLLM, kind: str, stream: bool
) -> None:
    """The provider's wait reaches the caller, whose SDK retries after it (not at once)."""
    llm.script(Reply(status=429, headers={"Retry-After": "17", "retry-after-ms": "17000"}))
    limited = ask(api, crew, kind, stream=stream)
    assert limited.status_code == 429
    assert (limited.headers.get("retry-after"), limited.headers.get("retry-after-ms")) == ("17", "17000")
    llm.script(Reply(status=529, headers={"Retry-After": "3"}))  # Anthropic's "overloaded"
    overloaded = ask(api, crew, kind, stream=stream)
    assert (overloaded.status_code, overloaded.headers.get("retry-after")) == (502, "3")
    llm.script(Reply(status=500))
    assert "retry-after" not in ask(api, crew, kind, stream=stream).headers


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_an_upstream_error_event_mid_stream_does_not_hand_its_key_to_the_caller(
    api: TestClient, crew: Team, llm: ScriptedLLM, kind: str
) -> None:
    """The upstream's own in-stream error event is passed on as sent, less the tenant's key."""
    key = KEYS[kind]
    said = f"Incorrect API key provided: {key}."
    if kind == "openai":
        opening = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o"}
        first = {**opening, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Use"}}]}
        events = [first, {"error": {"message": said, "type": "invalid_request_error"}}]
    else:
        message = {"id": "m1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6", "content": []}
        events = [
            {"type": "message_start", "message": message},
            {"type": "error", "error": {"type": "authentication_error", "message": said}},
        ]
    llm.script(Reply(events=events))
    response = ask(api, crew, kind, stream=True)
    assert response.status_code == 200, response.text
    assert key not in response.text
    assert "Incorrect API key provided: [upstream key]." in response.text
