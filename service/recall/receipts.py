"""Injection receipts: durable without an fsync on the recall path.

Every recall (API and proxy) records which beliefs it injected. Writing that receipt straight to
the audit index costs a translog fsync per request (p50 ~3 ms, p99 ~19 ms on the dev box), more
than the recall itself. Instead the receipt goes into a Redis outbox (``service/outbox.py``: one
round trip, ~0.1 ms) and is moved into the audit index in bulk by the ``audit.drain_receipts``
beat task and by every audit read (so an admin always reads every acknowledged receipt).

A replayed drain records nothing twice: events keep their id and are created with
``op_type=create`` (409 = already recorded). When Redis is unreachable, or the outbox is full
(the drainer is down), the receipt is written synchronously to the audit index instead: slower,
never lost, never dropped.
"""

from __future__ import annotations

import logging
from functools import partial

import anyio.to_thread
import redis

from service import redis_keys
from service.config import Settings
from service.lean_redis import EventLoopRedis
from service.loops import LoopBound
from service.outbox import RedisOutbox
from service.storage.audit import AuditEvent, AuditStore
from service.telemetry import metrics

log = logging.getLogger(__name__)


def _written_directly(reason: str) -> None:
    """Count a receipt that missed the outbox: every such recall paid a synchronous audit write
    (``tenure_receipts_written_directly_total``; a full outbox means the drainer is down)."""
    metrics.RECEIPTS_WRITTEN_DIRECTLY.labels(reason).inc()


class ReceiptOutbox:
    def __init__(
        self,
        rds: redis.Redis[bytes],
        audit: AuditStore,
        namespace: str,
        *,
        max_pending: int,
        enabled: bool = True,
        async_redis: LoopBound[EventLoopRedis] | None = None,
    ):
        self.enabled = enabled
        self.audit = audit
        self.outbox = RedisOutbox(
            rds, redis_keys.receipts_outbox(namespace), AuditEvent, max_pending=max_pending, async_redis=async_redis
        )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        rds: redis.Redis[bytes],
        audit: AuditStore,
        async_redis: LoopBound[EventLoopRedis] | None = None,
    ) -> ReceiptOutbox:
        return cls(
            rds,
            audit,
            settings.opensearch_namespace,
            max_pending=settings.api.receipt_outbox_max_pending,
            enabled=settings.api.receipt_outbox,
            async_redis=async_redis,
        )

    @property
    def key(self) -> str:
        return self.outbox.key

    @property
    def dead_key(self) -> str:
        return self.outbox.dead_key

    def record(self, event: AuditEvent) -> None:
        """Record durably: in the outbox when possible, otherwise straight into the audit index."""
        if self.enabled:
            try:
                if self.outbox.put(event):
                    return
                _written_directly("outbox_full")
            except redis.RedisError as exc:
                log.warning("receipt outbox unreachable (%s): writing the receipt synchronously", exc)
                _written_directly("redis_unreachable")
        self.audit.append(event)

    async def arecord(self, event: AuditEvent) -> None:
        """:meth:`record` from the event loop: the outbox append is awaited; only the fallback
        (Redis down or the outbox full: a direct, fsynced audit write) runs on a worker thread."""
        if self.enabled and self.outbox.has_async:
            try:
                if await self.outbox.aput(event):
                    return
                _written_directly("outbox_full")
            except redis.RedisError as exc:
                log.warning("receipt outbox unreachable (%s): writing the receipt synchronously", exc)
                _written_directly("redis_unreachable")
            await anyio.to_thread.run_sync(self.audit.append, event)
            return
        await anyio.to_thread.run_sync(self.record, event)

    def pending(self) -> int:
        return self.outbox.pending()

    def drain(self, *, batch: int = 500, refresh: bool = False) -> int:
        """Move every pending receipt into the audit index; returns how many were moved.

        ``refresh`` makes them searchable before returning (audit reads). Raises StoreUnavailable
        (receipts stay pending) when OpenSearch cannot take them, redis errors when Redis is down.
        A receipt OpenSearch refuses for good goes to the outbox's unreadable stream (``dead_key``).
        """
        # a receipt the audit index refuses for good is set aside with the reason, not replayed
        # for ever ahead of every later receipt (and of the erasures, which drain receipts first)
        deliver = partial(self.audit.append_many, refresh=refresh, set_aside=self.outbox.set_aside)
        return self.outbox.drain(deliver, batch=batch)
