"""Turning service results into what the console pages show (no I/O beyond service calls)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.beliefs.api_service import BeliefService
from service.beliefs.lifecycle import merge_aliases, unwritable_scopes
from service.console.web import ConsoleUser
from service.domain import scopes as scope_rules
from service.domain.belief import MAX_ALIASES, Belief, BeliefType, ChangeLogEntry, Lifecycle, normalize_aliases
from service.errors import NotFound, ValidationFailed
from service.storage.beliefs import ListFilter


def split_list(raw: str) -> list[str]:
    return [part.strip() for part in raw.replace("\n", ",").split(",") if part.strip()]


def checked_aliases(form: dict[str, str]) -> list[str]:
    """The aliases ticked in the remove-aliases form (one ``alias_<n>`` checkbox each)."""
    chosen = [value for key, value in sorted(form.items()) if key.startswith("alias_") and value.strip()]
    if not chosen:
        raise ValidationFailed("tick at least one alias to remove")
    return chosen


def parse_list_filter(
    q: str,
    types: list[BeliefType],
    lifecycles: list[Lifecycle],
    scopes: list[str],
    owner: str,
    pinned: str,
) -> ListFilter:
    labels = [label for raw in scopes for label in split_list(raw)]
    try:
        normalized = tuple(scope_rules.normalize_scopes(labels))
    except scope_rules.InvalidScope as exc:
        raise ValidationFailed(str(exc)) from exc
    return ListFilter(
        types=tuple(t.value for t in types),
        lifecycle=tuple(s.value for s in lifecycles),
        scopes=normalized,
        pinned={"yes": True, "no": False}.get(pinned),
        text=q.strip() or None,
        owners=tuple(split_list(owner)),
    )


@dataclass(frozen=True)
class LogRow:
    belief_id: str
    version: int
    entry: ChangeLogEntry


def change_log_rows(chain: list[Belief]) -> list[LogRow]:
    """Every change-log entry of the chain, newest first."""
    rows = [LogRow(b.id, b.version, e) for b in chain for e in b.change_log]
    rows.sort(key=lambda r: r.entry.changed_at, reverse=True)
    return rows


def belief_actions(user: ConsoleUser, belief: Belief, beliefs: BeliefService) -> list[str]:
    """The actions the service would accept from this user on this belief. Admins read the whole
    tenant, but change a belief only where the REST API would let them (it is visible to them
    as a user: their own personal scopes or a shared scope they hold, and none it carries that
    they may not write, :func:`unwritable_scopes`); erase is tenant-wide."""
    if not user.is_admin:
        return []
    actions = ["erase"]
    try:
        beliefs.get(user.actor, belief.id)
    except NotFound:
        return actions
    if unwritable_scopes(user.principal, belief.scope, owner_id=belief.owner_id):
        return actions
    if belief.lifecycle is Lifecycle.LIVE:
        actions = ["supersede", "unpin" if belief.pinned else "pin", "alias", "unalias", "retract", *actions]
    return actions


def verdict(action: str, belief: Belief, form: dict[str, str]) -> str:
    """One sentence saying what the confirmed action will do."""
    name = belief.canonical_name
    if action == "supersede":
        return (
            f"Replace '{name}' with a new version whose content is: {form.get('content', '')!r}. "
            "The old version stops being injected; its name and aliases become aliases of the new one."
        )
    if action == "pin":
        return f"Pin '{name}': it is injected in every session of its scopes, whatever the message."
    if action == "unpin":
        return f"Unpin '{name}': it is injected only when a message names it."
    if action == "alias":
        _, left_out = merge_aliases(belief.aliases, split_list(form.get("aliases", "")))
        cap = f" {left_out} would not be added: a belief has at most {MAX_ALIASES} aliases." if left_out else ""
        return f"Add the aliases {split_list(form.get('aliases', ''))} to '{name}'.{cap}"
    if action == "unalias":
        return (
            f"Remove the aliases {checked_aliases(form)} from '{name}': recall stops finding it by those names "
            "(its canonical name and other aliases still work)."
        )
    if action == "retract":
        return f"Retract '{name}': it is never injected again but stays in the history."
    if action == "erase":
        expunge = " Expunge: deleted copies are also merged out of the index segments." if form.get("expunge") else ""
        return (
            f"Erase '{name}' and every version of its supersession chain for good, with the payload copies "
            f"in the audit trail and the tenant's cached renderings. This cannot be undone.{expunge}"
        )
    return action


def aliases_outcome(before: Belief, after: Belief, asked: list[str]) -> str:
    """What adding ``asked`` did: the aliases added, and those the cap left out (the service drops
    them with a note in the change log, not an error)."""
    added = [a for a in after.aliases if a not in before.aliases]
    left_out = [a for a in normalize_aliases(asked, cap=None) if a not in after.aliases]
    said = f"aliases added: {', '.join(added)}" if added else "no alias added (each was one already)"
    if left_out:
        said += f"; not added (at most {MAX_ALIASES} aliases): {', '.join(left_out)}"
    return said


def day_label(when: datetime) -> str:
    return when.strftime("%m-%d")
