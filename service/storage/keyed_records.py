"""By-key writes and reads of the record families keyed ``<tenant>:<id>`` and routed by tenant
(turns, review items): create once, load with the concurrency token, save optimistically.

The key embeds the tenant, so a task carrying ``(tenant_id, record_id)`` can only reach that
tenant's record; a loaded record of another tenant (a hand-edited index) reads as absent all the
same. A stored record the model cannot load raises its kind's
:meth:`~service.storage.unreadable.RecordKind.unreadable` (409, naming where an admin erases it).
"""

from __future__ import annotations

from typing import Generic

from opensearchpy import OpenSearch

from service.storage.client import get_routed, index_routed, routed_id
from service.storage.unreadable import M, RecordKind, load_record


class KeyedRecords(Generic[M]):
    """One family's records by key. ``refresh`` is every write's (``"true"``: readable by search
    at once; ``"false"``: durable in the translog, readable by key only)."""

    def __init__(self, client: OpenSearch, alias: str, kind: RecordKind[M], *, refresh: str):
        self.client = client
        self.alias = alias
        self.kind = kind
        self.refresh = refresh

    def _key(self, record: M) -> tuple[str, str]:
        tenant_id, record_id = getattr(record, "tenant_id"), getattr(record, self.kind.id_field)  # noqa: B009
        return str(tenant_id), str(record_id)

    def _write(self, record: M, *, action: str, conflict: str, **options: object) -> None:
        """Index ``record`` under its key; a 409 is :class:`~service.errors.Conflict` saying the
        record ``conflict``."""
        tenant_id, record_id = self._key(record)
        index_routed(
            self.client,
            index=self.alias,
            doc_id=routed_id(tenant_id, record_id),
            body=record.model_dump(mode="json"),
            routing=tenant_id,
            refresh=self.refresh,
            action=action,
            on_conflict=f"{self.kind.named(record_id)} {conflict}",
            **options,
        )

    def create(self, record: M, *, action: str) -> None:
        """Store a new record; :class:`~service.errors.Conflict` if one has its key."""
        self._write(record, action=action, conflict="already exists", op_type="create")

    def save(self, record: M, *, seq_no: int, primary_term: int, action: str) -> None:
        """Replace the record as loaded at ``seq_no``/``primary_term``; Conflict if it changed since."""
        self._write(
            record,
            action=action,
            conflict="changed concurrently",
            if_seq_no=seq_no,
            if_primary_term=primary_term,
        )

    def load(self, tenant_id: str, record_id: str, *, action: str) -> tuple[M, int, int] | None:
        """The record with its concurrency token, or None when the tenant has none by that key."""
        hit = get_routed(
            self.client, index=self.alias, doc_id=routed_id(tenant_id, record_id), routing=tenant_id, action=action
        )
        if hit is None:
            return None
        record = load_record(self.kind, hit.get("_source"), hit_id=record_id)
        if record is None:
            raise self.kind.unreadable(record_id)
        if self._key(record)[0] != tenant_id:  # defence in depth: the key already embeds the tenant
            return None
        return record, int(hit["_seq_no"]), int(hit["_primary_term"])
