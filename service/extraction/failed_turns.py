"""Failed turns as a tenant admin sees them, and their retry.

A turn whose extraction ended ``failed`` (its attempts spent during an OpenSearch or model
outage, a store refusal) is final: the worker skips it and the sweep only looks at unfinished
turns, so without a retry its beliefs would never be extracted. An admin lists the tenant's turns
by status and sends a failed one back: it is pending again with its attempts reset, its
extraction is enqueued by ``(tenant_id, turn_id)`` as ``POST /v1/turns`` enqueues it, and the
retry is audited (``turn.retry``). The worker then extracts it as any other turn, with its
author's current grants (:meth:`ExtractionPipeline.author`): a disabled author's turn is skipped.

Where the failure stays visible: until the retried attempt finishes, the turn's ``error`` reads
``retry requested by <admin> at <time>; it had failed: <the error>``; a successful attempt clears
it, as any finished extraction does, and the audit event keeps the failure (``details.previous_error``,
``previous_attempts``, ``previous_finished_at``) for good.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from service.auth.actor import Actor
from service.beliefs.lifecycle import BeliefLifecycle, Change
from service.domain.audit import AuditAction
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import Conflict, ErrorCode, Forbidden
from service.extraction.queue import TaskQueue
from service.storage.turns import ExtractionStatus, TurnRecord, TurnStore
from service.storage.unreadable import Loaded

log = logging.getLogger("tenure.extraction.failed_turns")

MAX_ERROR_CHARS = 2000  # as the pipeline clips a failure
# a bulk retry sends at most this many turns per request (each is a save, an enqueue, an event)
MAX_BULK_RETRY = 200
_SAVE_TRIES = 3


@dataclass(frozen=True)
class RetriedTurn:
    turn: TurnRecord
    previous_error: str | None
    previous_attempts: int
    queued: bool  # False: the queue refused the send; the sweep sends the pending turn later


@dataclass(frozen=True)
class BulkRetry:
    retried: list[RetriedTurn]
    not_retried: dict[str, str]  # turn id -> why (another admin retried it first, ...)
    more: bool  # failed turns beyond this request's limit may remain


def _admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise Forbidden("this operation needs the admin role")


def not_failed(turn_id: str, status: str) -> Conflict:
    return Conflict(
        f"turn {turn_id!r} is {status}, not failed: only a failed turn can be retried",
        code=ErrorCode.TURN_NOT_FAILED,
        details={"extraction_status": status},
    )


class FailedTurns:
    def __init__(self, turns: TurnStore, queue: TaskQueue, lifecycle: BeliefLifecycle):
        self.turns = turns
        self.queue = queue
        self.lifecycle = lifecycle  # its audit trail (and outbox) records the retries

    def page(
        self,
        principal: Principal,
        *,
        status: ExtractionStatus = "failed",
        owner_id: str | None = None,
        size: int,
        after: str | None = None,
    ) -> tuple[Loaded[TurnRecord], str | None]:
        """The tenant's turns in ``status``, newest first, without their texts."""
        _admin(principal)
        return self.turns.page_for_admin(principal, status=status, owner_id=owner_id, size=size, after=after)

    def get(self, principal: Principal, turn_id: str) -> TurnRecord:
        """One turn of the tenant, whole (404 for another tenant's: the key embeds the tenant)."""
        _admin(principal)
        return self.turns.get(principal, turn_id)

    def retry(self, actor: Actor, turn_id: str) -> RetriedTurn:
        """Send a failed turn back for extraction (409 ``turn_not_failed`` for any other status;
        of two concurrent retries one wins, the other sees the turn pending and gets that 409)."""
        principal = actor.principal
        _admin(principal)
        for _ in range(_SAVE_TRIES):
            turn, seq, term = self.turns.load(principal.tenant_id, turn_id)
            if turn.extraction_status != "failed":
                raise not_failed(turn_id, turn.extraction_status)
            before = turn.model_copy()
            now = utcnow()
            turn.extraction_status = "pending"
            turn.attempts = 0
            turn.finished_at = None
            note = f"retry requested by {principal.user_id} at {now.isoformat()}; it had failed: {before.error or '?'}"
            turn.error = note[:MAX_ERROR_CHARS]
            try:
                self.turns.save(turn, seq_no=seq, primary_term=term)
            except Conflict:
                continue  # changed since it was read (another retry): read it again
            break
        else:
            raise Conflict(f"turn {turn_id!r} is being changed concurrently; try again")
        queued = self._enqueue(turn)
        self._audit(actor, before, queued)
        return RetriedTurn(turn=turn, previous_error=before.error, previous_attempts=before.attempts, queued=queued)

    def retry_failed(self, actor: Actor, *, owner_id: str | None = None, limit: int = 100) -> BulkRetry:
        """Retry up to ``limit`` of the tenant's failed turns, newest first (each as
        :meth:`retry`, each audited). A turn another admin retried meanwhile is reported in
        ``not_retried``, not failed: the request's other turns still go."""
        _admin(actor.principal)
        limit = max(1, min(limit, MAX_BULK_RETRY))
        page, next_cursor = self.turns.page_for_admin(actor.principal, status="failed", owner_id=owner_id, size=limit)
        retried: list[RetriedTurn] = []
        skipped: dict[str, str] = {}
        for listed in page:
            try:
                retried.append(self.retry(actor, listed.turn_id))
            except Conflict as exc:  # retried (or erased into quarantine) since the listing
                skipped[listed.turn_id] = exc.message
        for turn_id in page.quarantined:
            skipped[turn_id] = "the stored turn cannot be loaded (see /v1/admin/quarantine?kind=turn)"
        return BulkRetry(retried=retried, not_retried=skipped, more=next_cursor is not None)

    def _enqueue(self, turn: TurnRecord) -> bool:
        try:
            self.queue.extract(turn.tenant_id, turn.turn_id)
        except Exception as exc:  # the turn is pending, attempts left: the sweep sends it later
            log.warning("retried turn %s not enqueued (the sweep will send it): %s", turn.turn_id, exc)
            return False
        return True

    def _audit(self, actor: Actor, before: TurnRecord, queued: bool) -> None:
        self.lifecycle.record(
            Change(actor=actor),
            AuditAction.TURN_RETRY,
            [],
            scopes=list(before.scope),
            details={
                "turn_id": before.turn_id,
                "owner_id": before.owner_id,
                "session_id": before.session_id,
                "previous_error": before.error,
                "previous_attempts": before.attempts,
                "previous_finished_at": before.finished_at.isoformat() if before.finished_at else None,
                "queued": queued,
            },
        )
