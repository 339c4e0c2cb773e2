"""Reading the audit trail: pending injection receipts are drained and the index refreshed first,
so an admin reads every event the service has acknowledged (read-your-writes over the receipt
outbox and over the audit index's 30-s refresh interval)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import redis

from service.domain.principal import Principal
from service.errors import StoreUnavailable
from service.recall.receipts import ReceiptOutbox
from service.storage.audit import AuditEvent, AuditQuery, AuditStore
from service.storage.unreadable import Loaded

log = logging.getLogger(__name__)
EXPORT_PAGE = 500


class AuditTrail:
    def __init__(self, store: AuditStore, receipts: ReceiptOutbox):
        self.store = store
        self.receipts = receipts

    def search(
        self, principal: Principal, query: AuditQuery, *, size: int, after: str | None
    ) -> tuple[Loaded[AuditEvent], str | None]:
        self._drain_pending()
        return self.store.search(principal, query, size=size, after=after)

    def daily_counts(self, principal: Principal, action: str, *, days: int) -> list[tuple[str, int]]:
        """Events of one action per UTC day (pending receipts drained first, so they count)."""
        self._drain_pending()
        return self.store.daily_counts(principal, action, days=days)

    def export(self, principal: Principal, query: AuditQuery, *, limit: int) -> Iterator[AuditEvent]:
        """Every event of a filtered view, newest first, at most ``limit`` (pending receipts are
        drained once, before the first page)."""
        self._drain_pending()
        after: str | None = None
        sent = 0
        while sent < limit:
            page, after = self.store.search(principal, query, size=min(EXPORT_PAGE, limit - sent), after=after)
            yield from page
            sent += len(page)
            if after is None:
                return

    def drain_pending(self) -> None:
        """Move receipts waiting in the Redis outbox into the audit index (best effort). Searchable
        after the index's next refresh: an erasure refreshes before it rewrites."""
        if not self.receipts.enabled:
            return
        try:
            self.receipts.drain()
        except redis.RedisError as exc:
            # the receipts are safe in Redis; this page may miss the newest until Redis is back
            log.warning("audit read without draining pending receipts: %s", exc)

    def drain_before_erase(self) -> None:
        """Move every pending receipt into the audit index, or fail: an erase redacts the index,
        and a receipt still in Redis would arrive afterwards with the erased text in its query."""
        if not self.receipts.enabled:
            return
        try:
            self.receipts.drain()
        except redis.RedisError as exc:
            raise StoreUnavailable("erase: the pending injection receipts cannot be read from Redis") from exc

    def _drain_pending(self) -> None:
        """Before a read: drain, then refresh. The index refreshes only every 30 s (its template):
        events written since, drained receipts and directly written events alike, become
        searchable here. Admin reads are rare; one refresh each is cheap next to a scheduled one
        every second."""
        self.drain_pending()
        self.store.refresh()
