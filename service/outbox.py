"""A Redis stream of records waiting to be written to OpenSearch (the transactional-outbox shape).

Two users: injection receipts (``service/recall/receipts.py``: every recall, so no fsync on the
recall path; also any audit event of a change already stored that the audit index refused, so
that no change goes unrecorded) and proxy turns that could not be recorded because OpenSearch was down
(``service/proxy/service.py``: the answer went out, its memory must not be lost).

Durability is the broker's: Redis writes its append-only file before it replies, so a killed
redis-server, API or worker process loses no acknowledged record; only a machine crash can lose
the last second (``appendfsync everysec``), the same bound as an enqueued Celery task. Draining is
at-least-once: a drain that dies between delivering a batch and deleting it from the stream
delivers it again, so every ``deliver`` must be idempotent (records keep their ids and are
created with ``op_type=create``; a 409 means "already there").

The stream is capped (``max_pending``): :meth:`RedisOutbox.put` refuses beyond it, and the caller
writes directly instead (:meth:`RedisOutbox.put_all_if_reachable`: the records of one change all fit,
or none is appended). Nothing is ever trimmed or dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson
import redis
from pydantic import BaseModel, ValidationError

from service import redis_keys
from service.lean_redis import EventLoopRedis
from service.loops import LoopBound, on_loop

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# XADD only while the stream is under its cap; one round trip either way.
_ADD_UNDER_CAP = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[2]) then return false end
return redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
"""

# XADD every record, or none when they do not all fit under the cap (one script: atomic).
_ADD_ALL_UNDER_CAP = """
local n = #ARGV - 1
if redis.call('XLEN', KEYS[1]) + n > tonumber(ARGV[1]) then return false end
for i = 2, #ARGV do redis.call('XADD', KEYS[1], '*', 'e', ARGV[i]) end
return n
"""

REDACT_PAGE = 500  # entries read per round trip when an erase rewrites a stream


def _scrubbed_entry(
    fields: dict[bytes, bytes], tenant_id: str, scrub: Callable[[Any], tuple[Any, int]]
) -> dict[bytes, bytes] | None:
    """An entry's fields with ``scrub`` applied to its record and its set-aside reason, when the
    record is the tenant's and anything changed; None otherwise (an unreadable record names no
    tenant for certain: it is left to the operator who reads the set-aside entries)."""
    try:
        record = orjson.loads(fields.get(b"e", b""))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("tenant_id") != tenant_id:
        return None
    scrubbed, hits = scrub(record)
    reason, reason_hits = scrub(fields[b"reason"].decode(errors="replace")) if b"reason" in fields else ("", 0)
    if not hits and not reason_hits:
        return None
    out = {**fields, b"e": orjson.dumps(scrubbed)}
    if b"reason" in fields:
        out[b"reason"] = str(reason).encode()
    return out


class RedisOutbox(Generic[M]):
    def __init__(
        self,
        rds: redis.Redis[bytes],
        key: str,
        model: type[M],
        *,
        max_pending: int,
        async_redis: LoopBound[EventLoopRedis] | None = None,
    ):
        self.redis = rds
        self.key = key
        self.dead_key = redis_keys.outbox_unreadable(key)
        self.model = model
        self.max_pending = max_pending
        self._add = rds.register_script(_ADD_UNDER_CAP)
        self._add_all = rds.register_script(_ADD_ALL_UNDER_CAP)
        # the same script through the event loop's client (the async recall path's receipts)
        self._aadd = (
            LoopBound(async_redis.client.register_script(_ADD_UNDER_CAP), async_redis.loop) if async_redis else None
        )

    @property
    def has_async(self) -> bool:
        """Whether :meth:`aput` can run here (an async client of the running loop)."""
        return on_loop(self._aadd) is not None

    def put(self, record: M) -> bool:
        """Append durably; False when the stream is full. Raises ``redis.RedisError`` when Redis
        cannot take it: the caller then writes the record directly."""
        return self.hold(record) is not None

    def put_if_reachable(self, record: M) -> bool:
        """:meth:`put` for a fallback: False also when Redis cannot take it (logged), so the
        caller answers the failure it falls back from."""
        try:
            return self.put(record)
        except redis.RedisError as exc:
            log.warning("outbox %s unreachable: %s", self.key, exc)
            return False

    def put_all_if_reachable(self, records: list[M]) -> bool:
        """:meth:`put_if_reachable` for the records of one change: all appended, or none (False)
        when they do not all fit under the cap or Redis cannot take them (logged). A change
        half-queued would reach the trail in part, after its caller answered its failure."""
        try:
            added = self._add_all(keys=[self.key], args=[self.max_pending, *map(self._payload, records)])
        except redis.RedisError as exc:
            log.warning("outbox %s unreachable: %s", self.key, exc)
            return False
        if added is None:
            log.warning(
                "outbox %s cannot take %d records (%d pending at most)", self.key, len(records), self.max_pending
            )
            return False
        return True

    async def aput(self, record: M) -> bool:
        """:meth:`put` through the asynchronous client (only when the outbox was given one)."""
        return await self.ahold(record) is not None

    @staticmethod
    def _payload(record: M) -> bytes:
        return orjson.dumps(record.model_dump(mode="json", exclude_none=True))

    def hold(self, record: M) -> str | None:
        """Append durably like :meth:`put`, for a record its writer means to store itself in a
        moment and then :meth:`release`: if the writer dies first, the next drain stores it.
        Returns the entry's id; None when the stream is full. Raises ``redis.RedisError``."""
        return self._entry_id(self._add(keys=[self.key], args=[self._payload(record), self.max_pending]))

    async def ahold(self, record: M) -> str | None:
        """:meth:`hold` through the asynchronous client (only when the outbox was given one)."""
        add = on_loop(self._aadd)
        if add is None:
            raise RuntimeError("this outbox has no asynchronous Redis client on this event loop")
        return self._entry_id(await add(keys=[self.key], args=[self._payload(record), self.max_pending]))

    def release(self, entry_id: str) -> None:
        """Delete a held entry whose record its writer has stored (a drain that stored it first
        meanwhile is harmless: every delivery is idempotent)."""
        self.redis.xdel(self.key, entry_id)

    def _entry_id(self, reply: object) -> str | None:
        """The id the append script answered with; None (logged) when the stream was full."""
        if reply is None:
            log.warning("outbox %s is full (%d pending)", self.key, self.max_pending)
            return None
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def set_aside(self, record: M, reason: str) -> None:
        """Keep a record its destination refuses for good (not retryable) out of the way of the
        rest, for an operator to inspect: never dropped, never blocking."""
        log.error("outbox %s: record set aside in %s: %s", self.key, self.dead_key, reason)
        payload = orjson.dumps(record.model_dump(mode="json", exclude_none=True))
        self.redis.xadd(self.dead_key, {"e": payload, "reason": reason.encode()[:2000]})

    def redact(self, tenant_id: str, scrub: Callable[[Any], tuple[Any, int]]) -> int:
        """Rewrite the tenant's entries, pending and set aside, that ``scrub`` changes (an erase:
        the erased text must not wait here to reach the index later, nor stay for an operator).
        A rewritten entry goes to the end of its stream; one a drain delivered meanwhile is
        delivered again, harmlessly. Returns how many entries were rewritten."""
        return sum(self._redact_stream(key, tenant_id, scrub) for key in (self.key, self.dead_key))

    def _redact_stream(self, key: str, tenant_id: str, scrub: Callable[[Any], tuple[Any, int]]) -> int:
        rewritten, after = 0, "-"
        while entries := self.redis.xrange(key, min=after, count=REDACT_PAGE):
            for entry_id, fields in entries:
                replacement = _scrubbed_entry(fields, tenant_id, scrub)
                if replacement is not None:
                    self.redis.xadd(key, replacement)  # type: ignore[arg-type]
                    self.redis.xdel(key, entry_id)
                    rewritten += 1
            if len(entries) < REDACT_PAGE:
                break
            after = "(" + entries[-1][0].decode()
        return rewritten

    def pending(self) -> int:
        return int(self.redis.xlen(self.key))

    def drain(self, deliver: Callable[[list[M]], None], *, batch: int = 500) -> int:
        """Deliver every pending record, batch by batch, deleting each batch once delivered.
        Whatever ``deliver`` raises stops the drain with the batch still pending."""
        moved = 0
        while True:
            entries = self.redis.xrange(self.key, count=batch)
            if not entries:
                return moved
            records = self._decode(entries)
            if records:
                deliver(records)
            self.redis.xdel(self.key, *[entry_id for entry_id, _ in entries])
            moved += len(records)
            if len(entries) < batch:
                return moved

    def _decode(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[M]:
        records: list[M] = []
        for entry_id, fields in entries:
            try:
                records.append(self.model.model_validate_json(fields[b"e"]))
            except (KeyError, ValidationError) as exc:
                # kept aside, not dropped: an operator can inspect it; it must not block the rest
                log.error("unreadable outbox entry %s moved to %s: %s", entry_id, self.dead_key, exc)
                self.redis.xadd(self.dead_key, fields)  # type: ignore[arg-type]
        return records
