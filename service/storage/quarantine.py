"""The quarantine's raw access to the records other than beliefs: turns, review items and audit
events as stored, never parsed, so an admin can find the ones the model cannot load and erase them
by id (beliefs have their own, :func:`service.storage.beliefs.raw_tenant_page`, since erasing one
also touches the tenant's write version and audit payloads).

Every request is the tenant admin's: the chokepoint's :func:`access.for_admin` filter and routing,
so another tenant's record is out of reach even where its document id is not tenant-keyed (audit
events).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opensearchpy import OpenSearch

from service.domain.principal import Principal
from service.errors import NotFound
from service.storage import access, cursor
from service.storage.audit import AUDIT_RECORDS
from service.storage.client import routed_id, translate_errors
from service.storage.reviews import REVIEW_RECORDS
from service.storage.templates import AUDIT, REVIEWS, TURNS, IndexFamily
from service.storage.turns import TURN_RECORDS
from service.storage.unreadable import RecordKind


@dataclass(frozen=True)
class Shelf:
    """Where one kind of record is stored and how a page of them is ordered."""

    kind: RecordKind[Any]
    family: IndexFamily
    date_field: str
    tenant_keyed: bool  # the document id is ``<tenant>:<record id>`` (else the record id alone)

    def alias(self, namespace: str) -> str:
        return self.family.alias(namespace)

    def document_id(self, tenant_id: str, record_id: str) -> str:
        return routed_id(tenant_id, record_id) if self.tenant_keyed else record_id


SHELVES: dict[str, Shelf] = {
    shelf.kind.name: shelf
    for shelf in (
        Shelf(TURN_RECORDS, TURNS, "created_at", tenant_keyed=True),
        Shelf(REVIEW_RECORDS, REVIEWS, "created_at", tenant_keyed=True),
        Shelf(AUDIT_RECORDS, AUDIT, "at", tenant_keyed=False),
    )
}


def raw_page(
    client: OpenSearch, namespace: str, shelf: Shelf, principal: Principal, *, size: int, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the admin's tenant's records of ``shelf`` as stored sources (unparsed), newest
    first, with the cursor of the next page (None at the end)."""
    filters = access.for_admin(principal)
    body: dict[str, Any] = {
        "size": size,
        "query": filters.query(),
        "sort": [
            {shelf.date_field: {"order": "desc", "missing": "_last"}},
            {shelf.kind.id_field: {"order": "asc", "missing": "_last"}},
        ],
        "track_total_hits": False,
    }
    search_after = cursor.decode(after, arity=2, types=(int, str))
    if search_after is not None:
        body["search_after"] = search_after
    with translate_errors(f"scan the tenant's {shelf.kind.name} records"):
        hits = client.search(index=shelf.alias(namespace), body=body, routing=filters.routing)["hits"]["hits"]
    sources = [h["_source"] if isinstance(h.get("_source"), dict) else {} for h in hits]
    if len(hits) < size:
        return sources, None
    last: list[Any] = hits[-1]["sort"]
    # a document without the sort fields sorts last with a null value no cursor can hold: the end
    return sources, (cursor.encode(last) if isinstance(last[0], int) and isinstance(last[1], str) else None)


def raw_source(
    client: OpenSearch, namespace: str, shelf: Shelf, principal: Principal, record_id: str
) -> dict[str, Any] | None:
    """The stored source of one of the tenant's records by id, unparsed (None if absent)."""
    filters = access.for_admin(principal)
    wanted = {"ids": {"values": [shelf.document_id(principal.tenant_id, record_id)]}}
    body = {"size": 1, "query": filters.query(wanted)}
    with translate_errors(f"read a stored {shelf.kind.name} record"):
        hits = client.search(index=shelf.alias(namespace), body=body, routing=filters.routing)["hits"]["hits"]
    source = hits[0].get("_source") if hits else None
    return source if isinstance(source, dict) else None


def delete(client: OpenSearch, namespace: str, shelf: Shelf, principal: Principal, record_id: str) -> bool:
    """Hard-delete one of the tenant's records by id (found first through :func:`raw_source`);
    False if it was already gone."""
    try:
        with translate_errors(f"erase a {shelf.kind.name} record", on_missing="already gone"):
            client.delete(
                index=shelf.alias(namespace),
                id=shelf.document_id(principal.tenant_id, record_id),
                routing=access.routing(principal),
                # "true", not "wait_for": the audit index refreshes only every 30 s, and an admin's
                # rare erasure must neither wait that long nor be seen as still there
                refresh="true",
            )
    except NotFound:
        return False
    return True
