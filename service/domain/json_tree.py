"""Checks over a parsed JSON value (dicts, lists, strings, numbers) that never recurse: a hostile
payload nested a thousand levels deep must not exhaust the stack while it is being checked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from service.domain.visible_text import has_lone_surrogate


def _nodes(value: Any) -> Iterator[tuple[Any, int]]:
    """Every node of ``value`` with its level (the top is level 1), dict keys included."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        yield node, level
        if isinstance(node, dict):
            stack.extend((key, level + 1) for key in node)
            stack.extend((child, level + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, level + 1) for child in node)


def nesting_depth(value: Any) -> int:
    """How many dicts and lists deep ``value`` nests (0 for a scalar)."""
    return max((level for node, level in _nodes(value) if isinstance(node, dict | list)), default=0)


def holds_lone_surrogate(value: Any) -> bool:
    """Whether any string of ``value``, key or value, holds an unpaired UTF-16 surrogate (a JSON
    ``"\\ud800"`` escape decodes to one): no UTF-8 encoder takes it, so it cannot be sent on."""
    return any(isinstance(node, str) and has_lone_surrogate(node) for node, _ in _nodes(value))
