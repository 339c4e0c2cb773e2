"""An erase reaches the records still waiting in Redis: injection receipts not yet drained into
the audit index, proxy turns parked while OpenSearch was down, and the entries either outbox set
aside for an operator. Their text is redacted there as :func:`service.storage.erasure.redact`
redacts the index (the same needles, the same fields kept)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import redis

from service.errors import StoreUnavailable
from service.outbox import RedisOutbox
from service.storage import erasure


def redact_outboxes(outboxes: Iterable[RedisOutbox[Any]], tenant_id: str, texts: Iterable[str]) -> int:
    """Redact ``texts`` in the tenant's records waiting in (or set aside by) the Redis outboxes:
    receipts not yet drained, turns parked during an outage. Returns how many were rewritten;
    StoreUnavailable when Redis cannot be read (the erase fails rather than leave them)."""
    wanted = erasure.needles(texts)
    if not wanted:
        return 0
    scrub = functools.partial(erasure.scrub_value, wanted=wanted)
    try:
        return sum(outbox.redact(tenant_id, scrub) for outbox in outboxes)
    except redis.RedisError as exc:
        raise StoreUnavailable("erase: the records waiting in Redis cannot be redacted") from exc
