"""A recall's tiers searched while its rate-limit round trip is still in flight (issue 16).

``POST /v1/recall`` waits for two things in turn: the rate limit's Redis round trip (which also
reads the tenant's write version and accounts version, :mod:`service.auth.ratelimit`), then the
recall itself (the message matched against the tenant's vocabulary and the tiers searched, all at
that write version). The second needs the first only for the write version, and that version
rarely changes between two recalls of a tenant. So when the caller's API key was verified earlier
in this process (no I/O to know who it is) and the limiter remembers the tenant's write version
from its last round trip, the recall starts at once at that version, on the event loop, beside the
round trip: its matching runs while Redis answers, and its search is sent ~0.2 ms earlier.

The guess is then checked, and the early result is used only if the request would have built
exactly the same one: the round trip let the request through, the credential was confirmed
without being verified again (so the principal, its grants included, is the one the recall ran
as), and the write version it read is the one the recall ran at. Anything else (a refusal, a
changed tenant, a credential verified again, Redis unanswered) discards it and the recall runs as
it always did, after the round trip. A discarded recall is never cancelled half-way (its reads go
on to their answers, so no socket is dropped) and nothing of it reaches the caller: its
searches are the chokepoint's for that principal, and what it leaves in the caches is keyed by
those searches and the version it read (``service/recall/tier_cache.py``), as any recall's is.

What it costs: a refused caller's recall is searched and discarded; the limiter remembers a
refusal until its ``Retry-After`` and no recall starts early meanwhile, so a caller over its limit
costs at most one early recall per window per process. After a write, the process that wrote
forgets the tenant's version (no early recall at a version it knows is old), while the tenant's
next recall in each other process is built twice (the early one at the old version, discarded).
``TENURE_API_RECALL_AHEAD=false`` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from service.domain.principal import Principal
from service.recall.service import Built, RecallService
from service.telemetry import metrics

log = logging.getLogger(__name__)


class RecallAhead:
    """One request's recall, started before its rate-limit round trip answered (see the module)."""

    def __init__(self, scopes: list[str], query: str, **options: Any) -> None:
        self.scopes = scopes
        self.query = query
        self.options = options  # RecallService.abuild's: budget, explain
        self._task: asyncio.Task[Built] | None = None
        self._started_as: tuple[Principal, int] | None = None

    def start(self, recall: RecallService, principal: Principal, write_version: int) -> None:
        """Build the recall for ``principal`` at ``write_version`` now, beside the round trip."""
        self._started_as = (principal, write_version)
        build = recall.abuild(principal, self.scopes, self.query, write_version=write_version, **self.options)
        self._task = asyncio.get_running_loop().create_task(build)

    async def take(self, principal: Principal, write_version: int | None) -> Built | None:
        """The early recall if it was started for exactly this principal at exactly this write
        version (its errors are the request's, as they would have been after the round trip);
        None when there is none or it is discarded."""
        task, started_as = self._task, self._started_as
        if task is None or started_as != (principal, write_version):
            self.discard()
            return None
        self._task = None
        metrics.RECALL_AHEAD.labels("used").inc()
        return await task

    def discard(self) -> None:
        """Forget the early recall: it runs to its end, its result and errors unread."""
        task, self._task = self._task, None
        if task is not None:
            metrics.RECALL_AHEAD.labels("discarded").inc()
            task.add_done_callback(_unread)


def _unread(task: asyncio.Task[Built]) -> None:
    """A discarded recall's outcome: an error is logged at debug (the request went on without it),
    never reported as an exception nobody retrieved."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug("a recall started ahead of its rate limit failed and was discarded: %r", exc)
