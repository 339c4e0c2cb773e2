"""The beliefs' change logs, kept out of the belief documents (issue 16, item 4).

A belief's change log (up to ``MAX_CHANGE_LOG`` entries) used to sit in its document. Recall
never reads it, but OpenSearch parsed every hit's whole source to leave it out: at 200 entries a
belief that cost +64 % OpenSearch CPU per search (docs/benchmarks.md, "What the beliefs' change
logs cost recall"). The log now lives in its own index family, ``<namespace>-belief-logs``, one
document per stored version of a belief's log, keyed ``<tenant>:<ref>`` and routed by tenant; the
belief document keeps only ``change_log_ref``, the ref of its current log.

Write protocol (:meth:`ChangeLogStore.split`, then the belief store's write): the log document is
written first, under a fresh ref; then the belief document, pointing at it. A crash between the two
leaves an unreferenced log document (an orphan, removed by :meth:`ChangeLogStore.sweep_orphans`),
never a belief whose history is missing. Once the belief points at the new log, its previous log
document is deleted (:meth:`ChangeLogStore.retire`).

Reads (:meth:`ChangeLogStore.attach`): a read that loads whole beliefs (a belief by id, history,
export, the write path's own reads) puts each hit's log back into ``change_log`` before the model
loads it, so the model and every caller see the belief as before. A log read after its belief
moved on may already be retired: the belief is read again and its new log fetched. A log that is
still missing makes the belief unreadable (quarantined) rather than silently historyless, so it is
never written back with its history lost.

Documents written before this module keep their log inline, and still load; their next write moves
it out.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from opensearchpy import OpenSearch, helpers

from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import Conflict, ValidationFailed
from service.storage import access
from service.storage.client import bulk_item, found_item, index_routed, routed_id, translate_errors
from service.storage.templates import BELIEF_LOGS, BELIEFS

log = logging.getLogger(__name__)

LOG_FIELD = "change_log"  # the model's field, which the belief document no longer stores
REF_FIELD = "change_log_ref"
# What a belief whose log cannot be found loads with: not a list, so the model refuses it and the
# belief is quarantined (docs/operations.md, quarantine) instead of loading without its history.
MISSING_LOG = "change log document missing"
_REREADS = 3  # a belief rewritten this many times during one read is read as it then stands
_MGET_CHUNK = 500
_KEYS = ("tenant_id", "belief_id", "ref")  # what the orphan sweep reads of a log document
# A log document younger than this is never swept: its belief write may still be on its way.
ORPHAN_MIN_AGE = timedelta(minutes=10)

Hit = dict[str, Any]


@dataclass(frozen=True)
class PendingLog:
    """A log document to write before the belief document that points at it."""

    tenant_id: str
    belief_id: str
    ref: str
    document: dict[str, Any]


@dataclass(frozen=True)
class SweepPace:
    """How the orphan sweep shares the node with recall. After each page it rests so that its
    requests take ``work_fraction`` of its wall time (0.25: it works a quarter of the time), and a
    pass starts no new tenant once ``budget_s`` seconds have gone by (None: no limit), so one beat
    run stays well inside its task's time limit at any corpus size and the next run goes on from
    where it stopped (docs/operations.md, "Change logs")."""

    work_fraction: float = 1.0
    budget_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if not 0.0 < self.work_fraction <= 1.0:
            raise ValueError("work_fraction must be in (0, 1]")

    def rest_after(self, work_started: float) -> None:
        worked = self.clock() - work_started
        if self.work_fraction < 1.0 and worked > 0:
            self.sleep(worked * (1.0 - self.work_fraction) / self.work_fraction)

    def spent(self, started: float) -> bool:
        return self.budget_s is not None and self.clock() - started >= self.budget_s


@dataclass(frozen=True)
class SweepPass:
    """What one orphan sweep did: log documents removed, tenants swept to their end, and the last
    of them when the pass stopped early (its budget), for the next pass to resume after; None
    once every tenant was swept."""

    removed: int
    tenants: int
    resume_after: str | None


class ChangeLogStore:
    def __init__(self, client: OpenSearch, namespace: str):
        self.client = client
        self.alias = BELIEF_LOGS.alias(namespace)
        self.beliefs_alias = BELIEFS.alias(namespace)

    # ---------------------------------------------------------------- writes

    @staticmethod
    def split(document: dict[str, Any]) -> PendingLog | None:
        """Take the change log out of a belief's stored form. The document then names a fresh ref
        (returned with the log document to write first) or, for an empty log, none."""
        entries = document.pop(LOG_FIELD, None) or []
        document.pop(REF_FIELD, None)
        if not entries:
            return None
        tenant_id, belief_id = str(document["tenant_id"]), str(document["id"])
        ref = uuid.uuid4().hex
        document[REF_FIELD] = ref
        body = {
            "tenant_id": tenant_id,
            "belief_id": belief_id,
            "ref": ref,
            "entry_count": len(entries),
            "entries": entries,
            "created_at": utcnow().isoformat(),
        }
        return PendingLog(tenant_id, belief_id, ref, body)

    def write(self, pending: PendingLog) -> None:
        """Store one log document. Not refreshed: it is read by id, which is real time."""
        index_routed(
            self.client,
            index=self.alias,
            doc_id=routed_id(pending.tenant_id, pending.ref),
            body=pending.document,
            routing=pending.tenant_id,
            refresh="false",
            action="store a belief's change log",
            on_conflict="change log written twice",
        )

    def _bulk_actions(self, pending: Iterable[PendingLog]) -> Iterator[dict[str, Any]]:
        for one in pending:
            yield {
                "_op_type": "index",
                "_index": self.alias,
                "_id": routed_id(one.tenant_id, one.ref),
                "_routing": one.tenant_id,
                "_source": one.document,
            }

    def write_many(self, pending: list[PendingLog]) -> set[str]:
        """Store log documents in bulk; returns the refs stored (a belief whose log failed is not
        written after it)."""
        if not pending:
            return set()
        stored: set[str] = set()
        with translate_errors("store change logs"):
            for ok, item in helpers.streaming_bulk(
                self.client,
                self._bulk_actions(pending),
                chunk_size=_MGET_CHUNK,
                raise_on_error=False,
                raise_on_exception=False,
                max_retries=2,
            ):
                key = str(bulk_item(item).get("_id", ""))
                if ok:
                    stored.add(key.rsplit(":", 1)[-1])
        return stored

    def current_refs(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The refs the stored beliefs ``(tenant, belief id)`` point at now (real time): the logs a
        write replaces, to retire once it is done. One ``mget`` per :data:`_MGET_CHUNK` beliefs
        whatever their tenants (each document routed by its own)."""
        out: dict[tuple[str, str], str] = {}
        for start in range(0, len(keys), _MGET_CHUNK):
            chunk = keys[start : start + _MGET_CHUNK]
            docs = [{"_id": routed_id(tenant, b), "routing": tenant} for tenant, b in chunk]
            with translate_errors("read the beliefs' change-log refs"):
                answer = self.client.mget(index=self.beliefs_alias, body={"docs": docs}, _source_includes=REF_FIELD)
            for key, doc in zip(chunk, answer.get("docs", []), strict=False):
                ref = (doc.get("_source") or {}).get(REF_FIELD) if found_item(doc, "read change-log refs") else None
                if isinstance(ref, str):
                    out[key] = ref
        return out

    def retire(self, tenant_id: str, refs: Iterable[str]) -> None:
        """Delete log documents no belief points at any more (the previous log after a write, or a
        new one whose belief write was refused). Best effort: one left behind is an orphan, which
        the sweep removes; it is never read. One request: a delete, or a bulk of them."""
        wanted = [routed_id(tenant_id, ref) for ref in refs]
        try:
            if len(wanted) == 1:
                self.client.delete(index=self.alias, id=wanted[0], routing=tenant_id, ignore=[404])
            elif wanted:
                delete = {"_op_type": "delete", "_index": self.alias, "_routing": tenant_id}
                actions = [{**delete, "_id": key} for key in wanted]
                helpers.bulk(self.client, actions, raise_on_error=False)  # an absent one is fine
        except Exception as exc:  # noqa: BLE001 - the write it follows has succeeded
            log.warning("change logs %s of tenant %s not deleted (%s); the orphan sweep will", wanted, tenant_id, exc)

    def delete_of_beliefs(self, principal: Principal, belief_ids: list[str]) -> int:
        """Delete every log document of the tenant's given beliefs, orphans included (erase, and
        undoing a half-done write); returns how many were deleted."""
        if not belief_ids:
            return 0
        filters = access.for_admin(principal)
        with translate_errors("erase change logs"):
            self.client.indices.refresh(index=self.alias)  # logs written a moment ago are found too
            result = self.client.delete_by_query(
                index=self.alias,
                routing=filters.routing,
                body={"query": filters.query({"terms": {"belief_id": belief_ids}})},
                conflicts="proceed",
                refresh=True,
            )
        return int(result.get("deleted", 0))

    # ----------------------------------------------------------------- reads

    def fetch(self, keys: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[Any]]:
        """The entries of the log documents ``(tenant, belief id, ref)``, by ``(tenant, ref)``; a
        document that is absent or belongs to another belief is left out."""
        out: dict[tuple[str, str], list[Any]] = {}
        for start in range(0, len(keys), _MGET_CHUNK):
            chunk = keys[start : start + _MGET_CHUNK]
            docs = [{"_id": routed_id(tenant, ref), "routing": tenant} for tenant, _, ref in chunk]
            with translate_errors("read change logs"):
                answer = self.client.mget(index=self.alias, body={"docs": docs})
            for (tenant, belief_id, ref), doc in zip(chunk, answer.get("docs", []), strict=False):
                source = doc.get("_source") if found_item(doc, "read change logs") else None
                if not isinstance(source, dict):
                    continue
                if source.get("tenant_id") != tenant or source.get("belief_id") != belief_id:
                    continue
                entries = source.get("entries")
                if isinstance(entries, list):
                    out[(tenant, ref)] = entries
        return out

    def attach(self, hits: list[Hit], reread: Callable[[Hit], Hit | None]) -> list[Hit]:
        """``hits`` (whole belief documents, from search or get) with each one's change log put
        back in its source. A belief whose log was retired since it was read is read again
        (``reread``: the same document now, None when deleted); a belief deleted meanwhile is left
        out. Hits of beliefs stored with their log inline are returned as they are."""
        out = list(hits)
        waiting = [i for i, hit in enumerate(out) if _key(hit) is not None]
        for attempt in range(_REREADS + 1):
            keys = {i: key for i in waiting if (key := _key(out[i])) is not None}
            found = self.fetch(list(dict.fromkeys(keys.values()))) if keys else {}
            waiting = []
            for i, (tenant, _, ref) in keys.items():
                entries = found.get((tenant, ref))
                if entries is not None:
                    out[i]["_source"][LOG_FIELD] = entries
                elif attempt < _REREADS:
                    waiting.append(i)
                else:
                    out[i]["_source"][LOG_FIELD] = MISSING_LOG
            if not waiting:
                break
            for i in waiting:
                fresh = reread(out[i])
                out[i] = fresh if fresh is not None else {}
            waiting = [i for i in waiting if out[i]]
        return [hit for hit in out if hit]

    # ------------------------------------------------------------ maintenance

    def sweep_orphans(
        self,
        *,
        tenant_id: str | None = None,
        page: int = _MGET_CHUNK,
        pace: SweepPace | None = None,
        resume_after: str | None = None,
    ) -> SweepPass:
        """Delete log documents older than :data:`ORPHAN_MIN_AGE` that their belief does not point
        at (a write that crashed between its log and its belief, a refused write whose log was not
        deleted, a belief hard-deleted by an older version). Tenant by tenant, in tenant order, from
        the one after ``resume_after``: per tenant one routed scroll over its logs reading keys from
        doc values (never the logs themselves), one belief ``mget`` per ``page`` log documents.
        ``pace`` spreads the work out and ends the pass early (its budget); the answer then names
        the last tenant swept, for the next pass to resume after. ``tenant_id`` sweeps that tenant
        only, whatever ``resume_after``."""
        pace = pace or SweepPace()
        started = pace.clock()
        removed = swept = 0
        last: str | None = None
        for tenant in self._tenants_with_old_logs(tenant_id, resume_after, page):
            if swept and pace.spent(started):  # a pass always sweeps one tenant: it never stalls
                return SweepPass(removed, swept, resume_after=last)
            removed += self._sweep_tenant(tenant, page, pace)
            swept += 1
            last = tenant
        return SweepPass(removed, swept, resume_after=None)

    def _tenants_with_old_logs(self, tenant_id: str | None, after: str | None, page: int) -> Iterator[str]:
        """The tenants that hold log documents old enough to sweep, in order, after ``after``: a
        composite aggregation over ``tenant_id`` (keys only, like every maintenance scan)."""
        if tenant_id is not None:  # one tenant's sweep (an admin's): the cursor is the other passes'
            yield tenant_id
            return
        scan = access.maintenance_scan("change-log orphan sweep (tenants)")
        composite: dict[str, Any] = {"size": page, "sources": [{"tenant_id": {"terms": {"field": "tenant_id"}}}]}
        if after is not None:
            composite["after"] = {"tenant_id": after}
        while True:
            body = {"size": 0, "query": scan.query(_old_enough()), "aggs": {"tenants": {"composite": composite}}}
            with translate_errors("sweep change logs"):
                tenants = self.client.search(index=self.alias, body=body)["aggregations"]["tenants"]
            yield from (str(bucket["key"]["tenant_id"]) for bucket in tenants["buckets"])
            if not tenants["buckets"] or not tenants.get("after_key"):
                return
            composite["after"] = tenants["after_key"]

    def _sweep_tenant(self, tenant_id: str, page: int, pace: SweepPace) -> int:
        scan = access.maintenance_scan("change-log orphan sweep", tenant_id)
        query = {"_source": False, "docvalue_fields": list(_KEYS), "query": scan.query(_old_enough())}
        removed = 0
        batch: list[dict[str, str]] = []
        with translate_errors("sweep change logs"):
            work_started = pace.clock()
            for hit in helpers.scan(self.client, index=self.alias, query=query, size=page, routing=tenant_id):
                batch.append({k: str(hit["fields"][k][0]) for k in _KEYS})
                if len(batch) >= page:
                    removed += self._remove_unreferenced(batch)
                    batch = []
                    pace.rest_after(work_started)
                    work_started = pace.clock()
            removed += self._remove_unreferenced(batch)
            pace.rest_after(work_started)
        return removed

    def _remove_unreferenced(self, logs: list[dict[str, str]]) -> int:
        if not logs:
            return 0
        current = self.current_refs(list(dict.fromkeys((o["tenant_id"], o["belief_id"]) for o in logs)))
        stale: dict[str, list[str]] = {}
        for one in logs:
            if current.get((one["tenant_id"], one["belief_id"])) != one["ref"]:
                stale.setdefault(one["tenant_id"], []).append(one["ref"])
        for tenant, refs in stale.items():
            self.retire(tenant, refs)
        return sum(len(refs) for refs in stale.values())


def _old_enough() -> dict[str, Any]:
    return {"range": {"created_at": {"lt": (utcnow() - ORPHAN_MIN_AGE).isoformat()}}}


def _key(hit: Hit) -> tuple[str, str, str] | None:
    """``(tenant, belief id, ref)`` of a hit whose source names its log document."""
    source = hit.get("_source")
    if not isinstance(source, dict):
        return None
    ref, tenant, belief_id = source.get(REF_FIELD), source.get("tenant_id"), source.get("id")
    if isinstance(ref, str) and isinstance(tenant, str) and isinstance(belief_id, str):
        return tenant, belief_id, ref
    return None


def refused(exc: Exception) -> bool:
    """Whether a failed belief write certainly stored nothing (OpenSearch answered with a refusal),
    so the log written for it can go at once; after a timeout or a broken connection the write may
    have landed, and its log must stay."""
    return isinstance(exc, (Conflict, ValidationFailed))
