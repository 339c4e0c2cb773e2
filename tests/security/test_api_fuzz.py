"""Schemathesis over the whole API, served by a real uvicorn process (service.app:create_app with
the JSON-error HTTP protocol) on the session's real OpenSearch node and Redis server, with the
scripted model on loopback as both upstreams (OpenAI Chat Completions and Anthropic Messages).

Whatever it generates, no operation answers 5xx, and every error is in its route's shape: the
service's (``error.code``, ``error.message``, ``error.request_id``) on the REST API, OpenAI's on
``/v1/chat/completions`` and ``/v1/models``, Anthropic's (``type: error``, ``error.type``,
``error.message``, ``request_id`` at the top level) on ``/v1/messages``. A 502/504 would be the
upstream failing, which the scripted model never does, so those count as failures too.

Bounded for CI: ``TENURE_FUZZ_MAX_EXAMPLES`` examples per operation (default 12) and derandomized
(the same cases every run). ``scripts/fuzz.sh`` runs it longer with a seed it prints
(``TENURE_FUZZ_SEED``), so a failure found there can be replayed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
import redis
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from opensearchpy import OpenSearch

from deploy.localstack import LocalStack, StackConfig
from service.storage.templates import FAMILIES, drop_namespace
from tests.api.conftest import Team, auth, make_team

MAX_EXAMPLES = int(os.environ.get("TENURE_FUZZ_MAX_EXAMPLES", "12"))
# the proxy's three operations take the richest bodies: more examples each (was 60 in process)
PROXY_MAX_EXAMPLES = int(os.environ.get("TENURE_FUZZ_PROXY_MAX_EXAMPLES", str(MAX_EXAMPLES * 4)))
SEED = os.environ.get("TENURE_FUZZ_SEED")
OPENAI_SHAPED = ("/v1/chat/completions", "/v1/models")
ANTHROPIC_SHAPED = ("/v1/messages",)
PROXY = (*OPENAI_SHAPED, *ANTHROPIC_SHAPED)

schemathesis.experimental.OPEN_API_3_1.enable()  # FastAPI emits OpenAPI 3.1


@pytest.fixture(scope="module")
def fuzz_stack(
    tmp_path_factory: pytest.TempPathFactory, opensearch_url: str, redis_url: str, os_client: OpenSearch
) -> Iterator[LocalStack]:
    """uvicorn (one worker) and the scripted model as processes, in a namespace of their own."""
    config = StackConfig(
        root=Path(tmp_path_factory.mktemp("fuzz")),
        opensearch_url=opensearch_url,
        redis_url=redis_url,
        api_workers=1,
        with_worker=False,  # extraction tasks wait in the namespace's queue, dropped below
        with_beat=False,
        namespace=f"fuzz-{uuid.uuid4().hex[:8]}",
        # a generated x-api-key header is a failed authentication: do not let them lock out the run
        env={"TENURE_AUTH_FAILED_AUTH_PER_S": "100000", "TENURE_AUTH_FAILED_AUTH_BURST": "1000000"},
    )
    stack = LocalStack(config)
    config.env["TENURE_LOOP_ANTHROPIC_UPSTREAM_BASE_URL"] = stack.llm_url
    config.env["TENURE_LOOP_ANTHROPIC_UPSTREAM_API_KEY"] = "sk-ant-scripted"
    try:
        with stack:
            yield stack
    finally:
        drop_namespace(os_client, config.namespace, FAMILIES)
        rds: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
        for key in rds.scan_iter(match=f"{config.namespace}*"):
            rds.delete(key)
        rds.close()


@pytest.fixture(scope="module")
def fuzz_team(fuzz_stack: LocalStack) -> Team:
    with httpx.Client(base_url=fuzz_stack.api_url, timeout=60) as http:
        team = make_team(http, auth(fuzz_stack.operator_key()))  # type: ignore[arg-type]
        # something to find: a belief with a known id in each scope kind
        for belief_id, scope in (("b-1", "domain:code"), ("b-2", "project:pay")):
            body = {"id": belief_id, "type": "preference", "canonical_name": belief_id, "content": "c"}
            http.post("/v1/beliefs", json={**body, "scope": [scope]}, headers=team.h("carol"))
    return team


@pytest.fixture(scope="module")
def live_schema(fuzz_stack: LocalStack) -> Any:
    """The schema the running process serves, pointed at it."""
    raw = httpx.get(f"{fuzz_stack.api_url}/openapi.json", timeout=30).json()
    return schemathesis.from_dict(raw, base_url=fuzz_stack.api_url)


schema = schemathesis.from_pytest_fixture("live_schema")


def _bounded(max_examples: int) -> Any:
    def apply(test: Any) -> Any:
        test = settings(
            max_examples=max_examples,
            deadline=None,
            derandomize=SEED is None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )(test)
        return hypothesis.seed(int(SEED))(test) if SEED is not None else test

    return apply


def _assert_error_shape(path: str, response: requests.Response) -> None:
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict), (response.status_code, body)
    if path in ANTHROPIC_SHAPED:
        assert body.get("type") == "error" and error.get("type") and error.get("message"), body
        assert body.get("request_id"), body
    elif path in OPENAI_SHAPED:
        assert error.get("message") and error.get("type") and error.get("request_id"), body
    else:
        assert error.get("code") and error.get("message") and error.get("request_id"), body


def _send(case: Any, stack: LocalStack, team: Team) -> None:
    kwargs = case.as_requests_kwargs(base_url=stack.api_url)
    # Generated header values may be any text: sent as raw bytes (as a real client could), always
    # with a valid credential so requests get past authentication: the tenant admin on the REST
    # API, a member on the proxy (the way it is used).
    headers = {k: v.encode() if isinstance(v, str) else v for k, v in (kwargs.pop("headers", None) or {}).items()}
    user = "alice" if case.path in PROXY else "carol"
    headers["Authorization"] = team.h(user)["Authorization"].encode()
    kwargs["headers"] = headers
    response = requests.request(**kwargs, timeout=60)
    where = f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{where} -> {response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        _assert_error_shape(case.path, response)


@schema.exclude(path=list(PROXY)).parametrize()
@_bounded(MAX_EXAMPLES)
def test_no_rest_operation_answers_5xx(case: Any, fuzz_stack: LocalStack, fuzz_team: Team) -> None:
    _send(case, fuzz_stack, fuzz_team)


@schema.include(path=list(PROXY)).parametrize()
@_bounded(PROXY_MAX_EXAMPLES)
def test_no_proxy_operation_answers_5xx(case: Any, fuzz_stack: LocalStack, fuzz_team: Team) -> None:
    """/v1/chat/completions, /v1/models and /v1/messages with both upstreams configured."""
    _send(case, fuzz_stack, fuzz_team)
