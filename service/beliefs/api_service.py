"""The belief lifecycle as the API exposes it: authorization, lifecycle rules and the audit trail.

Routes call these methods and nothing else. Each write re-checks scope grants (403 for a shared
scope the caller holds no grant to), goes through :mod:`service.beliefs.service` for optimistic
concurrency,
and appends an audit event with before/after copies. Reads never reveal another user's or tenant's
belief: those are simply "not found".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.auth.actor import Actor
from service.beliefs.service import add_aliases, merge_aliases, mutate
from service.domain import scopes as scope_rules
from service.domain.belief import (
    MAX_CONTENT_CHARS,
    MAX_WHY_CHARS,
    Belief,
    BeliefId,
    BeliefType,
    ChangeLogEntry,
    EpistemicStatus,
    ExpertiseDepth,
    Provenance,
    Subtype,
    new_belief_id,
    normalize_aliases,
    utcnow,
)
from service.domain.principal import Principal
from service.errors import Conflict, Forbidden, NotFound, ValidationFailed
from service.recall.cache import RenderCache
from service.storage import beliefs as belief_storage
from service.storage.audit import AuditEvent, AuditStore
from service.storage.beliefs import BeliefStore, ListFilter, Refresh

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


@dataclass(frozen=True)
class ErasureReceipt:
    belief_id: str
    belief_versions_removed: list[str]
    audit_payload_copies_removed: int
    cached_renderings_removed: int
    erased_at: datetime


@dataclass(frozen=True)
class History:
    belief_id: str
    chain: list[Belief]  # oldest first; every version the caller may see


def _snapshot(belief: Belief | None) -> dict[str, Any] | None:
    """The payload copy kept in the audit trail (without the change log, which history has)."""
    if belief is None:
        return None
    return belief.model_dump(mode="json", exclude={"change_log"})


def _scopes_of(belief: Belief | None) -> list[str]:
    return list(belief.scope) if belief is not None else []


def check_writable(principal: Principal, labels: list[str]) -> None:
    """Shared scopes need a grant; personal scopes are always the writer's own."""
    denied = [s for s in labels if scope_rules.is_shared(s) and s not in principal.shared_grants]
    if denied:
        raise Forbidden(f"no grant to write into {', '.join(denied)}", details={"scopes": denied})


def _log(actor: Actor, trigger: str, **extra: Any) -> ChangeLogEntry:
    return ChangeLogEntry(
        changed_at=utcnow(),
        trigger=trigger,
        actor=actor.principal.user_id,
        changed_by_session=actor.session_id,
        **extra,
    )


class BeliefService:
    def __init__(
        self,
        store: BeliefStore,
        audit: AuditStore,
        render_cache: RenderCache,
        *,
        max_import: int = 5000,
        refresh: Refresh = "wait_for",
    ):
        self.refresh: Refresh = refresh
        self.store = store
        self.audit = audit
        self.render_cache = render_cache
        self.max_import = max_import

    # ----------------------------------------------------------------- audit

    def _record(
        self,
        actor: Actor,
        action: str,
        ids: list[str],
        *,
        before: Belief | None = None,
        after: Belief | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.audit.append(self._event(actor, action, ids, before=before, after=after, details=details))

    @staticmethod
    def _event(
        actor: Actor,
        action: str,
        ids: list[str],
        *,
        before: Belief | None = None,
        after: Belief | None = None,
        details: dict[str, Any] | None = None,
    ) -> AuditEvent:
        return AuditEvent(
            tenant_id=actor.principal.tenant_id,
            action=action,
            actor_id=actor.principal.user_id,
            actor_kind=actor.kind,
            credential_id=actor.credential_id,
            belief_ids=ids,
            session_id=actor.session_id,
            request_id=actor.request_id,
            scopes=_scopes_of(after or before),
            before=_snapshot(before),
            after=_snapshot(after),
            details=details,
        )

    def _mutate(self, actor: Actor, belief_id: str, action: str, change: Callable[[Belief], Belief]) -> Belief:
        captured: list[Belief] = []

        def tracked(belief: Belief) -> Belief:
            captured.append(belief.model_copy(deep=True))
            return change(belief)

        updated = mutate(self.store, actor.principal, belief_id, tracked, refresh=self.refresh)
        self._record(actor, action, [belief_id], before=captured[-1], after=updated)
        return updated

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
            raise ValidationFailed("invalid belief", details=_pydantic_details(exc, ("body",))) from exc
        check_writable(actor.principal, belief.scope)
        self.store.put(belief, create_only=True, refresh=self.refresh)
        self._record(actor, "belief.create", [belief.id], after=belief)
        return belief

    def import_records(self, actor: Actor, records: list[dict[str, Any]]) -> ImportReport:
        """Bulk import (the paper's seed format or our export), keeping given ids. Every record is
        validated and authorized before anything is written; an existing id fails only that
        record."""
        if len(records) > self.max_import:
            raise ValidationFailed(f"at most {self.max_import} records per import, got {len(records)}")
        beliefs = [self._imported(actor, i, r) for i, r in enumerate(records)]
        seen: set[str] = set()
        for belief in beliefs:
            if belief.id in seen:
                raise ValidationFailed(f"duplicate id {belief.id!r} in the import")
            seen.add(belief.id)
        result = self.store.put_many(beliefs, create_only=True, refresh=self.refresh)
        report = ImportReport(imported=result.written)
        for belief_id, reason in result.failed.items():
            code = "conflict" if "already exists" in reason or "version_conflict" in reason else "rejected"
            report.failed[belief_id] = {"code": code, "message": reason}
        # One event per imported belief, with its payload copy, like any other create.
        written = set(report.imported)
        self.audit.append_many(
            [self._event(actor, "belief.import", [b.id], after=b) for b in beliefs if b.id in written]
        )
        return report

    def _imported(self, actor: Actor, index: int, record: dict[str, Any]) -> Belief:
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
                details=_pydantic_details(exc, ("body", index)),
            ) from exc
        check_writable(actor.principal, belief.scope)
        return belief

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
    ) -> tuple[list[Belief], str | None]:
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
        chain = [current]
        seen = {current.id}
        cursor = current
        while cursor.supersedes and cursor.supersedes not in seen and len(chain) < 100:
            older = self._maybe_get(actor.principal, cursor.supersedes, tenant_wide=tenant_wide)
            if older is None:
                break
            chain.insert(0, older)
            seen.add(older.id)
            cursor = older
        cursor = current
        while cursor.superseded_by and cursor.superseded_by not in seen and len(chain) < 100:
            newer = self._maybe_get(actor.principal, cursor.superseded_by, tenant_wide=tenant_wide)
            if newer is None:
                break
            chain.append(newer)
            seen.add(newer.id)
            cursor = newer
        return History(belief_id=belief_id, chain=chain)

    def _maybe_get(self, principal: Principal, belief_id: str, *, tenant_wide: bool = False) -> Belief | None:
        try:
            return self.store.get(principal, belief_id, tenant_wide=tenant_wide)
        except NotFound:
            return None

    # ------------------------------------------------------------- lifecycle

    def supersede(self, actor: Actor, belief_id: str, data: SupersedeIn) -> tuple[Belief, Belief]:
        """New version replaces the old: the old one's aliases and canonical name become
        counter-signal aliases of the new one (paper §3.6), so old vocabulary still finds it."""
        old = self.store.get(actor.principal, belief_id)
        if not old.is_live:
            raise Conflict(f"belief {belief_id!r} is {old.lifecycle.value}; cannot supersede it")
        check_writable(actor.principal, old.scope)
        new = self._replacement(actor, old, data)
        self.store.put(new, create_only=True, refresh=self.refresh)

        def retire(belief: Belief) -> Belief:
            if not belief.is_live:
                raise Conflict(f"belief {belief_id!r} was changed concurrently; it is no longer live")
            belief.epistemic_status = EpistemicStatus.SUPERSEDED
            belief.superseded_by = new.id
            belief.change_log.append(_log(actor, f"superseded by {new.id}", note=data.reason))
            return belief

        try:
            retired = self._mutate(actor, belief_id, "belief.supersede", retire)
        except Exception:
            belief_storage.delete_ids(self.store, actor.principal, [new.id])  # undo the half-done write
            raise
        self._record(actor, "belief.create", [new.id], after=new, details={"supersedes": belief_id})
        return retired, new

    def _replacement(self, actor: Actor, old: Belief, data: SupersedeIn) -> Belief:
        name = data.canonical_name or old.canonical_name
        inherited = [*old.aliases, old.canonical_name]
        aliases, _ = merge_aliases(normalize_aliases(data.aliases), inherited)
        values = old.model_dump(
            exclude={
                "id",
                "aliases",
                "content",
                "canonical_name",
                "change_log",
                "superseded_by",
                "created_at",
                "updated_at",
                "version",
                "reinforcement_count",
                "last_reinforced_at",
                "resolved_at",
                "retracted_at",
            }
        )
        values.update(
            id=data.id or new_belief_id(),
            canonical_name=name,
            aliases=aliases,
            content=data.content,
            why_it_matters=data.why_it_matters if data.why_it_matters is not None else old.why_it_matters,
            confidence=data.confidence if data.confidence is not None else old.confidence,
            epistemic_status=EpistemicStatus.ACTIVE,
            supersedes=old.id,
            change_log=[
                _log(
                    actor,
                    f"supersedes belief {old.id}",
                    previous_content=old.content,
                    previous_epistemic_status=old.epistemic_status,
                    previous_confidence=old.confidence,
                    note=data.reason,
                )
            ],
        )
        try:
            return Belief.model_validate(values)
        except ValidationError as exc:
            raise ValidationFailed("invalid replacement belief", details=_pydantic_details(exc, ("body",))) from exc

    def reinforce(self, actor: Actor, belief_id: str, aliases: list[str]) -> Belief:
        def change(belief: Belief) -> Belief:
            if not belief.is_live:
                raise Conflict(f"belief {belief_id!r} is {belief.lifecycle.value}; cannot reinforce it")
            belief.aliases, dropped = merge_aliases(belief.aliases, aliases)
            belief.reinforcement_count += 1
            belief.last_reinforced_at = utcnow()
            belief.change_log.append(
                _log(
                    actor,
                    "reinforced",
                    note=f"alias cap reached; dropped {dropped}" if dropped else None,
                )
            )
            return belief

        return self._mutate(actor, belief_id, "belief.reinforce", change)

    def set_pinned(self, actor: Actor, belief_id: str, pinned: bool) -> Belief:
        def change(belief: Belief) -> Belief:
            belief.pinned = pinned
            belief.user_edited = True  # an explicit pin/unpin is the user's edit (cross-scope pinned rule)
            belief.change_log.append(_log(actor, "pinned" if pinned else "unpinned"))
            return belief

        return self._mutate(actor, belief_id, "belief.pin" if pinned else "belief.unpin", change)

    def resolve(self, actor: Actor, belief_id: str, note: str | None, resolved_by: str | None) -> Belief:
        if resolved_by is not None:
            self.store.get(actor.principal, resolved_by)  # must exist and be visible (404 otherwise)

        def change(belief: Belief) -> Belief:
            if belief.type is not BeliefType.OPEN_QUESTION:
                raise ValidationFailed(f"belief {belief_id!r} is a {belief.type.value}, not an open question")
            if belief.resolved_at is not None:
                raise Conflict(f"open question {belief_id!r} is already resolved")
            belief.resolved_at = utcnow()
            detail = f"resolved by {resolved_by}" if resolved_by else "resolved"
            belief.change_log.append(_log(actor, detail, note=note))
            return belief

        return self._mutate(actor, belief_id, "belief.resolve", change)

    def add_aliases(self, actor: Actor, belief_id: str, aliases: list[str]) -> Belief:
        before = self.store.get(actor.principal, belief_id)
        updated = add_aliases(
            self.store,
            actor.principal,
            belief_id,
            aliases,
            session_id=actor.session_id,
            refresh=self.refresh,
        )
        self._record(actor, "belief.add_aliases", [belief_id], before=before, after=updated)
        return updated

    def retract(self, actor: Actor, belief_id: str, reason: str | None) -> Belief:
        def change(belief: Belief) -> Belief:
            if belief.retracted_at is not None:
                raise Conflict(f"belief {belief_id!r} is already retracted")
            belief.retracted_at = utcnow()
            belief.change_log.append(_log(actor, "retracted", note=reason))
            return belief

        return self._mutate(actor, belief_id, "belief.retract", change)

    def erase(self, actor: Actor, belief_id: str) -> ErasureReceipt:
        """Admin hard delete of a belief and its whole supersession chain, the audit payload copies
        of those versions and the tenant's cached renderings. The erase itself is audited by id."""
        principal = actor.principal
        if not principal.is_admin:
            raise Forbidden("erasing beliefs needs the admin role")
        root = self._maybe_get(principal, belief_id, tenant_wide=True)
        if root is None:
            raise NotFound(f"belief {belief_id!r} not found")
        versions = self._chain_ids(principal, root)
        removed = belief_storage.delete_ids(self.store, principal, versions)
        payloads = self.audit.erase_payloads(principal, removed)
        cached = self.render_cache.invalidate_tenant(principal.tenant_id)
        receipt = ErasureReceipt(
            belief_id=belief_id,
            belief_versions_removed=removed,
            audit_payload_copies_removed=payloads,
            cached_renderings_removed=cached,
            erased_at=utcnow(),
        )
        self._record(
            actor,
            "belief.erase",
            removed,
            details={
                "audit_payload_copies_removed": payloads,
                "cached_renderings_removed": cached,
            },
        )
        return receipt

    def _chain_ids(self, principal: Principal, root: Belief) -> list[str]:
        ids = [root.id]
        for link in ("supersedes", "superseded_by"):
            cursor: Belief | None = root
            while cursor is not None and getattr(cursor, link) and getattr(cursor, link) not in ids and len(ids) < 200:
                nxt: str = getattr(cursor, link)
                cursor = self._maybe_get(principal, nxt, tenant_wide=True)
                if cursor is not None:
                    ids.append(cursor.id)
        return ids


def _pydantic_details(exc: ValidationError, prefix: tuple[str | int, ...]) -> list[dict[str, Any]]:
    return [
        {"loc": [*prefix, *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in exc.errors(include_url=False)
    ]
