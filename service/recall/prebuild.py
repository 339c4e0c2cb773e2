"""Tenant vocabularies built by the workers right after a belief write, off the recall path.

Every belief write bumps the tenant's write version (:mod:`service.write_versions`), and the next
recall of the tenant in each API process needs its vocabulary at the new version
(:mod:`service.recall.vocabulary`). Without this module the first of those recalls builds it: one
routed search over the tenant's stored units and ~30-65 ms of Python at 1,000 beliefs
(docs/benchmarks.md, issue 16), on the request path of a user who is typing the next message of a
session whose last turn was just extracted. The other API processes then load the build from
Redis (:mod:`service.recall.shared_vocabulary`), a restore of ~5-15 ms.

Here a worker builds the vocabulary as soon as the write is over: after each of its own tasks
that wrote (extraction, enrichment, compaction, retention: ``workers/resources.py`` runs
:meth:`VocabularyPrebuilder.run_pending` after each task), and for a write through the API after a
``vocabulary.prebuild`` task the API sent (:meth:`service.extraction.queue.TaskQueue.prebuild_vocabularies`,
one waiting per tenant at most). It stores it in the shared entry with
the same check-and-set as an API build: stored only while the tenant's version is still the one
it was built at, so a build that raced a newer write never lands. Every API process then restores
instead of building. Nothing else changes: an API process that finds no entry (the worker is
behind, down or turned off) builds as before, and a recall answers the same either way (the
entry is the same encoding of the same units).

A prebuild never fails the task that wrote: a store that does not answer is logged and counted
(``tenure_vocabulary_prebuild_total{outcome="failed"}``), and the next recall builds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Literal

from service.config import RecallDefaults
from service.domain.principal import Principal
from service.recall.shared_vocabulary import SharedVocabularies
from service.recall.vocabulary import TenantVocabulary
from service.storage import calls
from service.storage.beliefs import BeliefStore
from service.storage.vocabulary import VocabularyStore
from service.telemetry import metrics
from service.write_versions import TenantWriteVersions

log = logging.getLogger(__name__)

# The vocabulary read is the tenant's whole (access.for_vocabulary: the tenant term and routing
# come from the principal, no owner or scope term), so the user named here filters nothing; it
# names who read, in the slow log and the node's task list.
PREBUILD_USER = "system:vocabulary-prebuild"

Outcome = Literal["built", "fresh", "outdated", "failed"]


def prebuild_enabled(defaults: RecallDefaults) -> bool:
    """Whether a prebuilt vocabulary could be used: recall matches from vocabularies, they are
    shared through Redis, and prebuilding is on."""
    return defaults.vocabulary_matching and defaults.vocabulary_prebuild and defaults.vocabulary_shared_ttl_s > 0


class VocabularyPrebuilder:
    """Builds and shares the vocabularies of the tenants a process wrote (see the module
    docstring). :meth:`note` is called with the tenants of every write-version bump;
    :meth:`run_pending` builds each noted tenant once, however many writes it had."""

    def __init__(self, store: VocabularyStore, versions: TenantWriteVersions, shared: SharedVocabularies):
        self.store = store
        self.versions = versions
        self.shared = shared
        self._lock = threading.Lock()
        self._pending: set[str] = set()

    @classmethod
    def for_store(cls, beliefs: BeliefStore, defaults: RecallDefaults) -> VocabularyPrebuilder | None:
        """A prebuilder over ``beliefs``' index, or None when there is nothing to prebuild for:
        recall does not match from vocabularies, or they are not shared, or the store has no
        write versions (an entry is only ever trusted for one version)."""
        versions = beliefs.versions
        if versions is None or not prebuild_enabled(defaults):
            return None
        shared = SharedVocabularies(versions.client, versions.namespace, ttl_s=defaults.vocabulary_shared_ttl_s)
        return cls(beliefs.vocabulary, versions, shared)

    def note(self, tenant_ids: Iterable[str]) -> None:
        """Remember tenants whose write version was just bumped (built by :meth:`run_pending`)."""
        with self._lock:
            self._pending.update(tenant_ids)

    def run_pending(self) -> dict[str, Outcome]:
        """Build and share the vocabulary of every noted tenant; never raises."""
        with self._lock:
            tenants, self._pending = sorted(self._pending), set()
        return {tenant_id: self._prebuild_logged(tenant_id) for tenant_id in tenants}

    def prebuild(self, tenant_id: str) -> Outcome:
        """Build the tenant's vocabulary at its current write version and share it, unless the
        shared entry already holds that version ("fresh"). "outdated": the tenant wrote again
        during the build, so the entry was not stored (that write's own prebuild follows)."""
        version = self.versions.current(tenant_id)
        mapping = calls.run(self.store.client, self.store.mapping_reads())
        stored = self.shared.load(tenant_id)
        if stored is not None and TenantVocabulary.is_encoded_for(
            stored, tenant_id=tenant_id, version=version, fingerprint=mapping.fingerprint
        ):
            return "fresh"
        principal = Principal(tenant_id=tenant_id, user_id=PREBUILD_USER)
        built = calls.run(self.store.client, TenantVocabulary.build(self.store, principal, version))
        return "built" if self.shared.store(tenant_id, version, built.encode()) else "outdated"

    def _prebuild_logged(self, tenant_id: str) -> Outcome:
        started = time.perf_counter()
        outcome: Outcome
        try:
            outcome = self.prebuild(tenant_id)
        except Exception:  # an optimisation only: the write stands, the next recall builds
            log.warning("vocabulary of %s not prebuilt; its next recall builds it", tenant_id, exc_info=True)
            outcome = "failed"
        metrics.VOCABULARY_PREBUILD.labels(outcome).inc()
        log.debug("vocabulary of %s: %s in %.1f ms", tenant_id, outcome, (time.perf_counter() - started) * 1000)
        return outcome
