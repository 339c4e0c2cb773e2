"""The proxy's checks over a parsed body (service/domain/json_tree.py): the depth walks containers
only, and the surrogate walk is skipped only for a body with no unpaired surrogate escape."""

from __future__ import annotations

import json
import random

import pytest

from service.domain.json_tree import holds_lone_surrogate, nesting_depth


@pytest.mark.parametrize(
    ("value", "depth"),
    [(3, 0), ("x" * 10, 0), ([], 1), ({"a": {"b": [1, [2]]}}, 4), ({"k": "v", "l": [{}]}, 3)],
)
def test_nesting_depth(value: object, depth: int) -> None:
    assert nesting_depth(value) == depth


def test_a_deep_body_is_measured_without_recursion() -> None:
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    assert nesting_depth(deep) == 5001


def test_the_raw_text_gate_never_hides_a_lone_surrogate() -> None:
    """Random strings of pairs, lone halves and plain text, escaped as clients escape them
    (``ensure_ascii``) and not (json.loads decodes bytes with surrogatepass: a surrogate written as
    UTF-8 bytes parses too): the gated answer is the walk's answer every time."""
    rng = random.Random(7)
    pieces = ["a", "é", "🙂", "\ud83d", "\ude42", "\udbff", "\\u", "x\ud800y"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        value = {"messages": [{"content": text, text: [text]}]}
        for ascii_only in (True, False):
            raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
            parsed = json.loads(raw)  # as the request parses it (bytes: decoded with surrogatepass)
            assert holds_lone_surrogate(parsed, raw) == holds_lone_surrogate(parsed), (text, ascii_only)
