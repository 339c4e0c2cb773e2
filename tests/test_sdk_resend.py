"""After a dropped connection the SDK asks again for what reads (a GET, a recall) and never resends
a write: a compose run through the TLS proxy lost a recall's answer once in ~25,000 requests
(docs/operations.md, "Long runs through the TLS proxy")."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from tenure_client import AsyncTenure, ConnectionFailed, Tenure

from tests.test_sdk_parsing import _recall_answer

ANSWER = json.dumps(_recall_answer()).encode()


def _dropping_first(attempts: list[str]) -> httpx.MockTransport:
    """Drops the first request's connection before any answer, then answers a recall."""

    def handle(request: httpx.Request) -> httpx.Response:
        attempts.append(f"{request.method} {request.url.path}")
        if len(attempts) == 1:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        return httpx.Response(200, content=ANSWER)

    return httpx.MockTransport(handle)


def test_a_recall_whose_answer_was_dropped_is_asked_again() -> None:
    attempts: list[str] = []
    with Tenure("http://tenure.test", "key", transport=_dropping_first(attempts), max_retry_wait_s=0.01) as sdk:
        out = sdk.recall("which database?")
    assert attempts == ["POST /v1/recall"] * 2
    assert out.receipt_id == "evt-1"


def test_the_async_client_asks_again_too_and_json_recall_keeps_it() -> None:
    attempts: list[str] = []

    async def recall() -> object:
        transport = _dropping_first(attempts)
        async with AsyncTenure("http://tenure.test", "key", transport=transport, max_retry_wait_s=0.01) as sdk:
            return await sdk.recall_json("which database?")

    assert isinstance(asyncio.run(recall()), dict)
    assert attempts == ["POST /v1/recall"] * 2


def test_a_write_whose_answer_was_dropped_is_not_resent() -> None:
    """The server may have done it: resending a supersede could replace the belief twice. The
    caller decides. (Creates carry their id and are resent: tests/api/test_sdk_resent_writes.py.)"""
    attempts: list[str] = []
    sdk = Tenure("http://tenure.test", "key", transport=_dropping_first(attempts), max_retry_wait_s=0.01)
    with sdk, pytest.raises(ConnectionFailed):
        sdk.beliefs.supersede("b-1", content="Use Postgres 17.")
    assert attempts == ["POST /v1/beliefs/b-1/supersede"]


def test_no_resend_when_retries_are_off() -> None:
    attempts: list[str] = []
    sdk = Tenure("http://tenure.test", "key", transport=_dropping_first(attempts), max_retries=0)
    with sdk, pytest.raises(ConnectionFailed):
        sdk.recall("which database?")
    assert attempts == ["POST /v1/recall"]
