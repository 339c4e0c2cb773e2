"""Stored belief documents that the current model cannot load.

A document written before a validation rule existed (content stored as ``""``, a name longer than
the limit once normalised, a hand-edited index) must never take a colleague's read down: every
read path loads hits through :func:`load_beliefs`, which skips such a document, logs it once per
process with its id and reason, and reports its id as *quarantined*. Single-belief reads raise
:class:`~service.errors.Unreadable` (409) instead of a 500. Admins list and erase quarantined
documents by id without parsing them (``/v1/admin/quarantine``).

The other records a read serves get the same treatment through a :class:`RecordKind` (turns, review
items, audit events): :func:`load_record` / :func:`load_records` skip and log a stored record the
model cannot load, and by-key reads raise :class:`~service.errors.Unreadable`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from service.domain.belief import Belief
from service.domain.stored_belief import decode_stored
from service.errors import Unreadable
from service.lru import BoundedLru, LruBound
from service.telemetry.cache_metrics import ALL_PARTS, CacheCounts

log = logging.getLogger(__name__)

_MAX_REPORTED = 10_000
_reported: set[str] = set()
_lock = threading.Lock()


T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
_LOAD_ERRORS = (ValidationError, TypeError, ValueError, AttributeError, KeyError)


class Loaded(list[T]):
    """The records of a page of hits, plus the ids of the stored documents that were skipped."""

    def __init__(self, records: Iterable[T] = (), quarantined: Iterable[str] = ()):
        super().__init__(records)
        self.quarantined: list[str] = list(quarantined)


class LoadedBeliefs(Loaded[Belief]):
    """The beliefs of a page of hits, plus the ids of the documents that were skipped."""


@dataclass(frozen=True)
class RecordKind(Generic[M]):
    """A kind of stored record other than beliefs: its name in the quarantine listing, its model,
    and the source field holding its id."""

    name: str
    model: type[M]
    id_field: str
    noun: str = ""  # how an error message names one (default: the name)

    def record_id(self, source: Any, fallback: str | None = None) -> str:
        value = source.get(self.id_field) if isinstance(source, dict) else None
        return value if isinstance(value, str) else (fallback or "<no id>")

    def parse(self, source: Any) -> M:
        return self.model.model_validate(source)

    def named(self, record_id: str) -> str:
        """How a message names one record of this kind: ``review item 'rv-1'``."""
        return f"{self.noun or self.name} {record_id!r}"

    def erase_path(self, record_id: str) -> str:
        """Where an admin erases a quarantined record of this kind (service/api/routes/quarantine.py)."""
        return f"/v1/admin/quarantine/{self.name}/{record_id}"

    def unreadable(self, record_id: str) -> Unreadable:
        """The error of a by-key read whose stored record cannot be loaded: it names the record
        and where an admin erases it."""
        return Unreadable(
            f"{self.named(record_id)} is stored in a form this version cannot load "
            f"(quarantined); an admin can erase it at {self.erase_path(record_id)}"
        )


class _BeliefKind(RecordKind[Belief]):
    # a stored belief loads through its own document mapping, not plain model validation; one
    # already in the model's normal form without re-validating it (the same belief, the same
    # refusals: service/domain/stored_belief.py)
    def parse(self, source: Any) -> Belief:
        return decode_stored(source)

    def erase_path(self, record_id: str) -> str:
        return f"/v1/admin/quarantine/{record_id}"  # beliefs have their own route, without a kind


BELIEF_RECORDS: RecordKind[Belief] = _BeliefKind("belief", Belief, "id")


def document_id(source: dict[str, Any], fallback: str | None = None) -> str:
    return BELIEF_RECORDS.record_id(source, fallback)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "document"
        return f"{where}: {first.get('msg', 'invalid')}"
    return f"document: {type(exc).__name__}"


def why_unreadable(source: Any) -> str | None:
    """None when ``source`` loads as a belief, else the first reason it does not."""
    return why_record_unreadable(BELIEF_RECORDS, source)


def why_record_unreadable(kind: RecordKind[Any], source: Any) -> str | None:
    """None when ``source`` loads as a record of ``kind``, else the first reason it does not."""
    try:
        kind.parse(source)
    except _LOAD_ERRORS as exc:
        return _reason(exc)
    return None


def load_belief(source: Any, *, hit_id: str | None = None) -> Belief | None:
    """The belief of one stored document, or None (logged once) when it cannot be loaded."""
    return load_record(BELIEF_RECORDS, source, hit_id=hit_id)


def load_record(kind: RecordKind[M], source: Any, *, hit_id: str | None = None) -> M | None:
    """The record of one stored document, or None (logged once) when it cannot be loaded."""
    try:
        return kind.parse(source)
    except _LOAD_ERRORS as exc:
        _report(kind.name, kind.record_id(source, hit_id), source, _reason(exc))
        return None


def load_records(kind: RecordKind[M], rows: Iterable[dict[str, Any]]) -> Loaded[M]:
    """Every loadable record of ``rows`` (search hits), in order; the rest quarantined."""
    loaded: Loaded[M] = Loaded()
    for row in rows:
        record = load_record(kind, row.get("_source"), hit_id=row.get("_id"))
        if record is None:
            loaded.quarantined.append(kind.record_id(row.get("_source"), row.get("_id")))
        else:
            loaded.append(record)
    return loaded


def load_beliefs(rows: Iterable[dict[str, Any]]) -> LoadedBeliefs:
    """Every loadable belief of ``rows`` (search hits), in order; the rest quarantined."""
    loaded = load_records(BELIEF_RECORDS, rows)
    return LoadedBeliefs(loaded, loaded.quarantined)


def _report(kind: str, doc: str, source: Any, reason: str) -> None:
    tenant = source.get("tenant_id") if isinstance(source, dict) else None
    key = f"{kind}|{tenant}|{doc}"
    with _lock:
        if key in _reported:
            return
        if len(_reported) >= _MAX_REPORTED:
            _reported.clear()
        _reported.add(key)
    log.warning(
        "quarantined %s %s of tenant %s: stored document cannot be loaded (%s); skipped by reads, "
        "an admin can erase it at /v1/admin/quarantine",
        kind,
        doc,
        tenant,
        reason,
    )


def _without_inline_log(source: Any) -> Any:
    """A recall hit's source as recall reads it: without a change log still kept inside the
    document (written before the log moved out). Recall's queries take the whole source
    (service/storage/queries.py), and its beliefs never carry their history: the same belief as
    the one a ``_source`` filter leaving the log out gave, even if that old log would not load."""
    if isinstance(source, dict) and "change_log" in source:
        return {key: value for key, value in source.items() if key != "change_log"}
    return source


# How long a decoded belief may stay in a process once it is the least recently used: an erased
# belief's text is gone from every process within about this long of its last use.
DECODED_MAX_AGE_S = 600.0
AGED_DROPS_PER_BATCH = 4


class DecodedBeliefs:
    """Validated beliefs by stored document version, so the recall hot path validates a document
    once per process instead of on every hit (issue 16: full pydantic validation of every hit was a
    visible share of the API's CPU per recall).

    The key is the hit's ``(_index, _id, _seq_no, _primary_term)``: every write to a document gives
    it a new ``_seq_no``, a reindex a new ``_index``, so one key is one stored version and decodes to
    the same belief every time. Only documents that load are kept: an unloadable one goes through
    :func:`load_belief` on every read and is quarantined exactly as without this cache. Hits without
    the version fields (a query that did not ask for ``seq_no_primary_term``) are decoded afresh.
    The beliefs are shared between requests and must not be mutated (recall never does). Bounded
    LRU. An erased belief is never hit again (its document is gone): the process that served the
    erase drops it at once (:meth:`forget`); elsewhere it drifts to the least recently used end,
    and each batch of hits drops the entries there that were decoded more than
    :data:`DECODED_MAX_AGE_S` ago, so its text leaves every process that serves recalls.
    """

    def __init__(self, max_entries: int = 10_000):
        # each belief with when it was decoded (monotonic s), set once: a hit allocates nothing
        self._entries: BoundedLru[tuple[Any, ...], tuple[Belief, float]] = BoundedLru(max_entries)
        # lookups of hits that carry a document version (the others are never cached), plain
        # integers read by the metrics publisher (service/telemetry/cache_metrics.py); unlocked:
        # two threads may rarely lose an increment, which a metric can afford and a lock per hit cannot
        self.hits = 0
        self.misses = 0

    max_entries = LruBound[int]("max_entries")

    def __len__(self) -> int:
        return len(self._entries)

    def load(self, row: dict[str, Any]) -> Belief | None:
        key = (row.get("_index"), row.get("_id"), row.get("_seq_no"), row.get("_primary_term"))
        if None in key or self.max_entries <= 0:
            return load_belief(_without_inline_log(row.get("_source")), hit_id=row.get("_id"))
        found = self._entries.get(key)
        if found is not None:
            self.hits += 1
            return found[0]
        self.misses += 1
        belief = load_belief(_without_inline_log(row.get("_source")), hit_id=row.get("_id"))
        if belief is not None:
            self._entries.put(key, (belief, time.monotonic()))
        return belief

    def forget(self, doc_ids: Iterable[str]) -> int:
        """Drop every decoded version of the given documents (an erase: their text leaves this
        process now, not when it ages out); returns how many entries were dropped."""
        gone = set(doc_ids)
        dropped = [key for key, _ in self._entries.items() if key[1] in gone]
        for key in dropped:
            self._entries.pop(key)
        return len(dropped)

    def _drop_aged(self) -> None:
        """Drop least recently used entries decoded more than DECODED_MAX_AGE_S ago (a few at a
        time: called once per batch of hits, it must stay cheap)."""
        deadline = time.monotonic() - DECODED_MAX_AGE_S
        for _ in range(AGED_DROPS_PER_BATCH):
            oldest = self._entries.peek_oldest()
            if oldest is None or oldest[1][1] > deadline:
                return
            self._entries.pop(oldest[0])

    def counts(self) -> CacheCounts:
        """Lookups, evictions and documents held (bounded by count only: no byte estimate)."""
        return CacheCounts({ALL_PARTS: (self.hits, self.misses)}, self._entries.evictions, len(self._entries))

    def load_all(self, rows: Iterable[dict[str, Any]]) -> LoadedBeliefs:
        """:func:`load_beliefs` through the cache."""
        self._drop_aged()
        loaded = LoadedBeliefs()
        for row in rows:
            belief = self.load(row)
            if belief is None:
                loaded.quarantined.append(document_id(row.get("_source") or {}, row.get("_id")))
            else:
                loaded.append(belief)
        return loaded
