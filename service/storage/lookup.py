"""Belief look-ups the memory loop needs besides recall: exact name/alias matches for the merger,
bucket listings for compaction, and the key-only compaction planner scan.

Query bodies live here, filters come from :mod:`service.storage.access` (principal-based, or
:func:`access.maintenance_scan` for the planner, which returns keys only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.domain.belief import Belief, normalize_alias
from service.domain.principal import Principal
from service.storage import access
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore
from service.storage.client import translate_errors
from service.storage.queries import LIVE
from service.storage.unreadable import load_beliefs


@dataclass(frozen=True)
class BucketKey:
    """A compaction bucket: one owner's live beliefs of one type (and subtype) in one scope."""

    tenant_id: str
    owner_id: str
    scope: str
    type: str
    subtype: str | None
    count: int


def name_forms(name: str) -> list[str]:
    """``redis_code`` as stored canonical name and as the alias forms it may appear under."""
    forms = [name, normalize_alias(name.replace("_", " ")), normalize_alias(name)]
    return list(dict.fromkeys(f for f in forms if f))


class BeliefLookup:
    def __init__(self, store: BeliefStore):
        self.store = store

    def _search(self, filters: access.AccessFilters, body: dict[str, Any], action: str) -> list[dict[str, Any]]:
        with translate_errors(action):
            result = self.store.client.search(index=self.store.alias, body=body, routing=filters.routing)
        hits: list[dict[str, Any]] = result["hits"]["hits"]
        return hits

    def by_name_or_alias(
        self, principal: Principal, name: str, *, size: int = 10, scopes: list[str] | None = None
    ) -> list[Belief]:
        """Live beliefs the principal may see whose canonical name is ``name`` or whose aliases
        contain it (exact, after normalisation); exact canonical matches first. ``scopes``: only
        those a session in these scopes sees (their parent domains included), not every scope."""
        forms = name_forms(name)
        view = ScopeView.session(scopes) if scopes else ScopeView.everything()
        filters = access.for_principal(principal, view)
        body = {
            "size": size,
            "query": filters.query(
                LIVE,
                should=[
                    {"terms": {"canonical_name.raw": forms, "boost": 10.0}},
                    {"terms": {"aliases.raw": forms, "boost": 1.0}},
                ],
                minimum_should_match=1,
            ),
            "sort": ["_score", {"created_at": "asc"}, {"id": "asc"}],
        }
        rows = self._search(filters, body, "look up a belief by name")
        return list(load_beliefs(self.store.with_logs(rows)))

    def by_canonical_name(self, principal: Principal, name: str, *, scopes: list[str] | None = None) -> list[Belief]:
        return [b for b in self.by_name_or_alias(principal, name, scopes=scopes) if b.canonical_name == name]

    def bucket(
        self, principal: Principal, scope: str, type_: str, subtype: str | None, *, size: int = 500
    ) -> list[Belief]:
        """Live beliefs of the principal (owner) in one compaction bucket, oldest first."""
        filters = access.for_owner(principal)
        narrow: list[dict[str, Any]] = [LIVE, {"term": {"scope": scope}}, {"term": {"type": type_}}]
        must_not: list[dict[str, Any]] = []
        if subtype is None:
            must_not.append({"exists": {"field": "subtype"}})
        else:
            narrow.append({"term": {"subtype": subtype}})
        body = {
            "size": size,
            "query": filters.query(*narrow, must_not=must_not),
            "sort": [{"created_at": "asc"}, {"id": "asc"}],
        }
        rows = self._search(filters, body, "list a compaction bucket")
        return list(load_beliefs(self.store.with_logs(rows)))

    def plan_buckets(self, *, min_count: int, tenant_id: str | None = None, page: int = 500) -> list[BucketKey]:
        """Key-only scan: every (tenant, owner, scope, type, subtype) with >= ``min_count`` live
        beliefs. ``tenant_id`` narrows it to one tenant (the admin trigger)."""
        scan = access.maintenance_scan("compaction planner", tenant_id)
        sources = [
            {"tenant_id": {"terms": {"field": "tenant_id"}}},
            {"owner_id": {"terms": {"field": "owner_id"}}},
            {"scope": {"terms": {"field": "scope"}}},
            {"type": {"terms": {"field": "type"}}},
            {"subtype": {"terms": {"field": "subtype", "missing_bucket": True}}},
        ]
        out: list[BucketKey] = []
        after: dict[str, Any] | None = None
        while True:
            composite: dict[str, Any] = {"size": page, "sources": sources}
            if after:
                composite["after"] = after
            body = {
                "size": 0,
                "query": scan.query(LIVE),
                "aggs": {"buckets": {"composite": composite}},
            }
            with translate_errors("plan compaction"):
                result = self.store.client.search(index=self.store.alias, body=body)
            agg = result["aggregations"]["buckets"]
            for b in agg["buckets"]:
                if b["doc_count"] >= min_count:
                    k = b["key"]
                    out.append(
                        BucketKey(
                            k["tenant_id"],
                            k["owner_id"],
                            k["scope"],
                            k["type"],
                            k["subtype"],
                            b["doc_count"],
                        )
                    )
            after = agg.get("after_key")
            if not after or not agg["buckets"]:
                return out
