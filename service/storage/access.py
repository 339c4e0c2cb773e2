"""THE chokepoint: every OpenSearch query over tenant data gets its filters from here.

Nothing else in the code base may build a tenant, owner or scope filter. The rules:
- a tenant's data is only ever read with a ``term`` on ``tenant_id`` from the principal;
- personal scopes (``user:*``, ``domain:*``) are visible to their owner only;
- shared scopes (``project:*``, ``team:*``) are visible to whoever holds the grant, owner or not;
- a scope the principal asked for but holds no grant to silently contributes nothing.
Everything is built from the :class:`Principal` (verified credentials) and never from a request body.

The boundary is a type. A query over tenant data for a caller starts from :class:`AccessFilters`,
which only this module can make (:func:`for_principal`, :func:`for_admin`, :func:`for_owner`):
every query builder in ``service/storage`` takes one (``queries.*_body``, ``AccessFilters.query``),
so a user-facing query without them does not type-check, and building one elsewhere fails at
run time. Scheduled maintenance (the extraction sweep, the compaction planner) has no principal and
says so with the other type, :class:`MaintenanceScan` (:func:`maintenance_scan`): keys only, never
content for a caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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


_SEAL = object()  # only this module holds it: AccessFilters and MaintenanceScan are made here


@dataclass(frozen=True)
class AccessFilters:
    """The filter clauses a query over one tenant's data starts from, for one principal.

    ``tenant`` is the tenant term (or ``match_none``), ``visibility`` the owner/scope/grant clauses
    (empty for an admin's tenant-wide view), ``routing`` the tenant's shard. Built only by
    :func:`for_principal`, :func:`for_admin` and :func:`for_owner`."""

    tenant: dict[str, Any]
    visibility: tuple[dict[str, Any], ...]
    routing: str | None  # None only for an operator's cross-tenant read (for_operator)
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("AccessFilters are built only by service.storage.access (the chokepoint)")

    @property
    def clauses(self) -> list[dict[str, Any]]:
        """Every clause, tenant first: the ``bool.filter`` a query starts from."""
        return [self.tenant, *self.visibility]

    def query(self, *narrowing: dict[str, Any], **parts: Any) -> dict[str, Any]:
        """``{"bool": {"filter": [access clauses, *narrowing], **parts}}``: narrowing and the other
        bool parts (``must_not``, ``should``) can hide documents, never reveal one."""
        return {"bool": {"filter": [*self.clauses, *narrowing], **parts}}


@dataclass(frozen=True)
class MaintenanceScan:
    """A scan across tenants by scheduled maintenance, with no principal. It may only return
    *keys* (tenant, owner, ids, counts) that are then processed one tenant at a time through
    :class:`AccessFilters`; never belief or turn content for a caller. ``purpose`` says which
    maintenance job it is (logs, reviews of this module). Built only by :func:`maintenance_scan`."""

    purpose: str
    clauses: tuple[dict[str, Any], ...]
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("MaintenanceScan is built only by service.storage.access.maintenance_scan")

    def query(self, *narrowing: dict[str, Any], **parts: Any) -> dict[str, Any]:
        return {"bool": {"filter": [*self.clauses, *narrowing], **parts}}


def for_principal(principal: Principal, view: ScopeView, *, tenant_wide: bool = False) -> AccessFilters:
    """The filters every tenant-data query of ``principal`` starts from.

    ``tenant_wide`` (admins only: audit, erase, export) drops the owner/scope clause but never the
    tenant term; asking for it without the admin role yields a filter that matches nothing.
    """
    if tenant_wide:
        return for_admin(principal)
    return AccessFilters(tenant_filter(principal), (visibility_filter(principal, view),), routing(principal), _SEAL)


def for_admin(principal: Principal) -> AccessFilters:
    """Tenant-wide records an admin may read (audit events, users, keys, every belief): only the
    admin's own tenant, and nothing at all for a member."""
    tenant = tenant_filter(principal) if principal.is_admin else MATCH_NONE
    return AccessFilters(tenant, (), routing(principal), _SEAL)


def for_owner(principal: Principal) -> AccessFilters:
    """Only the principal's own documents in its tenant, whatever their scope (review items, a
    compaction bucket of the owner)."""
    return AccessFilters(tenant_filter(principal), (owned_by(principal),), routing(principal), _SEAL)


def for_pinned(principal: Principal, view: ScopeView) -> AccessFilters:
    """The pinned tier's filters: what :func:`for_principal` shows, or the paper's one exception to
    scope walls, the owner's *user-edited* pinned beliefs in a personal scope (never someone
    else's, never shared), which surface in every session of that owner."""
    either = {
        "bool": {
            "should": [visibility_filter(principal, view), cross_scope_pinned_filter(principal)],
            "minimum_should_match": 1,
        }
    }
    return AccessFilters(tenant_filter(principal), (either,), routing(principal), _SEAL)


def for_vocabulary(principal: Principal) -> AccessFilters:
    """The tenant's whole vocabulary (every owner and scope): recall reads the analysed names and
    aliases of its own tenant to choose the exact terms of the caller's relevance query. Those
    terms never leave the process as data; the query that uses them is filtered by
    :func:`for_principal`, so a term of a belief the caller may not see matches nothing. Never
    another tenant's: the tenant term comes from the principal, like everywhere else."""
    return AccessFilters(tenant_filter(principal), (), routing(principal), _SEAL)


def for_operator(principal: Principal) -> AccessFilters:
    """Cross-tenant account records (the list of tenants) an operator may read: no tenant term and
    no routing for an operator (an admin of the reserved system tenant), nothing at all for anyone
    else."""
    tenant = {"match_all": {}} if is_operator(principal) else MATCH_NONE
    return AccessFilters(tenant, (), None, _SEAL)


def maintenance_scan(purpose: str, tenant_id: str | None = None) -> MaintenanceScan:
    """Cross-tenant scans for scheduled maintenance only (the extraction sweep, the compaction
    planner). ``tenant_id`` narrows a scan to one tenant (an admin's trigger); otherwise the
    caller's narrowing clauses are the whole query."""
    clauses = () if tenant_id is None else ({"term": {"tenant_id": tenant_id}},)
    return MaintenanceScan(purpose, clauses, _SEAL)


def maintenance_scan_excluding(purpose: str, tenant_ids: Sequence[str]) -> MaintenanceScan:
    """A maintenance scan over every tenant *except* these (the retention sweep's default limit
    skips tenants that have their own). Keys and counts only, like every maintenance scan."""
    clauses = ({"bool": {"must_not": [{"terms": {"tenant_id": list(tenant_ids)}}]}},) if tenant_ids else ()
    return MaintenanceScan(purpose, clauses, _SEAL)


def owned_by(principal: Principal) -> dict[str, Any]:
    """Restrict further to the principal's own beliefs (used with the user-edited pinned rule)."""
    return {"term": {"owner_id": principal.user_id}}


def routing(principal: Principal) -> str:
    """Shard routing key: a tenant's beliefs live on one shard of the shared index."""
    return principal.tenant_id


def cross_scope_pinned_filter(principal: Principal) -> dict[str, Any]:
    """The owner's *user-edited* pinned beliefs in any personal scope (see :func:`for_pinned`)."""
    return {
        "bool": {
            "filter": [
                {"term": {"owner_id": principal.user_id}},
                {"term": {"user_edited": True}},
                _ANY_PERSONAL_SCOPE,
            ]
        }
    }


def scope_narrowing(labels: Sequence[str]) -> dict[str, Any]:
    """Restrict a listing to the given scope labels. Narrowing only: it is always combined with
    :class:`AccessFilters`, so it can hide beliefs but never reveal one."""
    return {"terms": {"scope": list(labels)}}


def owner_narrowing(owners: Sequence[str]) -> dict[str, Any]:
    """Restrict a listing to beliefs of the given owners (an admin's "whose beliefs" filter).
    Narrowing only, like :func:`scope_narrowing`: never a substitute for :class:`AccessFilters`."""
    return {"terms": {"owner_id": list(owners)}}
