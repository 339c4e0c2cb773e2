"""Quarantined beliefs: stored documents the current model cannot load, as an admin sees them.

Reads skip such a document (:mod:`service.storage.unreadable`); this service lets a tenant admin
find them (a paged scan of the tenant, each stored source checked against the model) and erase one
by id without loading it (:meth:`BeliefLifecycle.erase_unreadable`: the document, the audit
payload copies that name it and the tenant's cached renderings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.auth.actor import Actor
from service.beliefs.lifecycle import BeliefLifecycle, Change, ErasureReceipt
from service.errors import Forbidden
from service.storage import beliefs as belief_storage
from service.storage.unreadable import document_id, why_unreadable

MAX_SCAN_PAGE = 500


@dataclass(frozen=True)
class QuarantinedBelief:
    belief_id: str
    owner_id: str | None
    scope: list[str]
    reason: str


@dataclass(frozen=True)
class QuarantinePage:
    items: list[QuarantinedBelief]
    scanned: int
    next_cursor: str | None


def _listed(source: dict[str, Any], reason: str) -> QuarantinedBelief:
    owner = source.get("owner_id")
    scope = source.get("scope")
    return QuarantinedBelief(
        belief_id=document_id(source),
        owner_id=owner if isinstance(owner, str) else None,
        scope=[s for s in scope if isinstance(s, str)] if isinstance(scope, list) else [],
        reason=reason,
    )


class QuarantineService:
    def __init__(self, lifecycle: BeliefLifecycle):
        self.lifecycle = lifecycle

    def scan(self, actor: Actor, *, size: int, after: str | None) -> QuarantinePage:
        """One page of the tenant's stored beliefs, of which those that cannot be loaded."""
        if not actor.principal.is_admin:
            raise Forbidden("the quarantine needs the admin role")
        sources, next_cursor = belief_storage.raw_tenant_page(
            self.lifecycle.store, actor.principal, size=min(size, MAX_SCAN_PAGE), after=after
        )
        items = [_listed(source, reason) for source in sources if (reason := why_unreadable(source)) is not None]
        return QuarantinePage(items=items, scanned=len(sources), next_cursor=next_cursor)

    def erase(self, actor: Actor, belief_id: str) -> ErasureReceipt:
        return self.lifecycle.erase_unreadable(Change(actor=actor), belief_id)
