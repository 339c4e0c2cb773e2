"""Schemathesis over the OpenAI-compatible chat proxy, which the API fuzz leaves out because it
calls an upstream model: here the upstream is the scripted model on loopback, so whatever the
generated request, the proxy answers without a 5xx of its own (a 502/504 would mean the upstream
failed, which the scripted model never does), and every error is in the OpenAI error shape."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from opensearchpy import OpenSearch
from pydantic import SecretStr

from loadtest.scripted_llm import ScriptedLLM
from service.app import create_app
from service.config import Settings
from tests.api.conftest import Team, make_team

schemathesis.experimental.OPEN_API_3_1.enable()

PATHS = ("/v1/chat/completions", "/v1/models")


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def proxy_app(api_settings: Settings, os_client: OpenSearch, scripted: ScriptedLLM) -> FastAPI:
    loop = api_settings.loop.model_copy(
        update={"upstream_base_url": scripted.base_url, "upstream_api_key": SecretStr("sk-scripted")}
    )
    celery = api_settings.celery.model_copy(update={"queue_prefix": f"fuzz-{uuid.uuid4().hex[:8]}"})
    return create_app(api_settings.model_copy(update={"loop": loop, "celery": celery}))


@pytest.fixture(scope="module")
def proxy_client(proxy_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(proxy_app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def proxy_team(proxy_client: TestClient, operator: dict[str, str]) -> Team:
    return make_team(proxy_client, operator)


@pytest.fixture(scope="module")
def proxy_schema(proxy_app: FastAPI) -> Any:
    raw = copy.deepcopy(proxy_app.openapi())
    raw["paths"] = {p: v for p, v in raw["paths"].items() if p in PATHS}
    return schemathesis.from_dict(raw)


schema = schemathesis.from_pytest_fixture("proxy_schema")


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_proxy_never_fails_on_input(case: Any, proxy_client: TestClient, proxy_team: Team) -> None:
    kwargs = case.as_transport_kwargs()
    kwargs.pop("base_url", None)
    method, url = kwargs.pop("method"), kwargs.pop("url")
    headers = {k: v.encode() if isinstance(v, str) else v for k, v in (kwargs.pop("headers", None) or {}).items()}
    headers["Authorization"] = proxy_team.h("alice")["Authorization"].encode()
    kwargs["headers"] = headers
    response = proxy_client.request(method, url, **kwargs)
    assert response.status_code < 500, f"{method} {url} -> {response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        assert response.json()["error"]["message"]
