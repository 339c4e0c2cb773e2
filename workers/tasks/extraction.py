"""Extraction tasks: thin wrappers that take ids plus the tenant and call the service layer."""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from opensearchpy.exceptions import TransportError

from service.errors import TenureError
from service.extraction.pipeline import TRANSIENT_ERRORS
from service.extraction.queue import TASK_DRAIN_PARKED_TURNS, TASK_ENRICH_ALIASES, TASK_EXTRACT, TASK_SWEEP_TURNS
from workers import resources
from workers.celery_app import app
from workers.tasks.base import TenantTask

logger = logging.getLogger("tenure.workers.extraction")
_limits = app.conf.tenure_settings.celery
# An attempt cut short for a reason that is not the turn's: the soft time limit (a slow store, a
# large sidecar), or an OpenSearch failure translate_errors does not map (a 500, a missing index).
# Failing the turn would lose the rest of its beliefs for good, although a re-run is idempotent;
# the turn goes back to the sweep instead, its attempt counted (the sweep fails it once they are
# spent). A sidecar or a request the store refuses (400: ValidationFailed) still fails the turn.
INTERRUPTIONS: tuple[type[Exception], ...] = (SoftTimeLimitExceeded, TransportError)


def _res() -> resources.Resources:
    return resources.get(app.conf.tenure_settings)


@app.task(  # type: ignore[untyped-decorator]
    base=TenantTask,
    name=TASK_EXTRACT,
    bind=True,
    soft_time_limit=_limits.heavy_soft_time_limit_s,
    time_limit=_limits.heavy_time_limit_s,
    max_retries=_limits.max_retries,
)
def extract_turn(self: TenantTask, tenant_id: str, turn_id: str) -> dict[str, Any]:
    """Validate and merge the sidecar of one recorded turn. Idempotent per turn; a turn that is
    already final is skipped. Transient store failures retry with backoff; when a store outage
    outlasts the retries the turn stays unfinished and the sweep enqueues it again once the
    store is back. An interrupted attempt (``INTERRUPTIONS``) leaves the turn to the sweep too.
    Any other error marks the turn ``failed`` with the error."""
    res = _res()
    res.queue.taken(tenant_id, turn_id)  # no longer waiting: a crash from here is the sweep's
    try:
        outcome = res.pipeline.run(tenant_id, turn_id)
    except TRANSIENT_ERRORS as exc:
        if self.request.retries >= (self.max_retries or 0):
            # Not "failed": that is final, and the sweep only looks at unfinished turns, so an
            # outage longer than the retries (the jittered backoff can spend them in seconds)
            # would lose the extraction for good (found by the OpenSearch fault drill).
            logger.warning("extraction of %s gave up its retries (%s); the sweep will enqueue it again", turn_id, exc)
        raise
    except INTERRUPTIONS as exc:
        logger.warning("extraction of %s interrupted (%s); the sweep will enqueue it again", turn_id, exc)
        res.pipeline.interrupted(tenant_id, turn_id, f"interrupted: {type(exc).__name__}: {exc}")
        raise
    except Exception as exc:
        # a bug or unusable data: record why on the turn (the sweep only picks up pending/running turns)
        res.pipeline.fail(tenant_id, turn_id, f"{type(exc).__name__}: {exc}")
        raise
    if outcome.alias_candidates:
        res.queue.enrich_aliases(tenant_id, turn_id)
    return {"turn_id": turn_id, "status": outcome.status}


@app.task(  # type: ignore[untyped-decorator]
    base=TenantTask,
    name=TASK_ENRICH_ALIASES,
    soft_time_limit=_limits.cheap_soft_time_limit_s,
    time_limit=_limits.cheap_time_limit_s,
    max_retries=_limits.max_retries,
)
def enrich_aliases(tenant_id: str, turn_id: str) -> list[dict[str, Any]]:
    """Flywheel: apply or queue the alias candidates of one extracted turn (idempotent)."""
    return _res().pipeline.enrich(tenant_id, turn_id)


class _Sweep(TenantTask):
    tenant_optional = True


@app.task(  # type: ignore[untyped-decorator]
    base=_Sweep,
    name=TASK_SWEEP_TURNS,
    soft_time_limit=_limits.cheap_soft_time_limit_s,
    time_limit=_limits.cheap_time_limit_s,
    max_retries=0,
)
def sweep_turns() -> int:
    """Beat: re-enqueue turns whose extraction never completed (lost message, dead worker), and
    fail those whose attempts are spent."""
    res = _res()
    loop = res.settings.loop
    # a running turn may still be in a live task until the heavy hard time limit kills it; only
    # then can nothing be running it (its message is unacked, so the queue looks drained meanwhile)
    staleness = {
        "older_than_s": loop.sweep_stale_after_s,
        "running_older_than_s": max(loop.sweep_stale_after_s, res.settings.celery.heavy_time_limit_s),
        "max_attempts": loop.max_extraction_attempts,
    }
    for tenant_id, turn_id in res.turns.exhausted_keys(**staleness):
        logger.warning("extraction of %s spent its %d attempts: failed", turn_id, loop.max_extraction_attempts)
        try:
            res.pipeline.give_up(tenant_id, turn_id)
        except TenureError as exc:  # one turn (erased meanwhile, unreadable) must not stop the sweep
            logger.warning("extraction of %s not marked failed: %s", turn_id, exc.message)
    keys = res.turns.stale_keys(**staleness)
    # a stale turn whose message still waits in the queue (its marker is set) is behind a
    # backlog, not lost: only the others are sent again. With the queue empty nothing waits, so
    # a marker still set is a message lost with a killed or wedged worker: every stale turn goes.
    if keys and res.queue.extraction_queue_drained():
        for tenant_id, turn_id in keys:
            res.queue.extract(tenant_id, turn_id)
        lost = list(keys)
    else:
        lost = [(tenant, turn) for tenant, turn in keys if res.queue.extract_unless_waiting(tenant, turn)]
    still_queued = len(keys) - len(lost)
    if lost:  # real work: a lost extraction sent again
        logger.info("sweep re-enqueued %d turns (%d stale ones still waiting in the queue)", len(lost), still_queued)
    elif still_queued:  # a backlog the worker will reach: every tick would say so, so DEBUG only
        logger.debug("sweep re-enqueued 0 turns: %d stale ones still waiting in the queue", still_queued)
    return len(lost)


@app.task(  # type: ignore[untyped-decorator]
    base=_Sweep,
    name=TASK_DRAIN_PARKED_TURNS,
    soft_time_limit=_limits.cheap_soft_time_limit_s,
    time_limit=_limits.cheap_time_limit_s,
    max_retries=0,  # the next beat tick is the retry
)
def drain_parked_turns() -> int:
    """Beat: store the proxy turns parked in Redis during an OpenSearch outage, then extract them."""
    return _res().parked_turns.drain()
