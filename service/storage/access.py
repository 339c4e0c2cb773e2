"""THE chokepoint: every OpenSearch query over tenant data gets its filters from here.

Nothing else in the code base may build a tenant, owner or scope filter. The rules:
- a tenant's data is only ever read with a ``term`` on ``tenant_id`` from the principal;
- personal scopes (``user:*``, ``domain:*``) are visible to their owner only;
- shared scopes (``project:*``, ``team:*``) are visible to whoever holds the grant, owner or not;
- a scope the principal asked for but holds no grant to silently contributes nothing.
Everything is built from the :class:`Principal` (verified credentials) and never from a request body.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.domain import scopes as scope_rules
from service.domain.accounts import is_operator
from service.domain.principal import Principal

MATCH_NONE: dict[str, Any] = {"match_none": {}}
_ANY_PERSONAL_SCOPE: dict[str, Any] = {
    "bool": {
        "should": [{"prefix": {"scope": f"{kind}:"}} for kind in scope_rules.PERSONAL_KINDS],
        "minimum_should_match": 1,
    }
}


@dataclass(frozen=True)
class ScopeView:
    """Which scopes a query may see. ``labels=None`` means every scope the principal can see."""

    labels: tuple[str, ...] | None

    @classmethod
    def session(cls, labels: Sequence[str]) -> ScopeView:
        """A session's scope list, expanded to parent domains. Empty means 'no scope set'."""
        if not labels:
            return cls(None)
        return cls(tuple(scope_rules.expand_hierarchy(scope_rules.normalize_scopes(labels))))

    @classmethod
    def everything(cls) -> ScopeView:
        return cls(None)


def tenant_filter(principal: Principal) -> dict[str, Any]:
    return {"term": {"tenant_id": principal.tenant_id}}


def visibility_filter(principal: Principal, view: ScopeView) -> dict[str, Any]:
    """Owner/grant/scope clause for ``principal`` under ``view`` (tenant not included)."""
    grants = sorted(principal.shared_grants)
    if view.labels is None:
        # every personal scope of the owner; a shared-scope belief needs a grant even for its author
        personal_clause: dict[str, Any] = {
            "bool": {"filter": [{"term": {"owner_id": principal.user_id}}, _ANY_PERSONAL_SCOPE]}
        }
        shared = grants
        personal_ok = True
    else:
        personal = [s for s in view.labels if scope_rules.is_personal(s)]
        shared = [s for s in view.labels if scope_rules.is_shared(s) and s in principal.shared_grants]
        personal_ok = bool(personal)
        personal_clause = {
            "bool": {"filter": [{"term": {"owner_id": principal.user_id}}, {"terms": {"scope": personal}}]}
        }
    should: list[dict[str, Any]] = []
    if personal_ok:
        should.append(personal_clause)
    if shared:
        should.append({"terms": {"scope": shared}})
    if not should:
        return MATCH_NONE
    return {"bool": {"should": should, "minimum_should_match": 1}}


def access_filters(principal: Principal, view: ScopeView, *, tenant_wide: bool = False) -> list[dict[str, Any]]:
    """The filter list every tenant-data query starts from.

    ``tenant_wide`` (admins only: audit, erase, export) drops the owner/scope clause but never the
    tenant term; asking for it without the admin role yields a filter that matches nothing.
    """
    if tenant_wide:
        return [tenant_filter(principal)] if principal.is_admin else [MATCH_NONE]
    return [tenant_filter(principal), visibility_filter(principal, view)]


def owned_by(principal: Principal) -> dict[str, Any]:
    """Restrict further to the principal's own beliefs (used with the user-edited pinned rule)."""
    return {"term": {"owner_id": principal.user_id}}


def routing(principal: Principal) -> str:
    """Shard routing key: a tenant's beliefs live on one shard of the shared index."""
    return principal.tenant_id


def cross_scope_pinned_filter(principal: Principal) -> dict[str, Any]:
    """The paper's one exception to scope walls: the owner's *user-edited* pinned beliefs in a
    personal scope surface in every session of that owner (never someone else's, never shared)."""
    return {
        "bool": {
            "filter": [
                {"term": {"owner_id": principal.user_id}},
                {"term": {"user_edited": True}},
                _ANY_PERSONAL_SCOPE,
            ]
        }
    }


def vocabulary_filters(principal: Principal) -> list[dict[str, Any]]:
    """The tenant's whole vocabulary (every owner and scope): recall reads the analysed names and
    aliases of its own tenant to choose the exact terms of the caller's relevance query. Those
    terms never leave the process as data; the query that uses them is filtered by
    :func:`access_filters`, so a term of a belief the caller may not see matches nothing. Never
    another tenant's: the tenant term comes from the principal, like everywhere else."""
    return [tenant_filter(principal)]


def admin_filters(principal: Principal) -> list[dict[str, Any]]:
    """Tenant-wide records an admin may read (audit events, users, keys): only the admin's own
    tenant, and nothing at all for a member."""
    return [tenant_filter(principal)] if principal.is_admin else [MATCH_NONE]


def operator_filters(principal: Principal) -> list[dict[str, Any]]:
    """Cross-tenant account records (the list of tenants) an operator may read: no tenant term for
    an operator (an admin of the reserved system tenant), nothing at all for anyone else."""
    return [] if is_operator(principal) else [MATCH_NONE]


def maintenance_filters(tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Cross-tenant scans for scheduled maintenance only (the extraction sweep, the compaction
    planner). They have no principal: they may only return *keys* (tenant, owner, ids, counts)
    that are then processed one tenant at a time through principal-based filters; they never
    return belief or turn content to any caller. ``tenant_id`` narrows a scan to one tenant
    (an admin's trigger); otherwise the caller's narrowing clauses are the whole query."""
    return [] if tenant_id is None else [{"term": {"tenant_id": tenant_id}}]


def maintenance_excluding(tenant_ids: Sequence[str]) -> list[dict[str, Any]]:
    """A maintenance scan over every tenant *except* these (the retention sweep's default limit
    skips tenants that have their own). Narrowing only; returns keys and counts like the rest."""
    return [{"bool": {"must_not": [{"terms": {"tenant_id": list(tenant_ids)}}]}}] if tenant_ids else []


def scope_narrowing(labels: Sequence[str]) -> dict[str, Any]:
    """Restrict a listing to the given scope labels. Narrowing only: it is always combined with
    :func:`access_filters`, so it can hide beliefs but never reveal one."""
    return {"terms": {"scope": list(labels)}}


def owner_narrowing(owners: Sequence[str]) -> dict[str, Any]:
    """Restrict a listing to beliefs of the given owners (an admin's "whose beliefs" filter).
    Narrowing only, like :func:`scope_narrowing`: never a substitute for :func:`access_filters`."""
    return {"terms": {"owner_id": list(owners)}}
