"""Sidecar splitting and the streaming stripper: nothing of the marker or block ever leaks."""

from __future__ import annotations

import json
import random
import time

import pytest

from service.extraction.sidecar import BEGIN, END, ParseStatus, StreamStripper, split_sidecar

BLOCK = BEGIN + json.dumps({"turn_signal": "substantive", "new_beliefs": []}) + END
ANSWERS = [
    "Use allkeys-lru.",
    "Tricky: <<< is not a marker, nor is <<<SIDECAR, nor <<<SIDECAR_JSON>> here.",
    "",
    "Ends with a partial <<<SIDE",
    "line one\n\nline two   \n",
]


def test_split_statuses() -> None:
    assert split_sidecar("hello " + BLOCK) == split_sidecar("hello" + BLOCK)
    parsed = split_sidecar("hello\n\n" + BLOCK)
    assert (parsed.visible, parsed.status) == ("hello", ParseStatus.PARSED)
    assert json.loads(parsed.raw or "")["turn_signal"] == "substantive"
    truncated = split_sidecar('hello\n<<<SIDECAR_JSON>>>{"turn_signal": "subst')
    assert (truncated.visible, truncated.status) == ("hello", ParseStatus.NEEDS_REPAIR)
    assert truncated.raw == '{"turn_signal": "subst'
    missing = split_sidecar("just an answer")
    assert (missing.visible, missing.raw, missing.status) == (
        "just an answer",
        None,
        ParseStatus.MISSING,
    )


def test_last_begin_marker_wins() -> None:
    text = f'quoting the format: {BEGIN}{{}}{END} and then the real one{BEGIN}{{"a": 1}}{END}'
    split = split_sidecar(text)
    assert split.raw == '{"a": 1}'
    assert split.visible.endswith("the real one")


def _stream(text: str, sizes: list[int]) -> tuple[str, StreamStripper]:
    stripper = StreamStripper()
    out: list[str] = []
    at = 0
    i = 0
    while at < len(text):
        size = sizes[i % len(sizes)]
        out.append(stripper.feed(text[at : at + size]))
        at += size
        i += 1
    out.append(stripper.finish())
    return "".join(out), stripper


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("sizes", [[1], [2], [3], [5], [7], [17], [18], [19], [1, 17, 2], [4096]])
def test_stream_never_leaks_and_matches_split(answer: str, sizes: list[int]) -> None:
    for text in (answer + "\n\n" + BLOCK, answer + BLOCK[:-5], answer):
        shown, stripper = _stream(text, sizes)
        assert shown == split_sidecar(text).visible
        assert stripper.full_text == text
        assert BEGIN not in shown
        assert "turn_signal" not in shown


def test_stream_random_boundaries_never_emit_a_marker_prefix_at_the_end() -> None:
    rng = random.Random(7)
    text = "The answer is 42." + BLOCK
    for _ in range(300):
        stripper = StreamStripper()
        shown = ""
        at = 0
        while at < len(text):
            size = rng.randint(1, 25)
            shown += stripper.feed(text[at : at + size])
            # at no point has any prefix of the marker been shown
            assert not any(shown.endswith(BEGIN[:k]) for k in range(1, len(BEGIN) + 1))
            at += size
        shown += stripper.finish()
        assert shown == "The answer is 42."


def test_stream_after_marker_emits_nothing() -> None:
    stripper = StreamStripper()
    assert stripper.feed("hi " + BEGIN) == "hi"
    assert stripper.feed("anything at all, even text after " + END + " more") == ""
    assert stripper.finish() == ""
    assert stripper.marker_seen


def test_whitespace_held_back_is_not_scanned_character_by_character() -> None:
    """Trailing whitespace is held back (a marker may follow it); each chunk scanned all of it
    again in a Python loop, so 1 MB of whitespace in 4 kB chunks cost ~10 s of the event loop."""
    stripper = StreamStripper()
    started = time.monotonic()
    assert stripper.feed("Use allkeys-lru.") == "Use allkeys-lru."
    for _ in range(256):
        assert stripper.feed(" \n" * 2048) == ""
    assert time.monotonic() - started < 2.0
    assert stripper.feed("more") == " \n" * 2048 * 256 + "more"
