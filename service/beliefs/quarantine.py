"""Quarantined records: stored documents the current model cannot load, as an admin sees them.

Reads skip such a document (:mod:`service.storage.unreadable`): a belief, a turn, a review item or
an audit event. This service lets a tenant admin find them (a paged scan of the tenant's records of
one kind, each stored source checked against its model) and erase one by id without loading it
(:meth:`BeliefLifecycle.erase_unreadable` for a belief: the document, the audit payload copies that
name it and the tenant's cached renderings; :meth:`BeliefLifecycle.erase_unreadable_record` for the
others: the document).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from service.auth.actor import Actor
from service.beliefs.lifecycle import BeliefLifecycle, Change, ErasureReceipt
from service.errors import Forbidden
from service.storage import beliefs as belief_storage
from service.storage import quarantine as quarantine_storage
from service.storage.unreadable import document_id, why_record_unreadable, why_unreadable

MAX_SCAN_PAGE = 500
Kind = Literal["belief", "turn", "review", "audit_event"]
RecordKindName = Literal["turn", "review", "audit_event"]
if set(get_args(Kind)) != {"belief", *quarantine_storage.SHELVES} or set(get_args(RecordKindName)) != set(
    quarantine_storage.SHELVES
):
    raise RuntimeError("every stored kind the quarantine reads is a kind the API names")


@dataclass(frozen=True)
class QuarantinedRecord:
    kind: str
    record_id: str
    owner_id: str | None
    scope: list[str]
    reason: str


@dataclass(frozen=True)
class QuarantinePage:
    kind: str
    items: list[QuarantinedRecord]
    scanned: int
    next_cursor: str | None


@dataclass(frozen=True)
class RecordErased:
    kind: str
    record_id: str
    erased_at: datetime


def _owner(source: dict[str, Any]) -> str | None:
    for field in ("owner_id", "actor_id"):  # audit events have an actor, not an owner
        value = source.get(field)
        if isinstance(value, str):
            return value
    return None


def _scope(source: dict[str, Any]) -> list[str]:
    for field in ("scope", "scopes"):
        value = source.get(field)
        if isinstance(value, list):
            return [s for s in value if isinstance(s, str)]
    return []


def _listed(kind: str, record_id: str, source: dict[str, Any], reason: str) -> QuarantinedRecord:
    return QuarantinedRecord(
        kind=kind, record_id=record_id, owner_id=_owner(source), scope=_scope(source), reason=reason
    )


class QuarantineService:
    def __init__(self, lifecycle: BeliefLifecycle):
        self.lifecycle = lifecycle

    def scan(self, actor: Actor, *, kind: str = "belief", size: int, after: str | None) -> QuarantinePage:
        """One page of the tenant's stored records of ``kind``, of which those that cannot be loaded."""
        if not actor.principal.is_admin:
            raise Forbidden("the quarantine needs the admin role")
        size = min(size, MAX_SCAN_PAGE)
        store = self.lifecycle.store
        items: list[QuarantinedRecord] = []
        if kind == "belief":
            sources, next_cursor = belief_storage.raw_tenant_page(store, actor.principal, size=size, after=after)
            for source in sources:
                if (reason := why_unreadable(source)) is not None:
                    items.append(_listed(kind, document_id(source), source, reason))
        else:
            shelf = quarantine_storage.SHELVES[kind]
            sources, next_cursor = quarantine_storage.raw_page(
                store.client, store.namespace, shelf, actor.principal, size=size, after=after
            )
            for source in sources:
                if (reason := why_record_unreadable(shelf.kind, source)) is not None:
                    items.append(_listed(kind, shelf.kind.record_id(source), source, reason))
        return QuarantinePage(kind=kind, items=items, scanned=len(sources), next_cursor=next_cursor)

    def erase(self, actor: Actor, belief_id: str, *, expunge: bool = False) -> ErasureReceipt:
        return self.lifecycle.erase_unreadable(Change(actor=actor), belief_id, expunge=expunge)

    def erase_record(self, actor: Actor, kind: str, record_id: str) -> RecordErased:
        """A quarantined turn, review item or audit event, by id, without loading it."""
        change = Change(actor=actor)
        self.lifecycle.erase_unreadable_record(change, quarantine_storage.SHELVES[kind], record_id)
        return RecordErased(kind=kind, record_id=record_id, erased_at=change.at)
