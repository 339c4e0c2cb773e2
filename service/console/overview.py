"""The tenant overview figures of the console's home page, read through the storage layer's
principal-filtered aggregations (members: what they may see; admins: the tenant)."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.domain.principal import Principal
from service.recall.audit_trail import AuditTrail
from service.storage import beliefs as belief_storage
from service.storage.beliefs import BeliefStore
from service.storage.turns import TurnStore

INJECTION_DAYS = 14


@dataclass
class Overview:
    total: int
    by_type: list[tuple[str, int]]
    by_lifecycle: list[tuple[str, int]]
    by_scope: list[tuple[str, int]]
    injections_per_day: list[tuple[str, int]] = field(default_factory=list)
    extraction_outcomes: list[tuple[str, int]] = field(default_factory=list)


class OverviewService:
    def __init__(self, store: BeliefStore, audit: AuditTrail, turns: TurnStore):
        self.store = store
        self.audit = audit
        self.turns = turns

    def overview(self, principal: Principal) -> Overview:
        facets = belief_storage.facet_counts(self.store, principal, tenant_wide=principal.is_admin)
        figures = Overview(
            total=facets["total"][0][1],
            by_type=facets["type"],
            by_lifecycle=facets["lifecycle"],
            by_scope=facets["scope"],
        )
        if principal.is_admin:
            figures.injections_per_day = self.audit.daily_counts(principal, "recall", days=INJECTION_DAYS)
            figures.extraction_outcomes = self.turns.outcome_counts(principal)
        return figures
