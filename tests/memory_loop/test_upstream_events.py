"""The upstream's server-sent events as the proxy reads them (httpx2's parser underneath)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest

from service.errors import ErrorCode
from service.proxy.upstream import Upstream, UpstreamFailure


def _events(
    body: bytes, content_type: str = "text/event-stream; charset=utf-8", max_event_bytes: int = 1024 * 1024
) -> list[dict[str, Any]]:
    response = httpx2.Response(
        200,
        headers={"content-type": content_type},
        stream=httpx2.ByteStream(body),
        request=httpx2.Request("POST", "http://upstream.test/chat/completions"),  # as a real answer has
    )

    async def read() -> list[dict[str, Any]]:
        return [event async for event in Upstream.events(response, max_event_bytes)]

    return asyncio.run(read())


def test_json_events_until_done_whatever_the_line_endings() -> None:
    body = (
        b": keep-alive comment\r\n\r\n"
        b'data: {"choices": [{"delta": {"content": "Hel"}}]}\r\n\r\n'
        b'event: message\ndata: {"choices": [{"delta": {"content": "lo"}}]}\n\n'
        b"data: not json\n\n"
        b"data: [1, 2]\n\n"
        b"data: [DONE]\n\n"
        b'data: {"after": "done"}\n\n'
    )
    assert _events(body) == [
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo"}}]},
    ]


def test_an_event_split_over_data_lines_is_joined() -> None:
    assert _events(b'data: {"a":\ndata: 1}\n\n') == [{"a": 1}]


def test_a_stream_that_is_not_server_sent_events_is_refused() -> None:
    with pytest.raises(httpx2.SSEError):
        _events(b'{"choices": []}', content_type="application/json")


def test_an_endless_event_is_refused_before_it_fills_memory() -> None:
    # one event's data lines are held until its blank line: an upstream that never sends one
    # would grow that buffer without end; the parser stops it at 1 MB (relayed as a broken stream)
    line = b"data: " + b"x" * 60_000 + b"\n"
    with pytest.raises(UpstreamFailure, match="TENURE_LOOP_UPSTREAM_MAX_EVENT_BYTES") as refused:
        _events(line * 20 + b"\n")
    assert refused.value.code is ErrorCode.UPSTREAM_ANSWER_TOO_LARGE


def test_the_event_bound_is_the_one_configured() -> None:
    """``upstream_max_event_bytes``: a 100 kB event passes the default, not a 64 kB bound."""
    event = b"data: " + json.dumps({"text": "x" * 100_000}).encode() + b"\n\n"
    assert _events(event) == [{"text": "x" * 100_000}]
    with pytest.raises(UpstreamFailure, match="65536"):
        _events(event, max_event_bytes=65_536)
