"""Shortening text for a reader never splits what the reader sees as one character."""

from __future__ import annotations

import pytest

from service.domain.text import clip


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("セッションストアの設定", 5, "セッション"),
        ("cafe\u0301s", 4, "caf"),  # e + combining acute stays whole
        ("ok\U0001f44d\U0001f3fdyes", 3, "ok"),  # thumbs up + skin tone
        ("a\U0001f468\u200d\U0001f4bbb", 3, "a"),  # man + ZWJ + laptop
        ("\u1100\u1161\u11a8\u1100\u1161", 2, ""),  # conjoining jamo of one syllable
        ("short", 10, "short"),
    ],
)
def test_clip_cuts_between_graphemes(text: str, limit: int, expected: str) -> None:
    assert clip(text, limit) == expected
