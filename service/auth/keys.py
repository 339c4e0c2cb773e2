"""API key format and hashing.

A key reads ``tnr_<key id>_<secret>``: the ``tnr_`` prefix makes leaked keys recognisable in logs
and by secret scanners, the key id (16 hex chars) is the lookup handle and is safe to log, and the
secret (256 random bits) is shown once and stored only as an HMAC-SHA256 under the server pepper.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "tnr_"
_KEY_RE = re.compile(r"^tnr_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_SECRET_IN_TEXT = re.compile(r"(tnr_[0-9a-f]{16}_)[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class NewKey:
    key_id: str
    plaintext: str


def generate() -> NewKey:
    key_id = secrets.token_hex(8)
    return NewKey(key_id=key_id, plaintext=f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}")


def looks_like_key(token: str) -> bool:
    return token.startswith(PREFIX)


def parse_key_id(token: str) -> str | None:
    match = _KEY_RE.match(token)
    return match.group(1) if match else None


def redacted(text: str) -> str:
    """``text`` with the secret of every API key in it replaced (the key id, safe to log, stays):
    for what is logged as sent, such as a request path a client put a whole key into."""
    return _SECRET_IN_TEXT.sub(r"\1[redacted]", text) if PREFIX in text else text


def hash_key(plaintext: str, pepper: str) -> str:
    return hmac.new(pepper.encode(), plaintext.encode(), hashlib.sha256).hexdigest()


def matches(plaintext: str, stored_hash: str, pepper: str) -> bool:
    return hmac.compare_digest(hash_key(plaintext, pepper), stored_hash)
