"""The audit vocabulary: every action the audit trail records, named once.

Actions are ``<subject>.<verb>`` with the verb in the imperative (``belief.create``,
``tenant.create``, ``key.revoke``), the form the API and provisioning always used. The memory loop
used to write past-tense names for the same changes (``belief.created``, ``belief.superseded``,
``belief.aliases_added`` ...), so an admin's filter on one missed the other. Events already stored
under those names stay as they are; :func:`matching_actions` makes a filter on either spelling
match both.
"""

from __future__ import annotations

from enum import StrEnum


class AuditAction(StrEnum):
    # belief state changes (service.beliefs.lifecycle writes all of these)
    BELIEF_CREATE = "belief.create"
    BELIEF_IMPORT = "belief.import"
    BELIEF_SUPERSEDE = "belief.supersede"
    BELIEF_MERGE = "belief.merge"  # a review proposal merged into the belief it conflicts with
    BELIEF_COMPACT = "belief.compact"
    BELIEF_REINFORCE = "belief.reinforce"
    BELIEF_PIN = "belief.pin"
    BELIEF_UNPIN = "belief.unpin"
    BELIEF_RESOLVE = "belief.resolve"
    BELIEF_ADD_ALIASES = "belief.add_aliases"
    BELIEF_REMOVE_ALIASES = "belief.remove_aliases"
    BELIEF_RETRACT = "belief.retract"
    BELIEF_ERASE = "belief.erase"
    BELIEF_QUARANTINE_ERASE = "belief.quarantine_erase"  # a stored document that cannot be loaded
    # a stored turn, review item or audit event that cannot be loaded (details: kind, record_id)
    RECORD_QUARANTINE_ERASE = "record.quarantine_erase"
    # the memory loop's review queue and compaction runs
    REVIEW_FILE_CONFLICT = "review.file_conflict"
    REVIEW_RESOLVE = "review.resolve"
    COMPACTION_RUN = "compaction.run"
    # an admin sent a failed turn back for extraction (details: turn_id, previous_error, ...)
    TURN_RETRY = "turn.retry"
    # injection receipts; a console preview is recorded apart (nothing was injected)
    RECALL = "recall"
    RECALL_PREVIEW = "recall.preview"
    # provisioning
    TENANT_CREATE = "tenant.create"
    TENANT_DISABLE = "tenant.disable"
    TENANT_ENABLE = "tenant.enable"
    USER_CREATE = "user.create"
    USER_DISABLE = "user.disable"
    USER_ENABLE = "user.enable"
    GRANTS_UPDATE = "grants.update"
    KEY_ISSUE = "key.issue"
    KEY_REVOKE = "key.revoke"
    TOKEN_ISSUE = "token.issue"  # noqa: S105 (an action name, not a secret)
    TOKEN_REVOKE = "token.revoke"  # noqa: S105


# Names written before the vocabulary was unified (memory loop, compaction, review queue).
LEGACY_ACTIONS: dict[str, AuditAction] = {
    "belief.created": AuditAction.BELIEF_CREATE,
    "belief.superseded": AuditAction.BELIEF_SUPERSEDE,
    "belief.compacted": AuditAction.BELIEF_COMPACT,
    "belief.reinforced": AuditAction.BELIEF_REINFORCE,
    "belief.resolved": AuditAction.BELIEF_RESOLVE,
    "belief.aliases_added": AuditAction.BELIEF_ADD_ALIASES,
    "review.conflict_filed": AuditAction.REVIEW_FILE_CONFLICT,
    "review.resolved": AuditAction.REVIEW_RESOLVE,
}


def matching_actions(name: str) -> list[str]:
    """Every stored spelling an audit filter on ``name`` must match: the current name and the
    legacy names of the same action. An unknown name matches only itself."""
    current = LEGACY_ACTIONS.get(name) or (AuditAction(name) if name in AuditAction._value2member_map_ else None)
    if current is None:
        return [name]
    return [current.value, *(old for old, new in LEGACY_ACTIONS.items() if new is current)]
