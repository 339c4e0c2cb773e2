"""All OpenSearch access for the review queue (``<namespace>-reviews``): belief conflicts found by
extraction and alias candidates waiting for a decision.

Items are keyed ``<tenant>:<review id>`` with deterministic ids, so a retried extraction never files
the same conflict twice. Members see their own items; admins list the whole tenant. Filters come
from :mod:`service.storage.access`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from opensearchpy import OpenSearch
from pydantic import BaseModel, ConfigDict, Field

from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import Conflict, NotFound
from service.storage import access
from service.storage.client import translate_errors
from service.storage.keyed_records import KeyedRecords
from service.storage.templates import REVIEWS as REVIEWS  # re-exported: defined in the registry
from service.storage.unreadable import Loaded, RecordKind, load_record, load_records

ReviewKind = Literal["conflict", "alias_candidate"]
ReviewStatus = Literal["open", "resolved", "dismissed"]


class ReviewItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    review_id: str
    kind: ReviewKind
    status: ReviewStatus = "open"
    owner_id: str
    scope: list[str] = Field(default_factory=list)
    belief_id: str | None = None
    canonical_name: str | None = None
    surface: str | None = None
    reason: str = ""
    paper_outcome: str | None = None
    proposed: dict[str, Any] | None = None
    session_id: str | None = None
    turn_ids: list[str] = Field(default_factory=list)
    sightings: int = 1
    resolved_at: datetime | None = None
    resolved_by: str | None = None
    resolution: str | None = None
    result_belief_id: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


REVIEW_RECORDS = RecordKind("review", ReviewItem, "review_id", noun="review item")


class ReviewStore:
    def __init__(self, client: OpenSearch, namespace: str):
        self.client = client
        self.alias = REVIEWS.alias(namespace)
        self.records = KeyedRecords(client, self.alias, REVIEW_RECORDS, refresh="true")

    def create(self, item: ReviewItem) -> bool:
        """File an item; False (and no change) if an item with this id already exists."""
        try:
            self.records.create(item, action="file a review item")
        except Conflict:
            return False
        return True

    def load(self, tenant_id: str, review_id: str) -> tuple[ReviewItem, int, int] | None:
        """By key (workers: the key embeds the tenant); None if absent, Unreadable if it cannot be
        loaded."""
        return self.records.load(tenant_id, review_id, action="read a review item")

    def save(self, item: ReviewItem, *, seq_no: int, primary_term: int) -> None:
        item.updated_at = utcnow()
        self.records.save(item, seq_no=seq_no, primary_term=primary_term, action="update a review item")

    @staticmethod
    def _filters(principal: Principal, tenant_wide: bool) -> access.AccessFilters:
        return access.for_admin(principal) if tenant_wide else access.for_owner(principal)

    def list(
        self,
        principal: Principal,
        *,
        kind: ReviewKind | None = None,
        status: ReviewStatus | None = "open",
        tenant_wide: bool = False,
        size: int = 50,
    ) -> Loaded[ReviewItem]:
        """Newest first. ``tenant_wide`` (admins) lists every user's items of the tenant. Items that
        cannot be loaded are skipped (their ids in ``quarantined``)."""
        narrow: list[dict[str, Any]] = []
        if kind:
            narrow.append({"term": {"kind": kind}})
        if status:
            narrow.append({"term": {"status": status}})
        filters = self._filters(principal, tenant_wide)
        body = {
            "size": size,
            "query": filters.query(*narrow),
            "sort": [{"created_at": "desc"}, {"review_id": "asc"}],
        }
        with translate_errors("list review items"):
            rows = self.client.search(index=self.alias, body=body, routing=filters.routing)
        return load_records(REVIEW_RECORDS, rows["hits"]["hits"])

    def get(self, principal: Principal, review_id: str, *, tenant_wide: bool = False) -> ReviewItem:
        filters = self._filters(principal, tenant_wide)
        body = {"size": 1, "query": filters.query({"term": {"review_id": review_id}})}
        with translate_errors("read a review item"):
            rows = self.client.search(index=self.alias, body=body, routing=filters.routing)
        hits = rows["hits"]["hits"]
        if not hits:
            raise NotFound(f"review item {review_id!r} not found")
        item = load_record(REVIEW_RECORDS, hits[0].get("_source"), hit_id=review_id)
        if item is None:
            raise REVIEW_RECORDS.unreadable(review_id)
        return item
