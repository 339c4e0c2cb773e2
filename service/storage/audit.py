"""All OpenSearch access for the audit trail (``<namespace>-audit``); the only module touching it.

Append-only: events are created with ``op_type=create`` under a fresh id and never replaced. The one
sanctioned rewrite is erasure: :meth:`AuditStore.erase_payloads` strips the before/after copies of
erased beliefs from their events (the skeleton of who did what, when, stays). Reads are admin-only
and
take their tenant filter from :mod:`service.storage.access`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from opensearchpy import OpenSearch, helpers
from pydantic import BaseModel, ConfigDict, Field

from service.domain.audit import matching_actions
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import Conflict, StoreUnavailable
from service.storage import access, cursor
from service.storage.client import already_exists, bulk_item, refused_for_good, translate_errors
from service.storage.erasure import ERASE_TIMEOUT_S
from service.storage.templates import AUDIT
from service.storage.unreadable import Loaded, RecordKind, load_records


def time_ordered_id() -> str:
    """A UUIDv7 (RFC 9562) as 32 hex digits: 48 bits of Unix milliseconds, then 74 random bits.
    Every event is created under its own id, so the node looks the id up in every segment of the
    shard first (``op_type=create``). Ids in creation order share their leading digits with their
    neighbours, which Lucene finds (and compresses) faster than uniformly random ones: a bulk of 300
    receipts into an audit index of 2.9M events took 13 ms with uuid4 ids, 10 ms with these
    (``benchmarks/audit_id_bench.py``, docs/benchmarks.md)."""
    random_bits = int.from_bytes(os.urandom(10)) & ((1 << 74) - 1)
    value = (time.time_ns() // 1_000_000) << 80 | 0x7 << 76 | (random_bits >> 62) << 64 | 0b10 << 62
    return uuid.UUID(int=value | (random_bits & ((1 << 62) - 1))).hex


class AuditEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_id: str = Field(default_factory=lambda: f"ev-{time_ordered_id()}")
    tenant_id: str
    at: datetime = Field(default_factory=utcnow)
    action: str
    actor_id: str
    actor_kind: str
    credential_id: str | None = None
    belief_ids: list[str] = Field(default_factory=list)
    session_id: str | None = None
    request_id: str | None = None
    scopes: list[str] = Field(default_factory=list)
    query: str | None = None
    injected: list[dict[str, Any]] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    details: dict[str, Any] | None = None
    payload_erased_at: datetime | None = None


class AuditQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_id: str | None = None
    actor_id: str | None = None
    belief_id: str | None = None
    session_id: str | None = None
    action: str | None = None
    request_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


AUDIT_RECORDS = RecordKind("audit_event", AuditEvent, "event_id")

# The fields reads sort or aggregate on (newest first; the console's per-day counts): of the
# keyword fields only these keep doc values in the template (tenure-audit-fields v2), the others
# are only ever filtered on (tests/test_index_templates.py holds the two together).
SORTED_FIELDS = ("at", "event_id")
_SORT = [{field: {"order": "desc"}} for field in SORTED_FIELDS]

# Strip the payload copies; a no-op (not counted) when the event carried none.
_ERASE_SCRIPT = """
boolean had = ctx._source.containsKey('before') && ctx._source.before != null
  || ctx._source.containsKey('after') && ctx._source.after != null;
if (!had) { ctx.op = 'noop'; return; }
ctx._source.remove('before');
ctx._source.remove('after');
ctx._source.payload_erased_at = params.now;
"""


class AuditStore:
    def __init__(self, client: OpenSearch, namespace: str):
        self.client = client
        self.alias = AUDIT.alias(namespace)

    def append(self, event: AuditEvent) -> None:
        body = event.model_dump(mode="json", exclude_none=True)
        with translate_errors("record an audit event"):
            self.client.index(
                index=self.alias,
                id=event.event_id,
                body=body,
                routing=event.tenant_id,
                op_type="create",
                refresh="false",
            )

    def append_once(self, event: AuditEvent) -> None:
        """Create an event whose id is derived from the change it records (a retried task): an
        event that already exists (409: an earlier attempt recorded it) counts as recorded."""
        try:
            with translate_errors("record an audit event", on_conflict="already recorded"):
                self.append(event)
        except Conflict:
            pass

    def append_many(
        self,
        events: list[AuditEvent],
        *,
        refresh: bool = False,
        set_aside: Callable[[AuditEvent, str], None] | None = None,
    ) -> None:
        """Create events in bulk. An event that already exists (409: same id) counts as recorded,
        so replaying a batch after a crash records nothing twice. An event the store could not
        take now (429, 5xx) fails the batch with :class:`StoreUnavailable`, to be replayed.
        An event it refuses for good (a 400 such as ``mapper_parsing_exception``: no replay can
        help) goes to ``set_aside`` with the store's reason when one is given (the receipt drain:
        one bad receipt must not hold back every later one); without it, it fails the batch."""
        if not events:
            return
        actions = (
            {
                "_op_type": "create",
                "_index": self.alias,
                "_id": e.event_id,
                "_routing": e.tenant_id,
                "_source": e.model_dump(mode="json", exclude_none=True),
            }
            for e in events
        )
        with translate_errors("record audit events"):
            _, errors = helpers.bulk(
                self.client,
                actions,
                chunk_size=500,
                raise_on_error=False,
                refresh="true" if refresh else "false",  # admin reads: rare, must see it now
            )
        failed = [bulk_item(e) for e in errors if isinstance(e, dict) and not already_exists(bulk_item(e))]
        if set_aside is not None:
            refused = [info for info in failed if refused_for_good(info)]
            by_id = {e.event_id: e for e in events}
            for info in refused:
                set_aside(by_id[info["_id"]], str(info.get("error"))[:2000])
            failed = [info for info in failed if not refused_for_good(info)]
        if failed:
            raise StoreUnavailable(f"{len(failed)} audit events could not be recorded; retry")

    def search(
        self, principal: Principal, query: AuditQuery, *, size: int, after: str | None
    ) -> tuple[Loaded[AuditEvent], str | None]:
        """One page, newest first. An event that cannot be loaded is skipped (its id in the page's
        ``quarantined``); the cursor follows the last hit, readable or not."""
        filters = access.for_admin(principal)
        body: dict[str, Any] = {
            "size": size,
            "query": filters.query(*self._narrowing(query)),
            "sort": _SORT,
            "track_total_hits": False,
        }
        search_after = cursor.decode(after, arity=2, types=(int, str))
        if search_after is not None:
            body["search_after"] = search_after
        with translate_errors("read the audit trail"):
            hits = self.client.search(index=self.alias, body=body, routing=filters.routing)["hits"]["hits"]
        events = load_records(AUDIT_RECORDS, hits)
        next_cursor = cursor.encode(hits[-1]["sort"]) if len(hits) == size else None
        return events, next_cursor

    @staticmethod
    def _narrowing(query: AuditQuery) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for field, value in (
            ("event_id", query.event_id),
            ("actor_id", query.actor_id),
            ("belief_ids", query.belief_id),
            ("session_id", query.session_id),
            ("request_id", query.request_id),
        ):
            if value is not None:
                out.append({"term": {field: value}})
        if query.action is not None:
            # the current name and the names written before the vocabulary was unified
            out.append({"terms": {"action": matching_actions(query.action)}})
        if query.since or query.until:
            bounds: dict[str, str] = {}
            if query.since:
                bounds["gte"] = query.since.isoformat()
            if query.until:
                bounds["lt"] = query.until.isoformat()
            out.append({"range": {"at": bounds}})
        return out

    def daily_counts(self, principal: Principal, action: str, *, days: int) -> list[tuple[str, int]]:
        """Events of one action per UTC day over the last ``days`` days (admins of the tenant;
        empty days included), oldest first."""
        start = (utcnow() - timedelta(days=days - 1)).strftime("%Y-%m-%d")
        filters = access.for_admin(principal)
        body = {
            "size": 0,
            "query": filters.query({"term": {"action": action}}, {"range": {"at": {"gte": start}}}),
            "aggs": {
                "per_day": {
                    "date_histogram": {
                        "field": "at",
                        "calendar_interval": "day",
                        "format": "yyyy-MM-dd",
                        "min_doc_count": 0,
                        "extended_bounds": {"min": start, "max": utcnow().strftime("%Y-%m-%d")},
                    }
                }
            },
        }
        with translate_errors("count audit events"):
            result = self.client.search(index=self.alias, body=body, routing=filters.routing)
        return [(str(b["key_as_string"]), int(b["doc_count"])) for b in result["aggregations"]["per_day"]["buckets"]]

    def erase_payloads(self, principal: Principal, belief_ids: list[str]) -> int:
        """Strip before/after copies of ``belief_ids`` from the tenant's events; returns a count."""
        if not belief_ids:
            return 0
        filters = access.for_admin(principal)
        with translate_errors("erase audit payloads"):
            # Events appended within the last refresh interval are not searchable yet.
            self.client.indices.refresh(index=self.alias, request_timeout=ERASE_TIMEOUT_S)
            result = self.client.update_by_query(
                index=self.alias,
                routing=filters.routing,
                body={
                    "query": filters.query({"terms": {"belief_ids": belief_ids}}),
                    "script": {
                        "source": _ERASE_SCRIPT,
                        "lang": "painless",
                        "params": {"now": utcnow().isoformat()},
                    },
                },
                conflicts="proceed",
                refresh=True,
                request_timeout=ERASE_TIMEOUT_S,
            )
        return int(result.get("updated", 0))

    def refresh(self) -> None:
        with translate_errors("refresh the audit trail"):
            self.client.indices.refresh(index=self.alias)
