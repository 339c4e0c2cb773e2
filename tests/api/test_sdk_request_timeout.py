"""A request whose body stalls on the way is answered ``408 request_timeout`` by the API's HTTP
protocol (service/api/http_protocol.py) and not acted on: the SDK raised it as a BadRequest, as if
the request were wrong, and never sent it again. It is now a :class:`RequestTimeout`, resent
within ``max_retries`` whatever the call, a write not safe to resend after a 503 included.

The real app under uvicorn with the service's protocol class, its body timeout lowered to 0.3 s;
the first request's body is held up half-way for longer, as a stalled network holds it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from tenure_client import RequestTimeout, Tenure

from service.api.http_protocol import JsonErrorHttpProtocol
from service.app import create_app
from service.config import Settings
from tests.api.conftest import Team, belief_body
from tests.live import serve

BODY_TIMEOUT_S = 0.3


class QuickBodyTimeout(JsonErrorHttpProtocol):
    """The service's protocol with a body timeout short enough for a test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timeouts["body"] = BODY_TIMEOUT_S


class Stalled(httpx.SyncByteStream):
    """A body sent in two halves with a pause longer than the server's body timeout between."""

    def __init__(self, body: bytes):
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        half = len(self.body) // 2
        yield self.body[:half]
        time.sleep(BODY_TIMEOUT_S * 3)
        yield self.body[half:]


class StallsFirstBodies(httpx.BaseTransport):
    """A real HTTP transport on which the body of each of the first ``stalled`` requests stalls."""

    def __init__(self, stalled: int):
        self.inner = httpx.HTTPTransport()
        self.stalled = stalled
        self.statuses: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if len(self.statuses) < self.stalled:
            request.stream = Stalled(request.read())
        response = self.inner.handle_request(request)
        self.statuses.append(response.status_code)
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def api_url(api_settings: Settings, client: TestClient) -> Iterator[str]:
    with serve(create_app(api_settings), http=QuickBodyTimeout) as url:
        yield url


def test_a_408_is_a_request_timeout_not_a_bad_request(api_url: str, team: Team) -> None:
    with (
        StallsFirstBodies(stalled=1) as transport,
        Tenure(api_url, team.keys["alice"], transport=transport, max_retries=0) as alice,
    ):
        with pytest.raises(RequestTimeout) as timed_out:
            alice.beliefs.create(**belief_body(f"stalled_{uuid.uuid4().hex[:8]}", "project:pay"))
        assert (timed_out.value.status, timed_out.value.code) == (408, "request_timeout")
    assert transport.statuses == [408]


def test_a_write_whose_body_stalled_is_sent_again_and_done_once(api_url: str, team: Team) -> None:
    """A supersede, never resent after a 503 or a dropped connection, is resent after a 408: the
    server did nothing with it (its history shows one replacement)."""
    with Tenure(api_url, team.keys["alice"]) as alice:
        old = alice.beliefs.create(**belief_body(f"stalled_{uuid.uuid4().hex[:8]}", "project:pay"))
    with (
        StallsFirstBodies(stalled=2) as transport,
        Tenure(api_url, team.keys["alice"], transport=transport, max_retry_wait_s=0.05) as alice,
    ):
        result = alice.beliefs.supersede(old.id or "", content="Sessions live in Valkey.")
        assert transport.statuses == [408, 408, 201]
        assert result.current.content == "Sessions live in Valkey."
        history = alice.beliefs.history(result.current.id or "")
    assert [b.id for b in history.chain] == [old.id, result.current.id]
