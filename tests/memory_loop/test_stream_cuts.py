"""A streamed answer cut at every byte boundary of the sidecar markers, on both ingresses
(``/v1/chat/completions`` and ``/v1/messages``), two ways: the model's text split into two deltas
at each boundary, and the upstream's raw SSE body split into two HTTP chunks at each byte (inside
the JSON event, inside the marker, inside the multi-byte characters right before it). The client
must see exactly the visible text, never a byte of a marker or of the block, and the turn must
still be parsed from the whole answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.extraction.sidecar import BEGIN, END
from tests.api.conftest import Team
from tests.memory_loop.conftest import sidecar

VISIBLE = "Grüße: use allkeys-lru for the 日本語"  # multi-byte characters right before the marker
BLOCK = sidecar(entity_updates=[{"canonical_name": "redis_cache", "new_aliases": ["lru"]}])
REPLY = VISIBLE + BLOCK
LEAKS = ("<<<", ">>>", "SIDECAR", "turn_signal", "entity_updates")
PRE = len("日本語".encode())  # cuts start this many bytes before the begin marker


def _stream(api: TestClient, crew: Team, kind: str) -> tuple[str, str, dict[str, Any]]:
    """(raw response, the visible text, the tenure object) of one streamed request."""
    message = [{"role": "user", "content": "which eviction policy?"}]
    if kind == "openai":
        body = {"model": "gpt-4o", "stream": True, "messages": message}
        response = api.post("/v1/chat/completions", json=body, headers=crew.h("alice"))
    else:
        body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "stream": True, "messages": message}
        response = api.post("/v1/messages", json=body, headers={"x-api-key": crew.keys["alice"]})
    assert response.status_code == 200, response.text
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    if kind == "openai":
        text = "".join((e["choices"][0].get("delta") or {}).get("content") or "" for e in events if e.get("choices"))
        return response.text, text, events[-1]["tenure"]
    text = "".join(
        e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )
    return response.text, text, next(e["tenure"] for e in events if e["type"] == "message_delta")


def _check(raw: str, text: str, tenure: dict[str, Any], where: str) -> None:
    assert text == VISIBLE, where
    leaked = [fragment for fragment in LEAKS if fragment in raw]
    assert leaked == [], where
    assert tenure["parse_status"] == "parsed", where


def _text_cuts() -> list[int]:
    """Every character offset from just before the begin marker to just after the end marker's
    (both markers are ASCII: each offset inside them is a byte boundary)."""
    begin, end = REPLY.index(BEGIN), REPLY.index(END)
    return [*range(begin - 1, begin + len(BEGIN) + 2), *range(end - 1, end + len(END) + 1)]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_text_split_at_every_marker_boundary(api: TestClient, crew: Team, llm: ScriptedLLM, kind: str) -> None:
    for at in _text_cuts():
        llm.script(Reply(content=REPLY, chunk_sizes=[at, len(REPLY)]))
        raw, text, tenure = _stream(api, crew, kind)
        _check(raw, text, tenure, f"{kind}: text cut at {at}")


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_raw_stream_split_at_every_marker_byte(api: TestClient, crew: Team, llm: ScriptedLLM, kind: str) -> None:
    """The whole answer in one event; its bytes on the wire cut once, at every byte from inside
    the multi-byte characters before the begin marker to past the end marker."""
    spans = [(BEGIN.encode(), range(-PRE, len(BEGIN) + 1)), (END.encode(), range(0, len(END) + 1))]
    for marker, offsets in spans:
        for at in offsets:
            llm.script(Reply(content=REPLY, chunk_sizes=[len(REPLY)], byte_cuts=[at], cuts_from=marker))
            raw, text, tenure = _stream(api, crew, kind)
            _check(raw, text, tenure, f"{kind}: body cut at {marker.decode()}{at:+d}")
