"""Belief lifecycle operations (domain logic). Storage goes through :class:`BeliefStore` only.

Every mutation bumps ``version``, stamps ``updated_at`` and appends a change-log entry, and is
applied with optimistic concurrency so two writers never silently overwrite each other.
"""

from __future__ import annotations

from collections.abc import Callable

from service.domain.belief import MAX_ALIASES, Belief, ChangeLogEntry, normalize_aliases, utcnow
from service.domain.principal import Principal
from service.errors import Conflict, ValidationFailed
from service.storage.beliefs import BeliefStore, Refresh

MAX_RETRIES = 3


def mutate(
    store: BeliefStore,
    principal: Principal,
    belief_id: str,
    change: Callable[[Belief], Belief],
    *,
    refresh: Refresh = "wait_for",
    tenant_wide: bool = False,
) -> Belief:
    """Read-modify-write with optimistic concurrency, retried on a concurrent change."""
    for attempt in range(MAX_RETRIES):
        current, seq_no, term = store.get_versioned(principal, belief_id, tenant_wide=tenant_wide)
        updated = change(current.model_copy(deep=True))
        updated = updated.model_copy(update={"version": current.version + 1, "updated_at": utcnow()})
        Belief.model_validate(updated.model_dump())  # re-validate the whole belief after the change
        try:
            store.replace(updated, if_seq_no=seq_no, if_primary_term=term, refresh=refresh)
            return updated
        except Conflict:
            if attempt == MAX_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def merge_aliases(existing: list[str], new: list[str], *, cap: int = MAX_ALIASES) -> tuple[list[str], list[str]]:
    """Union within the cap. Returns (merged, dropped-for-cap)."""
    merged = list(existing)
    dropped: list[str] = []
    for alias in normalize_aliases(new, cap=None):
        if alias in merged:
            continue
        if len(merged) >= cap:
            dropped.append(alias)
        else:
            merged.append(alias)
    return merged, dropped


def add_aliases(
    store: BeliefStore,
    principal: Principal,
    belief_id: str,
    aliases: list[str],
    *,
    trigger: str = "aliases added",
    session_id: str | None = None,
    turn_id: str | None = None,
    refresh: Refresh = "wait_for",
) -> Belief:
    if not aliases:
        raise ValidationFailed("no aliases given")

    def change(belief: Belief) -> Belief:
        merged, dropped = merge_aliases(belief.aliases, aliases)
        note = f"alias cap {MAX_ALIASES} reached; dropped {dropped}" if dropped else None
        belief.aliases = merged
        belief.change_log.append(
            ChangeLogEntry(
                changed_at=utcnow(),
                trigger=trigger,
                actor=principal.user_id,
                changed_by_session=session_id,
                changed_by_turn=turn_id,
                note=note,
            )
        )
        return belief

    return mutate(store, principal, belief_id, change, refresh=refresh)
