"""Opaque pagination cursors: the ``search_after`` sort values of the last hit, base64url JSON.

Every cursor this API hands out holds a date sort value (epoch milliseconds, a 64-bit long) and an
id. A forged cursor is refused here with a 422 on ``cursor``: a number outside the signed 64-bit
range cannot even be serialised for OpenSearch (it used to be a 500), a non-finite float becomes
``null`` on the wire (a 500 inside OpenSearch), and an oversized string only costs a query.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from service.errors import ValidationFailed

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STRING_CHARS = 512
MAX_CURSOR_CHARS = 4096


def encode(sort_values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(sort_values, separators=(",", ":")).encode()).decode().rstrip("=")


def _invalid() -> ValidationFailed:
    return ValidationFailed(
        "invalid cursor",
        details=[{"loc": ["query", "cursor"], "msg": "not a cursor returned by this API"}],
    )


def _in_range(value: Any) -> bool:
    """A sort value OpenSearch can take back: bool is not a number here, ints are 64-bit, floats
    finite, strings short."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return INT64_MIN <= value <= INT64_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return len(value) <= MAX_STRING_CHARS
    return False


def decode(cursor: str | None, *, arity: int, types: tuple[type, ...] | None = None) -> list[Any] | None:
    """The sort values of ``cursor``, or None for the first page. ``types`` (one per value) pins
    each value's JSON type, so a forged cursor is a 422 on ``cursor`` rather than a query error."""
    if not cursor:
        return None
    if len(cursor) > MAX_CURSOR_CHARS:
        raise _invalid()
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _invalid() from exc
    if (
        not isinstance(values, list)
        or len(values) != arity
        or not all(_in_range(v) for v in values)
        or (types is not None and not all(isinstance(v, t) for v, t in zip(values, types, strict=True)))
    ):
        raise _invalid()
    return values
