"""Retention: audit events and proxied turns older than their tenant's limit are deleted.

Why a beat task and not OpenSearch's Index State Management: ISM acts on whole indices (roll
over by age, delete the old index), but every tenant shares one ``<ns>-audit`` and one
``<ns>-turns`` index, so a *per-tenant* retention needs deletes by query on the documents' own
timestamps. (ISM is also a plugin the development node, built from Maven Central jars, does not
have.) The sweep is idempotent, like ``apply-templates``: each run deletes what is older than the
limits in force at that moment, so changing a limit takes effect on the next run and a failed run
is simply repeated.

The tenant walls still hold: every delete is narrowed by :func:`access.maintenance_scan` (one
tenant, or the default limit for every tenant *without* an override), and returns only counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from opensearchpy import OpenSearch

from service.config import RetentionSettings
from service.storage import access
from service.storage.client import translate_errors
from service.storage.templates import AUDIT, TURNS, IndexFamily
from service.telemetry import metrics

# the timestamp each family is aged by; turns still waiting for extraction are never deleted
_AGED_BY = {AUDIT.name: "at", TURNS.name: "created_at"}
_KEEP = {TURNS.name: [{"term": {"extraction_status": "pending"}}]}


@dataclass(frozen=True)
class Expiry:
    family: str
    tenant_id: str | None  # None: every tenant without an override
    days: int
    deleted: int

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.family, "tenant_id": self.tenant_id, "days": self.days, "deleted": self.deleted}


class RetentionStore:
    def __init__(self, client: OpenSearch, namespace: str):
        self.client = client
        self.namespace = namespace

    def expire(
        self, family: IndexFamily, before: datetime, *, tenant_id: str | None = None, excluding: list[str] | None = None
    ) -> int:
        """Delete ``family``'s documents older than ``before``: of one tenant, or of every tenant
        but ``excluding``. Returns how many were deleted."""
        aged = {"range": {_AGED_BY[family.name]: {"lt": before.isoformat()}}}
        keep = _KEEP.get(family.name, [])
        narrow = access.maintenance_scan("retention sweep", tenant_id).query(aged, must_not=keep)
        query = access.maintenance_scan_excluding("retention sweep", excluding or []).query(narrow)
        with translate_errors(f"expire old {family.name}"):
            response = self.client.delete_by_query(
                index=family.alias(self.namespace),
                body={"query": query},
                params={"conflicts": "proceed", "refresh": "true", "slices": "auto"},
            )
        deleted = int(response.get("deleted", 0))
        metrics.RETENTION_DELETED.labels(family.name).inc(deleted)
        return deleted


def apply_retention(store: RetentionStore, policy: RetentionSettings, now: datetime) -> list[Expiry]:
    """One sweep: the deployment's limits for tenants without an override, then each override."""
    done: list[Expiry] = []
    overridden = sorted(policy.tenants)
    for family, default in ((AUDIT, policy.audit_days), (TURNS, policy.turns_days)):
        if default > 0:
            deleted = store.expire(family, now - timedelta(days=default), excluding=overridden)
            done.append(Expiry(family.name, None, default, deleted))
        for tenant_id in overridden:
            days = _days(policy, tenant_id, family)
            if days > 0:
                deleted = store.expire(family, now - timedelta(days=days), tenant_id=tenant_id)
                done.append(Expiry(family.name, tenant_id, days, deleted))
    return done


def _days(policy: RetentionSettings, tenant_id: str, family: IndexFamily) -> int:
    limits = policy.for_tenant(tenant_id)
    days = limits.audit_days if family is AUDIT else limits.turns_days
    return days or 0
