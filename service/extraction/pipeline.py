"""Extraction of one recorded turn: validate its sidecar, merge, record the outcome on the turn.

Called by the ``beliefs.extract`` task with ``(tenant_id, turn_id)``. Idempotent: a turn already
``done`` is not processed again, and every merge step is itself idempotent per turn (see
:mod:`service.extraction.merge`), so a redelivered or swept task is safe at any point.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from service.beliefs.lifecycle import BeliefLifecycle
from service.config import MemoryLoopSettings
from service.domain.accounts import Credential, Grants, author_at_extraction
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import Conflict, StoreUnavailable, Unreadable
from service.extraction.flywheel import AliasFlywheel
from service.extraction.merge import BeliefMerger, MergeContext
from service.extraction.sidecar import ParseStatus
from service.extraction.validator import AliasCandidate, validate_sidecar
from service.storage.reviews import ReviewStore
from service.storage.turns import TurnRecord, TurnStore
from service.telemetry import metrics

FINAL = ("done", "skipped", "failed")
# A store that cannot answer now: worth retrying, and never a reason to give a turn up.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (StoreUnavailable, ConnectionError, TimeoutError)


class AccountStatus(Protocol):
    """Whether a tenant or user is disabled, and the user's grants as provisioned (None: no user
    record, e.g. a JWT subject of an identity provider): :class:`AccountStore`'s one ``mget``."""

    def account_status(self, tenant_id: str, user_id: str) -> tuple[bool, Grants | None]: ...


class Revocations(Protocol):
    """Why the one credential a turn was recorded with refuses it now, by the check a request
    with it meets (None: it does not): :class:`service.auth.revocations.CredentialRevocations`."""

    def refusal(
        self, tenant_id: str, user_id: str, credential: Credential | None, credential_id: str | None
    ) -> str | None: ...


# why a turn whose author a request would refuse now writes nothing (a revoked credential says its own)
AUTHOR_REFUSED = "the turn's author or tenant is disabled, or the author's account is gone"


@dataclass(frozen=True)
class ExtractionOutcome:
    turn_id: str
    status: str
    result: dict[str, Any]
    alias_candidates: int = 0


class ExtractionPipeline:
    def __init__(
        self,
        lifecycle: BeliefLifecycle,
        turns: TurnStore,
        reviews: ReviewStore,
        policy: MemoryLoopSettings,
        *,
        actor_kind: str = "worker",
        accounts: AccountStatus | None = None,
        revocations: Revocations | None = None,
    ):
        self.turns = turns
        self.revocations = revocations
        self.policy = policy
        self.actor_kind = actor_kind
        self.accounts = accounts
        self.merger = BeliefMerger(lifecycle, reviews, policy)
        self.flywheel = AliasFlywheel(lifecycle, reviews, policy)

    def author(self, turn: TurnRecord) -> Principal | None:
        """Who writes the turn's beliefs (None: nobody, :meth:`judged` says why)."""
        return self.judged(turn)[0]

    def judged(self, turn: TurnRecord) -> tuple[Principal | None, str]:
        """Who writes the turn's beliefs: its author as a request with the turn's credential would
        be judged now (:func:`author_at_extraction`), since a revoked credential or grant, or a
        disabled account, is enforced on every request at once and a turn recorded before and
        extracted after must not outlast it. An API key's or development token's turn: the grants
        recorded on it that the user still holds. An identity provider's: the token's own,
        recorded on the turn (a user record here only disables it, as on a request). None, with
        the reason, when that request would be refused: the very credential that recorded the turn
        revoked since (a leaked key's injected turns must not become shared beliefs once an admin
        revoked it; one that merely expired does not count, it was valid when it recorded the
        turn), or a disabled author or tenant. A turn that names no credential id (recorded before
        turns carried it) is not checked for revocation, as before."""
        recorded = turn.principal()
        if self.revocations is not None:
            refusal = self.revocations.refusal(turn.tenant_id, turn.owner_id, turn.credential, turn.credential_id)
            if refusal is not None:
                return None, refusal
        if self.accounts is None:
            return recorded, ""
        disabled, grants = self.accounts.account_status(turn.tenant_id, turn.owner_id)
        author = author_at_extraction(recorded, turn.credential, disabled, grants)
        return author, "" if author is not None else AUTHOR_REFUSED

    def context(self, turn: TurnRecord, principal: Principal) -> MergeContext:
        return MergeContext(
            principal=principal,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            source_model=turn.model,
            session_scopes=turn.scope,
            actor_kind=self.actor_kind,
        )

    def _claim(self, tenant_id: str, turn_id: str) -> TurnRecord | None:
        """Mark the turn running (one more attempt); None when it is already final."""
        for _ in range(3):
            turn, seq, term = self.turns.load(tenant_id, turn_id)
            if turn.extraction_status in FINAL:
                return None
            turn.extraction_status = "running"
            turn.attempts += 1
            try:
                self.turns.save(turn, seq_no=seq, primary_term=term)
                return turn
            except Conflict:
                continue
        raise Conflict(f"turn {turn_id!r} is being changed concurrently")

    def _finish(self, turn: TurnRecord, status: str, result: dict[str, Any], error: str | None = None) -> None:
        for _ in range(3):
            current, seq, term = self.turns.load(turn.tenant_id, turn.turn_id)
            current.extraction_status = status  # type: ignore[assignment]
            current.result = result
            current.error = error
            current.finished_at = utcnow()
            try:
                self.turns.save(current, seq_no=seq, primary_term=term)
                return
            except Conflict:
                continue

    def _release(self, turn: TurnRecord) -> None:
        """Hand a claim back after a transient store failure: the turn is pending again and the
        attempt does not count, since ``max_extraction_attempts`` bounds crashes, not outages (an
        outage that outlasts the task's retries must leave the turn to the sweep, not use up its
        attempts). Best effort: a store that cannot take this either leaves the turn running,
        and the sweep finds it just the same."""
        with contextlib.suppress(*TRANSIENT_ERRORS, Conflict):
            current, seq, term = self.turns.load(turn.tenant_id, turn.turn_id)
            if current.extraction_status != "running" or current.attempts != turn.attempts:
                return  # another delivery moved it on meanwhile
            current.extraction_status = "pending"
            current.attempts -= 1
            self.turns.save(current, seq_no=seq, primary_term=term)

    def run(self, tenant_id: str, turn_id: str) -> ExtractionOutcome:
        try:
            outcome = self._run(tenant_id, turn_id)
        except TRANSIENT_ERRORS:
            metrics.EXTRACTIONS.labels("retried").inc()
            raise
        except Unreadable:
            # a stored turn this version cannot load (logged once with its id by the store): no
            # retry can help and nothing can be written back to it; the sweep leaves it out too
            outcome = ExtractionOutcome(turn_id, "quarantined", {})
        metrics.EXTRACTIONS.labels(outcome.status).inc()
        return outcome

    def _run(self, tenant_id: str, turn_id: str) -> ExtractionOutcome:
        turn = self._claim(tenant_id, turn_id)
        if turn is None:
            return self._already_final(tenant_id, turn_id)
        try:
            return self._extract(turn)
        except TRANSIENT_ERRORS:
            self._release(turn)
            raise

    def _extract(self, turn: TurnRecord) -> ExtractionOutcome:
        turn_id = turn.turn_id
        if turn.gate == "extraction_off":
            self._finish(turn, "skipped", {"reason": "extraction is switched off for this tenant"})
            return ExtractionOutcome(turn_id, "skipped", {})
        author, refusal = self.judged(turn)
        if author is None:
            self._finish(turn, "skipped", {"reason": refusal})
            return ExtractionOutcome(turn_id, "skipped", {})
        validated = validate_sidecar(
            turn.sidecar_raw,
            ParseStatus(turn.parse_status),
            max_chars=self.policy.sidecar_max_chars,
        )
        report = self.merger.apply(self.context(turn, author), validated)
        result: dict[str, Any] = {
            "validation": validated.summary(),
            "merge": report.as_dict(),
            "alias_candidates": [
                {
                    "surface": c.surface,
                    "possible_entities": c.possible_entities,
                    "confidence": c.confidence,
                }
                for c in validated.alias_candidates
            ],
        }
        self._finish(turn, "done", result)
        return ExtractionOutcome(turn_id, "done", result, len(validated.alias_candidates))

    def _already_final(self, tenant_id: str, turn_id: str) -> ExtractionOutcome:
        """A turn finished by an earlier attempt. Its alias candidates are reported again, so the
        task enqueues ``aliases.enrich`` again: that attempt may have died after marking the turn
        done and before the send (the flywheel is idempotent per turn; a second send is harmless,
        a lost one would never be retried, as the sweep only looks at unfinished turns)."""
        turn, _, _ = self.turns.load(tenant_id, turn_id)
        done = turn.extraction_status == "done"
        candidates = ((turn.result or {}).get("alias_candidates") or []) if done else []
        return ExtractionOutcome(turn_id, "already_final", {}, len(candidates))

    def interrupted(self, tenant_id: str, turn_id: str, reason: str) -> None:
        """Hand back a turn whose attempt was cut short by something other than its sidecar (the
        task's soft time limit, a store error that is no answer about the data): every merge step
        is idempotent per turn, so a later attempt finishes what this one began. The turn is
        pending again, with the reason, for the sweep; the attempt still counts, so a turn that
        overruns every time ends ``failed`` once its attempts are spent instead of looping.
        Best effort, like :meth:`_release`: a store that cannot take this leaves the turn running,
        and the sweep finds it just the same."""
        with contextlib.suppress(*TRANSIENT_ERRORS, Conflict):
            current, seq, term = self.turns.load(tenant_id, turn_id)
            if current.extraction_status != "running":
                return  # finished or handed back by another delivery meanwhile
            current.extraction_status = "pending"
            current.error = reason[:2000]
            self.turns.save(current, seq_no=seq, primary_term=term)
        metrics.EXTRACTIONS.labels("interrupted").inc()

    def give_up(self, tenant_id: str, turn_id: str) -> None:
        """Fail a turn the sweep will not send again: its attempts are spent and none of them
        finished it. Without this it would stay pending or running for ever, with no error to
        show an admin. The last interruption's reason is kept in the message."""
        turn, _, _ = self.turns.load(tenant_id, turn_id)
        if turn.extraction_status in FINAL:
            return
        last = f"; the last one: {turn.error}" if turn.error else ""
        self._failed(turn, f"gave up after {turn.attempts} attempts, none finished{last}")

    def fail(self, tenant_id: str, turn_id: str, error: str) -> None:
        """Give up on a turn that cannot be extracted (the sweep will not pick it up again)."""
        turn, _, _ = self.turns.load(tenant_id, turn_id)
        self._failed(turn, error)

    def _failed(self, turn: TurnRecord, error: str) -> None:
        self._finish(turn, "failed", turn.result or {}, error[:2000])
        metrics.EXTRACTIONS.labels("failed").inc()

    def enrich(self, tenant_id: str, turn_id: str) -> list[dict[str, Any]]:
        """Apply the flywheel rules to the alias candidates recorded on a finished turn."""
        turn, _, _ = self.turns.load(tenant_id, turn_id)
        raw = (turn.result or {}).get("alias_candidates") or []
        candidates = [
            AliasCandidate(
                surface=c["surface"],
                possible_entities=list(c["possible_entities"]),
                confidence=c["confidence"],
            )
            for c in raw
        ]
        author = self.author(turn)
        if author is None:
            return []
        outcomes = self.flywheel.process(self.context(turn, author), turn.user_message, candidates)
        return [o.__dict__ for o in outcomes]
