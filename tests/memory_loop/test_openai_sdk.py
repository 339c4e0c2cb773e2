"""The proxy as the official ``openai`` Python SDK sees it (client from ``tenure_client``'s helper,
against the scripted upstream): the model list, chat with injection and the sidecar stripped
(streaming and not), and failures as the SDK's typed exceptions with the OpenAI error shape.
Also CORS for browser clients when origins are configured."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from tenure_client import Tenure

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.app import create_app
from service.config import Settings
from tests.api.conftest import Team
from tests.memory_loop.conftest import sidecar
from tests.memory_loop.test_proxy import ANSWER, seed_redis


def _openai(api: TestClient, key: str) -> openai.OpenAI:
    return Tenure("http://testserver", key).openai(
        scopes=["domain:code"], session_id="sdk-sess", http_client=api, max_retries=0
    )


def test_models_lists_the_upstreams_models(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    ids = [m.id for m in _openai(api, crew.keys["alice"]).models.list()]
    assert ids == llm.models


def test_chat_through_the_sdk_injects_and_strips(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    redis_id = seed_redis(api, crew.h("alice"))
    client = _openai(api, crew.keys["alice"])
    llm.script(Reply(content=ANSWER + "\n\n" + sidecar()))
    completion = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "What eviction policy for our redis?"}]
    )
    assert completion.choices[0].message.content == ANSWER
    sent = llm.requests[-1]
    assert redis_id in sent["messages"][0]["content"]  # injected from the X-Tenure-Scope header

    for sizes in ([1], [7], [10_000]):
        llm.script(Reply(content=ANSWER + "\n" + sidecar(), chunk_sizes=sizes))
        stream = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "and for redis sessions?"}], stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == ANSWER


def test_a_model_below_the_floor_is_served_with_a_warning(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    llm.script(Reply(content="an answer from an old model"))
    raw = _openai(api, crew.keys["alice"]).chat.completions.with_raw_response.create(
        model="gpt-4", messages=[{"role": "user", "content": "hi"}]
    )
    assert "below the" in raw.headers["x-tenure-warning"]
    assert raw.parse().choices[0].message.content == "an answer from an old model"


def test_failures_are_the_sdks_typed_errors(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    with pytest.raises(openai.AuthenticationError) as unauth:
        _openai(api, "tnr_nokey_nosecret").models.list()
    error = unauth.value.body
    assert isinstance(error, dict) and error["type"] == "authentication_error" and error["code"] == "unauthenticated"
    assert error["request_id"] == unauth.value.response.headers["X-Request-ID"]

    with pytest.raises(openai.AuthenticationError):
        _openai(api, "tnr_nokey_nosecret").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.UnprocessableEntityError) as invalid:  # a body the proxy refuses
        _openai(api, crew.keys["alice"]).chat.completions.create(model="gpt-4o", messages=[])
    assert isinstance(invalid.value.body, dict) and invalid.value.body["type"] == "invalid_request_error"
    assert llm.requests == []  # nothing reached the upstream


@pytest.fixture(scope="module")
def configured(loop_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """An upstream without a model list, configured model ids, and one allowed browser origin."""
    loop = loop_settings.loop.model_copy(update={"models": ["team-default"]})
    api = loop_settings.api.model_copy(update={"cors_origins": ["https://chat.example"]})
    with TestClient(create_app(loop_settings.model_copy(update={"loop": loop, "api": api}))) as client:
        yield client


def test_configured_models_when_the_upstream_has_no_list(configured: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    saved, llm.models = llm.models, []
    try:
        assert [m.id for m in _openai(configured, crew.keys["alice"]).models.list()] == ["team-default"]
    finally:
        llm.models = saved


def test_cors_allows_only_the_configured_origins(configured: TestClient, api: TestClient) -> None:
    preflight = {
        "Origin": "https://chat.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-tenure-scope",
    }
    allowed = configured.options("/v1/chat/completions", headers=preflight)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://chat.example"
    assert "x-tenure-scope" in allowed.headers["access-control-allow-headers"].lower()
    other = configured.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    default = api.options("/v1/chat/completions", headers=preflight)  # not configured: no CORS at all
    assert "access-control-allow-origin" not in default.headers


@pytest.fixture(scope="module")
def limited(loop_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """The same deployment with a budget of two requests per credential (no refill to speak of)."""
    api = loop_settings.api.model_copy(update={"rate_limit_per_s": 0.01, "rate_limit_burst": 2})
    with TestClient(create_app(loop_settings.model_copy(update={"api": api}))) as client:
        yield client


def test_a_rate_limit_is_the_sdks_rate_limit_error(limited: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    client = _openai(limited, crew.keys["bob"])
    llm.script(Reply(content="first"))
    assert client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}]).choices
    client.models.list()
    for call in (
        client.models.list,
        lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}]),
    ):
        with pytest.raises(openai.RateLimitError) as limited_error:
            call()
        error = limited_error.value.body
        assert isinstance(error, dict) and error["type"] == "rate_limit_error" and error["code"] == "rate_limited"
        assert int(limited_error.value.response.headers["Retry-After"]) >= 1
    assert len(llm.requests) == 1  # the refused chat never reached the upstream
    # a colleague's credential has its own bucket
    assert [m.id for m in _openai(limited, crew.keys["alice"]).models.list()] == llm.models


def test_the_openai_routes_document_their_error_shape(api: TestClient) -> None:
    openapi = api.get("/openapi.json").json()
    for path, method, statuses in (
        ("/v1/models", "get", ("401", "429")),
        ("/v1/chat/completions", "post", ("401", "413", "422", "429", "502", "504")),
    ):
        responses = openapi["paths"][path][method]["responses"]
        for status in statuses:
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/OpenAIErrorOut"}, (path, status)
    shape = openapi["components"]["schemas"]["OpenAIErrorDetail"]
    unauth = api.get("/v1/models", headers={"Authorization": "Bearer tnr_nokey_nosecret"})
    assert unauth.status_code == 401
    assert set(shape["required"]) <= set(unauth.json()["error"]) <= set(shape["properties"])
