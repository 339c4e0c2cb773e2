"""The upstream's server-sent events as the proxy reads them (httpx-sse underneath)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from httpx_sse import SSEError

from service.proxy.upstream import Upstream


def _events(body: bytes, content_type: str = "text/event-stream; charset=utf-8") -> list[dict[str, Any]]:
    response = httpx.Response(200, headers={"content-type": content_type}, stream=httpx.ByteStream(body))

    async def read() -> list[dict[str, Any]]:
        return [event async for event in Upstream.events(response)]

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
    with pytest.raises(SSEError):
        _events(b'{"choices": []}', content_type="application/json")
