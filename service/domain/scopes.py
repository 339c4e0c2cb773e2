"""Scope labels: the hard walls around beliefs.

``user:universal``            everywhere, for its owner (reaches sessions through the persona prelude)
``domain:<slug>[/<sub>...]``  a discipline of its owner; a sub-domain session also sees its parents
``project:<slug>``            shared with every user granted that project
``team:<slug>``               shared with every user granted that team

``user:*`` and ``domain:*`` are personal: only the owner ever sees them. ``project:*`` and
``team:*`` are shared: visibility comes from grants, never from ownership.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

UNIVERSAL = "user:universal"
LEGACY_UNIVERSAL = "universal"
UNIVERSAL_LABELS = (UNIVERSAL, LEGACY_UNIVERSAL)

_SLUG = r"[a-z0-9][a-z0-9_.-]{0,63}"
SCOPE_RE = re.compile(
    rf"^(?:user:universal|user:{_SLUG}|domain:{_SLUG}(?:/{_SLUG}){{0,7}}|project:{_SLUG}|team:{_SLUG})$"
)
PERSONAL_KINDS = ("user", "domain")
SHARED_KINDS = ("project", "team")
MAX_SCOPES = 32


class InvalidScope(ValueError):
    pass


def normalize_scope(label: str) -> str:
    """Lower-case, trim, map the legacy ``universal``; raise :class:`InvalidScope` if malformed."""
    value = label.strip().lower()
    if value == LEGACY_UNIVERSAL:
        return UNIVERSAL
    if not SCOPE_RE.match(value):
        raise InvalidScope(
            f"invalid scope label {label!r}: expected user:universal, domain:<slug>[/<sub>], "
            "project:<slug> or team:<slug> (lower-case letters, digits, '_', '-', '.')"
        )
    return value


def normalize_scopes(labels: Iterable[str]) -> list[str]:
    out: list[str] = []
    for label in labels:
        value = normalize_scope(label)
        if value not in out:
            out.append(value)
    if len(out) > MAX_SCOPES:
        raise InvalidScope(f"at most {MAX_SCOPES} scope labels are allowed, got {len(out)}")
    return out


def kind(label: str) -> str:
    return label.split(":", 1)[0]


def is_shared(label: str) -> bool:
    return kind(label) in SHARED_KINDS


def is_personal(label: str) -> bool:
    return kind(label) in PERSONAL_KINDS


def expand_hierarchy(labels: Iterable[str]) -> list[str]:
    """``domain:code/python/async`` -> itself, ``domain:code/python``, ``domain:code``.

    A session in a sub-domain sees its parents; a parent session does not see sub-domains.
    """
    out: list[str] = []
    for label in labels:
        parts = label.split("/")
        for cut in range(len(parts), 0, -1):
            candidate = "/".join(parts[:cut])
            if candidate not in out:
                out.append(candidate)
    return out
