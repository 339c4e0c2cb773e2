"""Checks over a parsed JSON value (dicts, lists, strings, numbers) that never recurse: a hostile
payload nested a thousand levels deep must not exhaust the stack while it is being checked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from service.domain.visible_text import has_lone_surrogate

# A lone surrogate reaches a parsed value through a JSON escape (``\\ud800``) or as its UTF-8
# bytes (ED A0-BF ..), which json.loads takes: it decodes bytes with surrogatepass.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


def _may_hold_lone_surrogate(raw: bytes) -> bool:
    """Whether JSON text holds a surrogate as UTF-8 bytes, an escape of a high surrogate not
    followed at once by one of a low surrogate, or of a low one not preceded by a high one. A
    gate only (the walk decides): a contrived escaped backslash before a pair could slip past it,
    and then the encoder's refusal upstream is the second layer, a 422 too."""
    if SURROGATE_BYTES.search(raw):
        return True
    pending_high = -1  # where the last high surrogate escape ended, while unpaired
    for found in SURROGATE_ESCAPE.finditer(raw):
        is_high = found.group()[3:4] in b"89abAB"
        if is_high:
            if pending_high >= 0:
                return True  # a high after a high
            pending_high = found.end()
        elif pending_high == found.start():
            pending_high = -1  # its pair
        else:
            return True  # a low without its high
        if pending_high >= 0 and pending_high != found.end():
            return True
    return pending_high >= 0


def _nodes(value: Any) -> Iterator[Any]:
    """Every node of ``value``, dict keys included."""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def nesting_depth(value: Any) -> int:
    """How many dicts and lists deep ``value`` nests (0 for a scalar). Only containers are walked:
    a body of long strings costs its containers, not its text."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


def holds_lone_surrogate(value: Any, raw: bytes | None = None) -> bool:
    """Whether any string of ``value``, key or value, holds an unpaired UTF-16 surrogate (a JSON
    ``"\\ud800"`` escape decodes to one): no UTF-8 encoder takes it, so it cannot be sent on.
    ``raw``: the JSON text ``value`` was parsed from; without an unpaired surrogate escape in it,
    False at once."""
    if raw is not None and not _may_hold_lone_surrogate(raw):
        return False
    return any(isinstance(node, str) and has_lone_surrogate(node) for node in _nodes(value))
