"""The belief endpoints' service: authorization, request validation and the reads.

Routes call these methods and nothing else. Each write re-checks scope grants (403 for a shared
scope the caller holds no grant to) and then hands the change to
:class:`~service.beliefs.lifecycle.BeliefLifecycle`, which applies it with optimistic concurrency
and appends the audit event with before/after copies. Reads never reveal another user's or
tenant's belief: those are simply "not found".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.auth.actor import Actor
from service.beliefs.lifecycle import (
    MAX_HISTORY,
    BeliefLifecycle,
    Change,
    ErasureReceipt,
    Replacement,
    check_writable,
    follow_chain,
    pydantic_details,
    reciprocal,
)
from service.domain.belief import (
    MAX_CONTENT_CHARS,
    MAX_WHY_CHARS,
    Belief,
    BeliefId,
    BeliefType,
    EpistemicStatus,
    ExpertiseDepth,
    Provenance,
    Subtype,
    new_belief_id,
    utcnow,
)
from service.domain.principal import Principal
from service.errors import Conflict, Forbidden, NotFound, Unreadable, ValidationFailed
from service.storage import beliefs as belief_storage
from service.storage.beliefs import ListFilter
from service.storage.unreadable import LoadedBeliefs

__all__ = ["BeliefCreate", "BeliefService", "ErasureReceipt", "History", "ImportReport", "SupersedeIn"]

MAX_PAGE = 500
EXPORT_PAGE = 500


class BeliefCreate(BaseModel):
    """A new belief. The tenant and owner come from the credentials, never from the body."""

    model_config = ConfigDict(extra="forbid")

    id: BeliefId | None = None
    type: BeliefType
    subtype: Subtype | None = None
    # Emptiness and length are checked on the normalised name by the Belief model.
    canonical_name: str
    aliases: list[str] = Field(default_factory=list, max_length=25)
    content: str = Field(..., min_length=1, max_length=MAX_CONTENT_CHARS)
    why_it_matters: str = Field("", max_length=MAX_WHY_CHARS)
    scope: list[str] = Field(..., min_length=1, max_length=32)
    epistemic_status: EpistemicStatus = EpistemicStatus.ACTIVE
    confidence: float = Field(0.8, ge=0.0, le=1.0)
    pinned: bool = False
    user_edited: bool = False
    participants: list[BeliefId] = Field(default_factory=list, max_length=16)
    relation_type: str | None = Field(
        None, max_length=200, description="Relations only: what links the participants (depends_on, uses, ...)"
    )
    expertise_domain: str | None = Field(None, max_length=200)
    expertise_depth: ExpertiseDepth | None = None
    provenance: Provenance = Field(default_factory=Provenance)


class SupersedeIn(BaseModel):
    """The replacement. Unset fields are carried over from the superseded belief."""

    model_config = ConfigDict(extra="forbid")

    id: BeliefId | None = None
    content: str = Field(..., min_length=1, max_length=MAX_CONTENT_CHARS)
    canonical_name: str | None = Field(None, min_length=1)
    why_it_matters: str | None = Field(None, max_length=MAX_WHY_CHARS)
    aliases: list[str] = Field(default_factory=list, max_length=25)
    confidence: float | None = Field(None, ge=0.0, le=1.0)
    reason: str | None = Field(None, max_length=2000)


@dataclass
class ImportReport:
    imported: list[str] = field(default_factory=list)
    failed: dict[str, dict[str, str]] = field(default_factory=dict)
    changed: dict[str, list[str]] = field(default_factory=dict)  # what the server did to a record
    warnings: list[str] = field(default_factory=list)


# Fields the server keeps for itself. A member's import gets the server's values (a forged
# change-log actor, a created_at or last_reinforced_at in 2999 winning a shared scope's pinned
# order, a version); an admin's migration import keeps the given ones, and the audit event says so.
# ``user_edited`` is not among them: it is the paper's own record field and only changes what its
# owner's own sessions pin (the cross-scope rule), never a colleague's.
SERVER_OWNED = (
    "change_log",
    "created_at",
    "updated_at",
    "version",
    "reinforcement_count",
    "last_reinforced_at",
)
LINKS = ("supersedes", "superseded_by")


@dataclass
class _Imported:
    belief: Belief
    given_server_fields: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class History:
    belief_id: str
    chain: list[Belief]  # oldest first; every version the caller may see


def _change(actor: Actor) -> Change:
    return Change(actor=actor)


def _server_values(actor: Actor, item: _Imported) -> None:
    """A member's record gets the server's values for server-owned fields (named in the report)."""
    if not item.given_server_fields:
        return
    now = utcnow()
    item.belief = item.belief.model_copy(
        update={
            "change_log": [Change(actor=actor, at=now).entry("imported")],
            "created_at": now,
            "updated_at": now,
            "version": 1,
            "reinforcement_count": 0,
            "last_reinforced_at": None,
        }
    )
    item.notes.append(f"server values for {', '.join(item.given_server_fields)}: server-owned fields")


class BeliefService:
    """Authorization and request validation around :class:`BeliefLifecycle` (which makes every
    change and records it), plus the reads."""

    def __init__(
        self,
        lifecycle: BeliefLifecycle,
        *,
        max_import: int = 5000,
        user_exists: Callable[[str, str], bool] | None = None,
    ):
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.max_import = max_import
        self.user_exists = user_exists  # (tenant, user) -> exists: admin imports warn about owners

    # ---------------------------------------------------------------- create

    def create(self, actor: Actor, data: BeliefCreate) -> Belief:
        payload = data.model_dump(exclude_none=True)
        payload["id"] = data.id or new_belief_id()
        try:
            belief = Belief.model_validate(
                {
                    **payload,
                    "tenant_id": actor.principal.tenant_id,
                    "owner_id": actor.principal.user_id,
                }
            )
        except ValidationError as exc:
            raise ValidationFailed("invalid belief", details=pydantic_details(exc, ("body",))) from exc
        check_writable(actor.principal, belief.scope)
        self.lifecycle.create(_change(actor), belief)
        return belief

    def import_records(self, actor: Actor, records: list[dict[str, Any]]) -> ImportReport:
        """Bulk import (the paper's seed format or our export), keeping given ids. Every record is
        validated and authorized before anything is written; an existing id fails only that
        record."""
        if len(records) > self.max_import:
            raise ValidationFailed(f"at most {self.max_import} records per import, got {len(records)}")
        items = [self._imported(actor, i, r) for i, r in enumerate(records)]
        seen: set[str] = set()
        for item in items:
            if item.belief.id in seen:
                raise ValidationFailed(f"duplicate id {item.belief.id!r} in the import")
            seen.add(item.belief.id)
        admin = actor.principal.is_admin
        self._check_links(actor, items, admin=admin)
        for item in items:
            if not admin:
                _server_values(actor, item)
        kept = {
            i.belief.id: {"kept_server_fields": i.given_server_fields} for i in items if admin and i.given_server_fields
        }
        result = self.lifecycle.import_many(_change(actor), [i.belief for i in items], details=kept)
        report = ImportReport(imported=result.written)
        for belief_id, reason in result.failed.items():
            code = "conflict" if "already exists" in reason or "version_conflict" in reason else "rejected"
            report.failed[belief_id] = {"code": code, "message": reason}
        report.changed = {i.belief.id: i.notes for i in items if i.notes and i.belief.id in set(result.written)}
        if admin:
            report.warnings = self._unknown_owners(
                actor, [i.belief for i in items if i.belief.id in set(result.written)]
            )
        return report

    def _check_links(self, actor: Actor, items: list[_Imported], *, admin: bool) -> None:
        """Lifecycle links are made by the server. A member's import drops them; an admin's
        migration import keeps a link only when the other side (in this import, or stored) names
        this record back and has the same owner."""
        batch = {i.belief.id: i.belief for i in items}
        for item in items:
            belief = item.belief
            dropped = []
            for link in LINKS:
                target = getattr(belief, link)
                if not target:
                    continue
                partner = (
                    (batch.get(target) or self._maybe_get(actor.principal, target, tenant_wide=True)) if admin else None
                )
                if partner is None or not reciprocal(belief, link, partner):
                    dropped.append(link)
            if dropped:
                item.belief = belief.model_copy(update=dict.fromkeys(dropped))
                why = (
                    "links are made by the server"
                    if not admin
                    else "the other side does not link back with the same owner"
                )
                item.notes.append(f"dropped {', '.join(dropped)}: {why}")

    def _unknown_owners(self, actor: Actor, beliefs: list[Belief]) -> list[str]:
        if self.user_exists is None:
            return []
        owners = sorted({b.owner_id for b in beliefs})
        missing = [o for o in owners if not self.user_exists(actor.principal.tenant_id, o)]
        return [
            f"owner {o!r} is not a user of this tenant: nobody can recall its "
            f"{sum(b.owner_id == o for b in beliefs)} imported beliefs until that user exists"
            for o in missing
        ]

    def _imported(self, actor: Actor, index: int, record: dict[str, Any]) -> _Imported:
        if not isinstance(record, dict):
            raise ValidationFailed(
                f"record {index} is not an object",
                details=[{"loc": ["body", index], "msg": "expected an object"}],
            )
        data = dict(record)
        given_owner, given_user = data.pop("owner_id", None), data.pop("user_id", None)
        owner = given_owner or given_user or actor.principal.user_id
        if owner != actor.principal.user_id and not actor.principal.is_admin:
            raise Forbidden(f"record {index} belongs to another user; only an admin may import for others")
        try:
            belief = Belief.from_record({**data, "owner_id": owner}, tenant_id=actor.principal.tenant_id)
        except ValidationError as exc:
            raise ValidationFailed(
                f"record {index} is not a valid belief",
                details=pydantic_details(exc, ("body", index)),
            ) from exc
        check_writable(actor.principal, belief.scope)
        return _Imported(belief, [f for f in SERVER_OWNED if f in record])

    # ----------------------------------------------------------------- reads

    def get(self, actor: Actor, belief_id: str, *, tenant_wide: bool = False) -> Belief:
        if tenant_wide and not actor.principal.is_admin:
            raise Forbidden("only an admin may read the whole tenant")
        return self.store.get(actor.principal, belief_id, tenant_wide=tenant_wide)

    def list_beliefs(
        self,
        actor: Actor,
        narrow: ListFilter,
        *,
        size: int,
        after: str | None,
        tenant_wide: bool = False,
    ) -> tuple[LoadedBeliefs, str | None]:
        if tenant_wide and not actor.principal.is_admin:
            raise Forbidden("only an admin may list the whole tenant")
        return belief_storage.list_page(
            self.store,
            actor.principal,
            narrow,
            size=min(size, MAX_PAGE),
            after=after,
            tenant_wide=tenant_wide,
        )

    def export(self, actor: Actor, narrow: ListFilter, *, tenant_wide: bool = False) -> Iterator[Belief]:
        if tenant_wide and not actor.principal.is_admin:
            raise Forbidden("only an admin may export the whole tenant")
        after: str | None = None
        while True:
            page, after = belief_storage.list_page(
                self.store,
                actor.principal,
                narrow,
                size=EXPORT_PAGE,
                after=after,
                tenant_wide=tenant_wide,
                include_change_log=True,
            )
            yield from page
            if after is None:
                return

    def history(self, actor: Actor, belief_id: str, *, tenant_wide: bool = False) -> History:
        """The supersession chain through ``belief_id`` (oldest first), each with its change log.
        ``tenant_wide`` (admins) follows the chain through beliefs they could not see as a user."""
        current = self.get(actor, belief_id, tenant_wide=tenant_wide)
        older, newer = follow_chain(
            current,
            lambda bid: self._maybe_get(actor.principal, bid, tenant_wide=tenant_wide),
            limit=MAX_HISTORY,
        )
        return History(belief_id=belief_id, chain=[*older, current, *newer])

    def _maybe_get(self, principal: Principal, belief_id: str, *, tenant_wide: bool = False) -> Belief | None:
        try:
            return self.store.get(principal, belief_id, tenant_wide=tenant_wide)
        except (NotFound, Unreadable):  # the chain ends at a missing or quarantined version
            return None

    # ------------------------------------------------------------- lifecycle

    def supersede(self, actor: Actor, belief_id: str, data: SupersedeIn) -> tuple[Belief, Belief]:
        """New version replaces the old: the old one's aliases and canonical name become
        counter-signal aliases of the new one (paper §3.6), so old vocabulary still finds it."""
        old = self.store.get(actor.principal, belief_id)
        if not old.is_live:
            self.lifecycle.bump_refused(_change(actor))
            raise Conflict(f"belief {belief_id!r} is {old.lifecycle.value}; cannot supersede it")
        check_writable(actor.principal, old.scope, owner_id=old.owner_id)
        spec = Replacement(
            id=data.id,
            content=data.content,
            canonical_name=data.canonical_name,
            aliases=data.aliases,
            why_it_matters=data.why_it_matters,
            confidence=data.confidence,
            reason=data.reason,
        )
        return self.lifecycle.supersede(_change(actor), old, spec)

    def _check_changeable(self, actor: Actor, belief_id: str) -> None:
        """A change to a stored belief reaches every session of its scopes: the same rule as a
        supersede (a grant for each shared scope; another owner's personal scopes are theirs)."""
        belief = self.store.get(actor.principal, belief_id)
        check_writable(actor.principal, belief.scope, owner_id=belief.owner_id)

    def reinforce(self, actor: Actor, belief_id: str, aliases: list[str]) -> Belief:
        self._check_changeable(actor, belief_id)
        return self.lifecycle.reinforce(_change(actor), belief_id, aliases)

    def set_pinned(self, actor: Actor, belief_id: str, pinned: bool) -> Belief:
        self._check_changeable(actor, belief_id)
        return self.lifecycle.set_pinned(_change(actor), belief_id, pinned)

    def resolve(self, actor: Actor, belief_id: str, note: str | None, resolved_by: str | None) -> Belief:
        self._check_changeable(actor, belief_id)
        resolved = self.lifecycle.resolve(_change(actor), belief_id, note=note, resolved_by=resolved_by)
        assert resolved is not None  # without if_open, resolving twice raises Conflict
        return resolved

    def add_aliases(self, actor: Actor, belief_id: str, aliases: list[str]) -> Belief:
        self._check_changeable(actor, belief_id)
        updated, _, _ = self.lifecycle.add_aliases(_change(actor), belief_id, aliases)
        return updated

    def remove_aliases(self, actor: Actor, belief_id: str, aliases: list[str]) -> Belief:
        self._check_changeable(actor, belief_id)
        updated, _ = self.lifecycle.remove_aliases(_change(actor), belief_id, aliases)
        return updated

    def retract(self, actor: Actor, belief_id: str, reason: str | None) -> Belief:
        self._check_changeable(actor, belief_id)
        return self.lifecycle.retract(_change(actor), belief_id, reason)

    def erase(self, actor: Actor, belief_id: str, *, expunge: bool = False) -> ErasureReceipt:
        return self.lifecycle.erase(_change(actor), belief_id, expunge=expunge)
