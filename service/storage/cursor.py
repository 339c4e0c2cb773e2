"""Opaque pagination cursors: the ``search_after`` sort values of the last hit, base64url JSON."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from service.errors import ValidationFailed


def encode(sort_values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(sort_values, separators=(",", ":")).encode()).decode().rstrip("=")


def decode(cursor: str | None, *, arity: int, types: tuple[type, ...] | None = None) -> list[Any] | None:
    """The sort values of ``cursor``, or None for the first page. ``types`` (one per value) pins
    each value's JSON type, so a forged cursor is a 422 on ``cursor`` rather than a query error."""
    if not cursor:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed(
            "invalid cursor",
            details=[{"loc": ["query", "cursor"], "msg": "not a cursor returned by this API"}],
        ) from exc
    if (
        not isinstance(values, list)
        or len(values) != arity
        or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in values)
        or (types is not None and not all(isinstance(v, t) for v, t in zip(values, types, strict=True)))
    ):
        raise ValidationFailed(
            "invalid cursor",
            details=[{"loc": ["query", "cursor"], "msg": "not a cursor returned by this API"}],
        )
    return values
