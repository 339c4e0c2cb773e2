"""All OpenSearch access for beliefs. The only module that sends belief queries.

Every read takes a :class:`Principal` and gets its tenant/owner/scope filters from
:mod:`service.storage.access`; every write is routed by tenant. Documents are keyed
``<tenant>:<belief id>`` so client-given ids (the paper's ``b-redis-code``) never collide across
tenants.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

import orjson
from opensearchpy import OpenSearch, helpers

from service.domain.belief import Belief
from service.domain.principal import Principal
from service.errors import Conflict, NotFound
from service.interning import SharedValues
from service.lru import BoundedLru
from service.storage import access, calls, cursor, queries
from service.storage.access import ScopeView
from service.storage.calls import Call, Reads
from service.storage.change_logs import REF_FIELD, ChangeLogStore, PendingLog, refused
from service.storage.client import (
    already_exists,
    bulk_item,
    found_item,
    get_routed,
    index_routed,
    item_error,
    routed_id,
    translate_errors,
)
from service.storage.local_analysis import LocalAnalysis
from service.storage.templates import BELIEFS
from service.storage.unreadable import (
    BELIEF_RECORDS,
    DecodedBeliefs,
    LoadedBeliefs,
    document_id,
    load_belief,
    load_beliefs,
)
from service.storage.vocabulary import UNITS_FIELD, VocabularyStore
from service.write_versions import TenantWriteVersions

Refresh = Literal["true", "false", "wait_for"]


log = logging.getLogger(__name__)

doc_id = routed_id  # belief documents are keyed <tenant>:<belief id>
_BULK_CHUNK = 1000


@dataclass(frozen=True)
class ClauseMatch:
    """One reason a belief surfaced: which field clause matched, which whole unit, with what score."""

    clause: str
    score: float | None = None  # per-clause scores need explain=True; names alone are free
    term: str | None = None


@dataclass(frozen=True)
class ScoredBelief:
    belief: Belief
    score: float
    clauses: tuple[ClauseMatch, ...] = ()


@dataclass(frozen=True)
class NearMiss:
    """A belief the principal may see whose names a message matched, but that recall did not
    inject (explain only); :meth:`BeliefStore.near_misses`."""

    belief: Belief
    score: float
    in_session: bool  # inside the session's scopes
    clauses: tuple[ClauseMatch, ...] = ()


# The filter tiers, in tier order: the persona depends on the principal only (its scope is always
# ``user:universal``), the pinned facts and open questions on the session's scope list too.
FILTER_TIERS = ("persona", "pinned", "questions")
PERSONA_TIERS = FILTER_TIERS[:1]
SCOPED_TIERS = FILTER_TIERS[1:]


@dataclass
class RecallHits:
    """Raw tier candidates from one multi-search round trip."""

    persona: list[Belief] = field(default_factory=list)
    pinned: list[Belief] = field(default_factory=list)
    relevant: list[ScoredBelief] = field(default_factory=list)
    questions: list[Belief] = field(default_factory=list)
    # ids of the stored documents skipped (unloadable), in the filter tiers and in the relevant one
    filter_quarantined: list[str] = field(default_factory=list)
    relevant_quarantined: list[str] = field(default_factory=list)
    # the same for each filter tier searched (what a cache entry of some of them keeps)
    skipped_by_tier: dict[str, list[str]] = field(default_factory=dict)

    @property
    def quarantined(self) -> list[str]:
        """Every skipped document, in tier order (the same whether a tier was cached or not)."""
        return [*self.filter_quarantined, *self.relevant_quarantined]

    def filter_tiers(self, tiers: Sequence[str]) -> FilterTiers:
        """The named filter tiers as searched (the others empty), with the documents they skipped,
        in tier order."""
        return FilterTiers(
            tuple(self.persona) if "persona" in tiers else (),
            tuple(self.pinned) if "pinned" in tiers else (),
            tuple(self.questions) if "questions" in tiers else (),
            tuple(skipped for tier in tiers for skipped in self.skipped_by_tier.get(tier, ())),
        )

    def use_filter_tiers(self, persona: FilterTiers, scoped: FilterTiers) -> None:
        """Take the filter tiers from their two entries (the user's persona, the scope list's
        pinned facts and open questions), searched now or cached, in tier order."""
        self.persona = list(persona.persona)
        self.pinned, self.questions = list(scoped.pinned), list(scoped.questions)
        self.filter_quarantined = [*persona.quarantined, *scoped.quarantined]

    def relevant_tier(self) -> RelevantTier:
        return RelevantTier(tuple(self.relevant), tuple(self.relevant_quarantined))


@dataclass(frozen=True)
class FilterTiers:
    """The tiers that only filter (no text): what recall may reuse until the tenant writes."""

    persona: tuple[Belief, ...]
    pinned: tuple[Belief, ...]
    questions: tuple[Belief, ...]
    quarantined: tuple[str, ...]


@dataclass(frozen=True)
class RelevantTier:
    """The relevant tier's hits (searched without ``explain``) and the documents it skipped: what
    recall may reuse for the same message until the tenant writes (the ``boolean`` similarity makes
    them depend on the tenant's own documents only, docs/scoring-independence.md)."""

    hits: tuple[ScoredBelief, ...]
    quarantined: tuple[str, ...]


@dataclass(frozen=True)
class LinkedBeliefs:
    """The beliefs recall's relation hop read by id (live, in the session's scopes), in the order
    asked: what recall may reuse for the same relation hits until the tenant writes."""

    beliefs: tuple[Belief, ...]


CachedTier = FilterTiers | RelevantTier | LinkedBeliefs


@dataclass(frozen=True)
class FilterTierQuery:
    """The filter tiers' searches as a recall sent them (``[index, routing, bodies]``, built by
    the chokepoint for its principal, scopes and budget, as the JSON the memo key digests: ~2 KB,
    where the bodies as dicts are ~18 KB) and that key: what a refresh searches again after the
    tenant writes (service/recall/tier_cache.py), so the next recall of the same caller finds them
    at the new version."""

    key: bytes
    sent: bytes

    def routed_bodies(self) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
        _index, routing, bodies = orjson.loads(self.sent)
        return str(routing), [(str(name), body) for name, body in bodies]


class TierMemo(Protocol):
    """Where :meth:`BeliefStore.recall_candidates` may find and leave the filter tiers and the
    relevant tier (and :meth:`BeliefStore.get_many` the relation hop's beliefs), keyed by a digest
    of the exact queries that compute them (index, routing and bodies), for one tenant write version
    (service/recall/tier_cache.py binds one to the version)."""

    def get(self, key: bytes, part: str) -> CachedTier | None:
        """``part``: what is looked up (:data:`TIER_PARTS`), for the cache's counts."""

    def put(self, key: bytes, tiers: CachedTier, query: FilterTierQuery | None = None) -> None:
        """``query``: the searches that computed ``tiers`` when they are the filter tiers."""


@dataclass(frozen=True)
class WriteResult:
    written: list[str]
    failed: dict[str, str]
    # of ``failed``: writes whose compare-and-set found the belief changed since it was read
    changed_meanwhile: list[str] = field(default_factory=list)


_WEIGHT_RE = re.compile(r"^weight\(([\w.]+):(.+?) in \d+\)")


def _explained_clauses(explanation: dict[str, Any]) -> tuple[ClauseMatch, ...]:
    """Flatten a Lucene explanation into (field, whole unit, score) leaves."""
    out: list[ClauseMatch] = []

    def walk(node: dict[str, Any]) -> None:
        match = _WEIGHT_RE.match(node.get("description", ""))
        if match:
            out.append(ClauseMatch(clause=match.group(1), term=match.group(2), score=float(node["value"])))
            return
        for child in node.get("details", []):
            walk(child)

    walk(explanation)
    return tuple(out)


# The clause names a hit matched, as one shared tuple per distinct set of names. The names are
# the query's own (a handful of field clauses) and a ClauseMatch without a score is immutable, so
# every hit that matched the same clauses can hold the same tuple: the relevant tier's cache then
# keeps no new objects for them, which each API worker's paced full collection would walk once
# (service/process.py; docs/benchmarks.md "Paced collections").
_SHARED_CLAUSES: SharedValues[tuple[str, ...], tuple[ClauseMatch, ...]] = SharedValues(4096)


def _clause_matches(names: tuple[str, ...]) -> tuple[ClauseMatch, ...]:
    return tuple(ClauseMatch(clause=name) for name in names)


def _named_clauses(hit: dict[str, Any]) -> tuple[ClauseMatch, ...]:
    matched = hit.get("matched_queries") or []
    if isinstance(matched, dict):
        return tuple(ClauseMatch(clause=k, score=float(v)) for k, v in sorted(matched.items()))
    return _SHARED_CLAUSES.get(tuple(sorted(matched)), _clause_matches)


def _refusal(belief_id: str, info: dict[str, Any]) -> str:
    """The client's reason for a refused bulk item. OpenSearch's own text names the internal
    document id (``<tenant>:<id>``) and index: it goes to the log, never into a response."""
    if already_exists(info):
        return f"belief {belief_id!r} already exists"
    log.warning("the store refused belief %s: %s", belief_id, info.get("error"))
    return f"the store refused belief {belief_id!r}"


T = TypeVar("T", FilterTiers, RelevantTier, LinkedBeliefs)
# each cacheable part of a recall by the name its lookups are counted under (tenure_cache_lookups_total)
TIER_PARTS: dict[type[CachedTier], str] = {FilterTiers: "filters", RelevantTier: "relevant", LinkedBeliefs: "linked"}


@dataclass(frozen=True)
class _TierLookup(Generic[T]):
    """One cacheable part of a recall (the filter tiers, the relevant tier, the relation hop's read)
    in the memo: its key is a BLAKE2b-256 digest of the queries themselves (index, routing, bodies;
    collision-resistant), so the same key can only mean the same answer at one tenant write
    version, whatever principal, scopes or budget produced them. Made once, for the lookup and the
    store of a miss alike."""

    memo: TierMemo | None
    key: bytes
    cached: T | None
    sent: bytes = b""  # the queries as JSON (what the key digests)

    @classmethod
    def of(cls, memo: TierMemo | None, queries_sent: list[Any], kind: type[T]) -> _TierLookup[T]:
        if memo is None:
            return cls(None, b"", None)
        sent = orjson.dumps(queries_sent)
        key = hashlib.blake2b(sent, digest_size=32).digest()
        found = memo.get(key, TIER_PARTS[kind])
        return cls(memo, key, found if isinstance(found, kind) else None, sent)

    def wanted(self, bodies: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """The bodies still to send: none when the memo held their answer."""
        return [] if self.cached is not None else bodies

    def keep(self, tiers: T) -> None:
        if self.memo is not None:
            self.memo.put(self.key, tiers)

    def kept(self, tiers: FilterTiers) -> FilterTiers:
        """Keep filter tiers just searched, with the searches that computed them (for a refresh
        after the tenant writes); returns them."""
        if self.memo is not None:
            self.memo.put(self.key, tiers, FilterTierQuery(self.key, self.sent))
        return tiers


class BeliefStore:
    def __init__(
        self,
        client: OpenSearch,
        namespace: str,
        versions: TenantWriteVersions | None = None,
        local_analysis: LocalAnalysis | None = None,
    ):
        self.client = client
        self.namespace = namespace
        self.alias = BELIEFS.alias(namespace)
        # recall's hits, validated once per stored document version (service/storage/unreadable.py)
        self.decoded = DecodedBeliefs()
        # Bumped after every write, so per-tenant caches (the recall vocabulary) see it. A store
        # without it (scripts, offline evals) must not be paired with a caching reader.
        self.versions = versions
        # the index mapping and the analysis of names into stored units (service/storage/vocabulary.py);
        # the API's recall queries analysed in process when it has the node's analysis code
        self.vocabulary = VocabularyStore(client, self.alias, local_analysis)
        # the beliefs' change logs, kept out of their documents (service/storage/change_logs.py)
        self.logs = ChangeLogStore(client, namespace)
        # The log ref of each stored version a read-for-update saw, by (tenant, id, _seq_no,
        # _primary_term): a compare-and-set replace of that very version then knows which log it
        # retires without reading the document again ("" for a version without a log document).
        self._refs_seen: BoundedLru[tuple[str, str, int, int], str] = BoundedLru(4096)

    def documents(self, beliefs: Sequence[Belief]) -> list[dict[str, Any]]:
        """The model's document of each belief plus, when the index stores them, the analysed units
        of its names and aliases (one analysis round trip for all of them). The change log is still
        in it: :meth:`_stored_forms` takes it out."""
        units = self.vocabulary.units_of([(b.tenant_id, b.canonical_name, b.aliases) for b in beliefs])
        documents = [b.to_document() for b in beliefs]
        if units is not None:
            for document, held in zip(documents, units, strict=True):
                document[UNITS_FIELD] = held
        return documents

    def _stored_forms(self, beliefs: Sequence[Belief]) -> list[tuple[dict[str, Any], PendingLog | None]]:
        """What a write stores for each belief: its document, naming a fresh change-log ref, and the
        log document to write first (None for an empty log)."""
        documents = self.documents(beliefs)
        return [(document, self.logs.split(document)) for document in documents]

    def written(self, tenant_ids: Iterable[str]) -> None:
        """Record that the tenants' beliefs changed (after the write is visible)."""
        if self.versions is not None:
            self.versions.bump(tenant_ids)

    @contextmanager
    def _bumping(self, tenant_ids: Iterable[str]) -> Iterator[None]:
        """Bump the write versions of the tenants when the block ends, also when it fails part-way
        (some documents may be written): one bump too many costs a rebuild, one too few a stale
        cache."""
        tenants = set(tenant_ids)
        try:
            yield
        finally:
            self.written(tenants)

    # ---------------------------------------------------------------- writes

    def _index_one(
        self,
        belief: Belief,
        *,
        refresh: Refresh,
        on_conflict: str,
        create_only: bool = False,
        version: tuple[int, int] | None = None,
        **options: Any,
    ) -> None:
        """Write one belief: its log document first, then the belief pointing at it, then the log it
        replaced is retired (service/storage/change_logs.py has the protocol). ``version``: the
        ``(_seq_no, _primary_term)`` a compare-and-set expects."""
        ((body, pending),) = self._stored_forms([belief])
        old = None if create_only else self._replaced_ref(belief, version)
        if pending is not None:
            self.logs.write(pending)
        try:
            with self._bumping([belief.tenant_id]):
                index_routed(
                    self.client,
                    index=self.alias,
                    doc_id=doc_id(belief.tenant_id, belief.id),
                    body=body,
                    routing=belief.tenant_id,
                    refresh=refresh,
                    action="store a belief",
                    on_conflict=on_conflict,
                    op_type="create" if create_only else "index",
                    **options,
                )
        except Conflict:
            if not (create_only and self._already_stored(belief, body, pending, refresh)):
                self.logs.retire(belief.tenant_id, [pending.ref] if pending else [])
                raise
        except Exception as exc:
            if pending is not None and refused(exc):  # nothing stored: its log can go now
                self.logs.retire(belief.tenant_id, [pending.ref])
            raise
        if old is not None and (pending is None or old != pending.ref):
            self.logs.retire(belief.tenant_id, [old])

    def _replaced_ref(self, belief: Belief, version: tuple[int, int] | None) -> str | None:
        """The log ref of the stored version a write replaces (None: none): known when a
        read-for-update saw that very version (the compare-and-set makes sure it is the one
        replaced), else read."""
        if version is not None:
            seen = self._refs_seen.get((belief.tenant_id, belief.id, *version))
            if seen is not None:
                return seen or None
        key = (belief.tenant_id, belief.id)
        return self.logs.current_refs([key]).get(key)

    def put(self, belief: Belief, *, refresh: Refresh = "wait_for", create_only: bool = False) -> None:
        """Index one belief (insert or replace). ``create_only`` refuses to overwrite an id, except
        with this very document (see :meth:`_already_stored`)."""
        self._index_one(
            belief, refresh=refresh, on_conflict=f"belief {belief.id!r} already exists", create_only=create_only
        )

    def _already_stored(
        self, belief: Belief, body: dict[str, Any], pending: PendingLog | None, refresh: Refresh
    ) -> bool:
        """Whether a create's 409 met this very document: our own first attempt.

        When the connection to a node breaks mid-request (the node was killed), opensearch-py sends
        the request again to the next node; if the first attempt had already stored the belief, the
        retry's create gets 409 and the client would be told its write conflicts although it was
        stored (cluster drill, docs/fault-drills.md). Only the same write has the same document
        (timestamps and change log included): a later write with the same id still gets its 409.
        The stored document may point at the first attempt's log document, with the same entries:
        this attempt's own log document is then retired."""
        found = self._by_key(belief.tenant_id, belief.id, "read back a belief")
        stored = found.get("_source") if found else None
        if not isinstance(stored, dict) or not self._same_write(stored, body, pending):
            return False
        if pending is not None and stored.get(REF_FIELD) != pending.ref:
            self.logs.retire(belief.tenant_id, [pending.ref])
        if refresh != "false":  # the write promised to be visible to the next search
            with translate_errors("refresh the beliefs index"):
                self.client.indices.refresh(index=self.alias)
        return True

    def _same_write(self, stored: dict[str, Any], body: dict[str, Any], pending: PendingLog | None) -> bool:
        """Whether ``stored`` is the document ``body`` (its units aside: not in ``_source``) with the
        change log of ``pending``, whichever log document holds it."""
        sent = {k: v for k, v in body.items() if k not in (UNITS_FIELD, REF_FIELD)}
        if {k: v for k, v in stored.items() if k != REF_FIELD} != orjson.loads(orjson.dumps(sent)):
            return False
        if pending is None:
            return REF_FIELD not in stored
        ref = stored.get(REF_FIELD)
        if not isinstance(ref, str):
            return False
        held = self.logs.fetch([(pending.tenant_id, pending.belief_id, ref)]).get((pending.tenant_id, ref))
        return bool(held == orjson.loads(orjson.dumps(pending.document["entries"])))

    def put_many(
        self,
        beliefs: Sequence[Belief],
        *,
        refresh: Refresh = "wait_for",
        create_only: bool = False,
        versions: Mapping[str, tuple[int, int]] | None = None,
    ) -> WriteResult:
        """Write many beliefs, one bulk chunk at a time, each chunk as :meth:`_index_one` writes one
        belief: the chunk's change logs first, then its beliefs, then the logs they replaced.
        ``versions``: the ``(_seq_no, _primary_term)`` of a read, by document id
        (``<tenant>:<id>``), for a compare-and-set per belief like :meth:`replace`; one that finds
        its belief changed meanwhile fails, is listed in ``changed_meanwhile`` and its new log is
        retired."""
        result = WriteResult(written=[], failed={})
        with self._bumping(b.tenant_id for b in beliefs), translate_errors("store beliefs"):
            for start in range(0, len(beliefs), _BULK_CHUNK):
                self._put_chunk(beliefs[start : start + _BULK_CHUNK], create_only, result, versions or {})
            if refresh != "false" and beliefs:
                self.client.indices.refresh(index=self.alias)
        return result

    def _put_chunk(
        self,
        chunk: Sequence[Belief],
        create_only: bool,
        result: WriteResult,
        versions: Mapping[str, tuple[int, int]],
    ) -> None:
        forms = self._stored_forms(chunk)
        replaced = {} if create_only else self.logs.current_refs([(b.tenant_id, b.id) for b in chunk])
        logs = [pending for _, pending in forms if pending is not None]
        stored_logs = self.logs.write_many(logs)
        actions: list[dict[str, Any]] = []
        new_log: dict[str, PendingLog] = {}
        for b, (document, pending) in zip(chunk, forms, strict=True):
            if pending is not None and pending.ref not in stored_logs:
                result.failed[b.id] = "its change log could not be stored; retry"
                continue
            if pending is not None:
                new_log[doc_id(b.tenant_id, b.id)] = pending
            action: dict[str, Any] = {
                "_op_type": "create" if create_only else "index",
                "_index": self.alias,
                "_id": doc_id(b.tenant_id, b.id),
                "_routing": b.tenant_id,
                "_source": document,
            }
            if (version := versions.get(doc_id(b.tenant_id, b.id))) is not None:
                action["if_seq_no"], action["if_primary_term"] = version
            actions.append(action)
        retired: dict[str, list[str]] = {}
        refused_logs: dict[tuple[str, str], str] = {}
        for ok, item in helpers.streaming_bulk(
            self.client, actions, chunk_size=_BULK_CHUNK, raise_on_error=False, raise_on_exception=False, max_retries=2
        ):
            info = bulk_item(item)
            key = str(info.get("_id", ""))
            tenant, _, belief_id = key.partition(":")
            pending = new_log.get(key)
            if ok:
                result.written.append(belief_id)
                old = replaced.get((tenant, belief_id))
                if old is not None and (pending is None or old != pending.ref):
                    retired.setdefault(tenant, []).append(old)
            elif key in versions and already_exists(info):  # the compare-and-set's 409
                result.failed[belief_id] = f"belief {belief_id!r} was changed concurrently; retry"
                result.changed_meanwhile.append(belief_id)
                if pending is not None:
                    refused_logs[(tenant, belief_id)] = pending.ref
            else:
                result.failed[belief_id] = _refusal(belief_id, info)
                if pending is not None and isinstance(info.get("status"), int) and 400 <= info["status"] < 500:
                    refused_logs[(tenant, belief_id)] = pending.ref
        # refused: nothing points at these logs, unless a 409 met this very bulk's first attempt
        now = self.logs.current_refs(list(refused_logs))
        for (tenant, belief_id), ref in refused_logs.items():
            if now.get((tenant, belief_id)) != ref:
                retired.setdefault(tenant, []).append(ref)
        for tenant, refs in retired.items():
            self.logs.retire(tenant, refs)

    def replace(self, belief: Belief, *, if_seq_no: int, if_primary_term: int, refresh: Refresh = "wait_for") -> None:
        """Optimistic update: fails with Conflict if someone changed the belief meanwhile."""
        self._index_one(
            belief,
            refresh=refresh,
            on_conflict=f"belief {belief.id!r} was changed concurrently; retry",
            version=(if_seq_no, if_primary_term),
            if_seq_no=if_seq_no,
            if_primary_term=if_primary_term,
        )

    # ----------------------------------------------------------------- reads

    def _search_call(
        self, filters: access.AccessFilters, body: dict[str, Any], action: str, filter_path: str | None = None
    ) -> Call:
        """One search of the caller's beliefs as a request: ``body`` was built from ``filters``,
        which also route it; ``filter_path``: what of the answer is sent."""
        params: dict[str, Any] = {"index": self.alias, "body": body, "routing": filters.routing}
        if filter_path is not None:
            params["filter_path"] = filter_path
        return Call("search", params, action)

    def _search(self, filters: access.AccessFilters, body: dict[str, Any], action: str) -> dict[str, Any]:
        """One search of the caller's beliefs: ``body`` was built from ``filters``, which also route it."""
        with translate_errors(action):
            result: dict[str, Any] = self.client.search(index=self.alias, body=body, routing=filters.routing)
        return result

    def get(
        self, principal: Principal, belief_id: str, *, view: ScopeView | None = None, tenant_wide: bool = False
    ) -> Belief:
        """One belief the principal may see, whatever its lifecycle. Another user's or tenant's
        belief is indistinguishable from a missing one (no existence oracle)."""
        found = self.get_versioned(principal, belief_id, view=view, tenant_wide=tenant_wide)
        return found[0]

    def get_versioned(
        self, principal: Principal, belief_id: str, *, view: ScopeView | None = None, tenant_wide: bool = False
    ) -> tuple[Belief, int, int]:
        filters = access.for_principal(principal, view or ScopeView.everything(), tenant_wide=tenant_wide)
        body = queries.by_ids_body(filters, [belief_id], live_only=False)
        body["seq_no_primary_term"] = True
        hits = self._search(filters, body, "read a belief")["hits"]["hits"]
        if not hits:
            raise NotFound(f"belief {belief_id!r} not found")
        whole = self.with_logs(hits[:1])
        if not whole:  # erased between the search and the read of its log
            raise NotFound(f"belief {belief_id!r} not found")
        hit = whole[0]
        belief = load_belief(hit["_source"], hit_id=hit.get("_id"))
        if belief is None:
            raise BELIEF_RECORDS.unreadable(belief_id)
        seq_no, term = int(hit["_seq_no"]), int(hit["_primary_term"])
        ref = hit["_source"].get(REF_FIELD)
        self._refs_seen.put((belief.tenant_id, belief.id, seq_no, term), ref if isinstance(ref, str) else "")
        return belief, seq_no, term

    def with_logs(self, hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Hits of whole belief documents with their change logs put back (read paths that load
        beliefs to show their history or write them back; service/storage/change_logs.py)."""
        return self.logs.attach(hits, self._reread)

    def merged_into(self, principal: Principal, merged_ids: list[str], *, limit: int) -> list[Belief]:
        """The tenant's beliefs superseded by one of ``merged_ids`` and carrying a compaction note
        (the sources a compaction retired into them), whole with their change logs, at most
        ``limit``; unloadable ones are left out (an erase of one goes through the quarantine)."""
        if not merged_ids:
            return []
        filters = access.for_principal(principal, ScopeView.everything(), tenant_wide=True)
        body = queries.merged_into_body(filters, merged_ids, size=limit)
        hits = self.with_logs(self._search(filters, body, "read the sources of merged beliefs")["hits"]["hits"])
        return [b for b in load_beliefs(hits) if b.compaction_note]

    def _by_key(self, tenant_id: str, belief_id: str, action: str) -> dict[str, Any] | None:
        """One of the tenant's belief documents by key, in real time; None when it is absent."""
        return get_routed(
            self.client, index=self.alias, doc_id=doc_id(tenant_id, belief_id), routing=tenant_id, action=action
        )

    def successor_now(self, tenant_id: str, belief_id: str) -> str | None:
        """The id that supersedes one of the tenant's beliefs, read by key in real time (what a write
        whose answer was lost left, before any refresh); None when it is not superseded or gone."""
        found = self._by_key(tenant_id, belief_id, "read a belief's successor")
        source = found.get("_source") if found else None
        successor = source.get("superseded_by") if isinstance(source, dict) else None
        return successor if isinstance(successor, str) else None

    def _reread(self, hit: dict[str, Any]) -> dict[str, Any] | None:
        """The hit's belief as it is stored now (real time), or None once it is deleted. The hit came
        through the caller's filters, so its own tenant and id address the same document."""
        source = hit.get("_source") or {}
        tenant_id, belief_id = str(source.get("tenant_id")), str(source.get("id"))
        found = self._by_key(tenant_id, belief_id, "read a belief again")
        if found is None or not isinstance(found.get("_source"), dict):
            return None
        return {
            **hit,
            "_source": found["_source"],
            "_seq_no": found.get("_seq_no"),
            "_primary_term": found.get("_primary_term"),
        }

    def get_many(
        self, principal: Principal, ids: Iterable[str], *, view: ScopeView | None = None, live_only: bool = True
    ) -> list[Belief]:
        """The given beliefs the principal may see, in the order asked, read without their change
        logs (recall's relation hop, the proxy's injected texts): never write one back."""
        return calls.run(self.client, self.get_many_reads(principal, ids, view=view, live_only=live_only))

    def get_many_reads(
        self,
        principal: Principal,
        ids: Iterable[str],
        *,
        view: ScopeView | None = None,
        live_only: bool = True,
        memo: TierMemo | None = None,
    ) -> Reads[list[Belief]]:
        """``memo`` (recall's relation hop): the answer is taken from it when it holds the answer to
        this very query, else kept in it."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        filters = access.for_principal(principal, view or ScopeView.everything())
        body = queries.by_ids_body(filters, wanted, live_only=live_only, include_change_log=False)
        linked = _TierLookup.of(memo, [self.alias, filters.routing, body], LinkedBeliefs)
        if linked.cached is not None:
            return list(linked.cached.beliefs)
        call = self._search_call(filters, body, "read beliefs", queries.BY_IDS_FILTER_PATH)
        hits = queries.found_hits((yield call))
        by_id = {b.id: b for b in load_beliefs(hits)}
        found = [by_id[i] for i in wanted if i in by_id]
        linked.keep(LinkedBeliefs(tuple(found)))
        return found

    def recall_candidates(
        self,
        principal: Principal,
        view: ScopeView,
        text: str,
        **limits: Any,
    ) -> RecallHits:
        """:meth:`recall_candidates_reads` run with the synchronous client."""
        return calls.run(self.client, self.recall_candidates_reads(principal, view, text, **limits))

    def recall_candidates_reads(
        self,
        principal: Principal,
        view: ScopeView,
        text: str,
        *,
        max_relevant: int,
        max_pinned: int,
        max_questions: int,
        min_score: float,
        explain: bool = False,
        clauses: list[dict[str, Any]] | None = None,
        memo: TierMemo | None = None,
        cache_relevant: bool = False,
    ) -> Reads[RecallHits]:
        """All four tiers in one ``_msearch`` round trip (the recall hot path). With a ``memo``, a
        tier is taken from it when it holds the result of these very queries: the persona (one
        entry per principal), the pinned facts and open questions (one entry per scope list), and
        with ``cache_relevant`` the relevant tier unless ``explain`` (its hits then carry Lucene's
        explanation); with all of them held nothing is sent. ``cache_relevant``:
        the caller vouches that ``clauses`` are exact terms from the tenant's own vocabulary, so
        the answer depends on the tenant's documents only (the Lucene query's fuzzy expansions
        draw on every tenant of the shard: never cached)."""
        filters = access.for_principal(principal, view)
        persona_filters = access.for_principal(principal, ScopeView(("user:universal",)))
        routing = access.routing(principal)
        persona_bodies: list[tuple[str, dict[str, Any]]] = [("persona", queries.persona_body(persona_filters))]
        scoped_bodies: list[tuple[str, dict[str, Any]]] = [
            ("pinned", queries.pinned_body(access.for_pinned(principal, view), size=max_pinned)),
            ("questions", queries.open_questions_body(filters, size=max_questions)),
        ]
        relevant_bodies: list[tuple[str, dict[str, Any]]] = []
        if text and max_relevant > 0 and (clauses is None or clauses):  # [] : nothing can match
            body = queries.relevant_body(
                filters, text, size=max_relevant, min_score=min_score, explain=explain, clauses=clauses
            )
            relevant_bodies.append(("relevant", body))
        # Two entries: a user's persona is kept once for all their scope lists (a new project
        # searches only its pinned facts and open questions), the scoped tiers per scope list.
        persona_tier = _TierLookup.of(memo, [self.alias, routing, persona_bodies], FilterTiers)
        scoped_tiers = _TierLookup.of(memo, [self.alias, routing, scoped_bodies], FilterTiers)
        relevant_tier = _TierLookup.of(
            memo if cache_relevant and relevant_bodies and clauses and not explain else None,
            [self.alias, routing, relevant_bodies],
            RelevantTier,
        )
        bodies = [
            *persona_tier.wanted(persona_bodies),
            *scoped_tiers.wanted(scoped_bodies),
            *relevant_tier.wanted(relevant_bodies),
        ]
        hits = yield from self._run_tiers(bodies, routing, explain)
        hits.use_filter_tiers(
            persona_tier.cached or persona_tier.kept(hits.filter_tiers(PERSONA_TIERS)),
            scoped_tiers.cached or scoped_tiers.kept(hits.filter_tiers(SCOPED_TIERS)),
        )
        if relevant_tier.cached is not None:
            hits.relevant = list(relevant_tier.cached.hits)
            hits.relevant_quarantined = list(relevant_tier.cached.quarantined)
        else:
            relevant_tier.keep(hits.relevant_tier())
        return hits

    def filter_tiers_reads(self, tier_queries: Sequence[FilterTierQuery]) -> Reads[list[FilterTiers]]:
        """The filter tiers of each query searched again, exactly as the recall that sent them did,
        all in one request (what :func:`service.recall.tier_cache.refresh_filter_tiers` keeps for
        the next recall)."""
        routed = [query.routed_bodies() for query in tier_queries]
        searches = [(routing, body) for routing, bodies in routed for _, body in bodies]
        results = iter((yield from self._search_tiers(searches)))
        out: list[FilterTiers] = []
        for _, bodies in routed:
            hits = RecallHits()
            for tier, _ in bodies:
                self._read_tier(hits, tier, next(results), explain=False)
            out.append(hits.filter_tiers([tier for tier, _ in bodies]))
        return out

    def _run_tiers(self, bodies: list[tuple[str, dict[str, Any]]], routing: str, explain: bool) -> Reads[RecallHits]:
        hits = RecallHits()
        results = yield from self._search_tiers([(routing, body) for _, body in bodies])
        for (tier, _), result in zip(bodies, results, strict=True):
            self._read_tier(hits, tier, result, explain)
        return hits

    def _read_tier(self, hits: RecallHits, tier: str, result: dict[str, Any], explain: bool) -> None:
        """One tier's answer (an ``_msearch`` item) into ``hits``."""
        if "error" in result:
            raise item_error(result.get("status"), result["error"], f"run the recall query for tier {tier}")
        rows = queries.found_hits(result)
        if tier == "relevant":
            for row in rows:
                belief = self.decoded.load(row)
                if belief is None:
                    hits.relevant_quarantined.append(document_id(row.get("_source") or {}, row.get("_id")))
                else:
                    hits.relevant.append(self._scored(row, belief, explain))
        else:
            loaded = self.decoded.load_all(rows)
            hits.skipped_by_tier[tier] = list(loaded.quarantined)
            setattr(hits, tier, list(loaded))

    def _search_tiers(self, searches: list[tuple[str, dict[str, Any]]]) -> Reads[list[dict[str, Any]]]:
        """The searches (routing, body) in one request; their answers in order, each as an
        ``_msearch`` item."""
        if not searches:
            return []
        response = yield self._tiers_call(searches)
        return [response] if len(searches) == 1 else list(response["responses"])

    def _tiers_call(self, searches: list[tuple[str, dict[str, Any]]]) -> Call:
        """The tiers' searches (routing, body) in one request. One tier alone (the relevant tier of
        most session recalls: the filter tiers come from the tier cache) is a plain routed
        ``_search``, whose answer is read as a one-item ``_msearch`` answer: the node skips the
        multi-search's coordination, 0.06-0.21 ms of its CPU per search at 1M beliefs in three of
        four interleaved runs (``benchmarks/relevant_query_cost.py``, docs/benchmarks.md). A failure
        is mapped as the failed item's would be (a 400 the caller's, anything else the store's).
        Answers come whole: an exclusion ``filter_path`` (``-took,-_shards,...``) saved ~15 % of the
        bytes but cost the node 0.07-0.14 ms per recall at 1M beliefs, the API's CPU unchanged
        (docs/benchmarks.md, issue 16: "Tier answers unfiltered")."""
        if len(searches) == 1:
            routing, body = searches[0]
            params = {"index": self.alias, "routing": routing, "body": body}
            return Call("search", params, "recall beliefs", as_msearch_item=True)
        lines: list[dict[str, Any]] = []
        for routing, body in searches:
            lines.append({"index": self.alias, "routing": routing})
            lines.append(body)
        return Call("msearch", {"body": lines}, "recall beliefs")

    def near_misses(self, principal: Principal, view: ScopeView, text: str, **options: Any) -> list[NearMiss]:
        """:meth:`near_misses_reads` run with the synchronous client."""
        return calls.run(self.client, self.near_misses_reads(principal, view, text, **options))

    def near_misses_reads(
        self,
        principal: Principal,
        view: ScopeView,
        text: str,
        *,
        exclude_ids: list[str],
        size: int = 20,
        clauses: list[dict[str, Any]] | None = None,
    ) -> Reads[list[NearMiss]]:
        """Explain only: beliefs ``principal`` may see (any scope of theirs, any lifecycle) that
        the relevant tier's clauses match, best first, without ``exclude_ids`` (what was
        injected). Never anything the principal could not read by id: the filters are the
        chokepoint's, for this principal."""
        filters = access.for_principal(principal, ScopeView.everything())
        body = queries.near_miss_body(
            filters,
            access.visibility_filter(principal, view),
            text,
            size=size,
            exclude_ids=exclude_ids,
            clauses=clauses,
        )
        out: list[NearMiss] = []
        found = yield self._search_call(filters, body, "explain recall")
        for row in found["hits"]["hits"]:
            belief = load_belief(row.get("_source"), hit_id=row.get("_id"))
            if belief is None:
                continue  # quarantined: the recall itself counts those
            named = _named_clauses(row)
            matched = tuple(c for c in named if c.clause != queries.IN_SESSION)
            in_session = len(matched) < len(named)
            out.append(NearMiss(belief, float(row.get("_score") or row["sort"][0]), in_session, matched))
        return out

    @staticmethod
    def _scored(row: dict[str, Any], belief: Belief, explain: bool) -> ScoredBelief:
        clauses = _explained_clauses(row["_explanation"]) if explain and "_explanation" in row else _named_clauses(row)
        score = row.get("_score")
        if score is None:
            score = row["sort"][0]
        return ScoredBelief(belief=belief, score=float(score), clauses=clauses)

    def refresh(self) -> None:
        with translate_errors("refresh"):
            self.client.indices.refresh(index=self.alias)


@dataclass(frozen=True)
class ListFilter:
    """Narrowing for list/export (never access: that comes from the principal)."""

    types: tuple[str, ...] = ()
    lifecycle: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    pinned: bool | None = None
    text: str | None = None
    owners: tuple[str, ...] = ()

    def clauses(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.owners:
            out.append(access.owner_narrowing(self.owners))
        if self.types:
            out.append({"terms": {"type": list(self.types)}})
        if self.lifecycle:
            out.append({"terms": {"lifecycle": list(self.lifecycle)}})
        if self.scopes:
            out.append(access.scope_narrowing(self.scopes))
        if self.pinned is not None:
            out.append({"term": {"pinned": self.pinned}})
        return out


def _page(
    store: BeliefStore,
    filters: access.AccessFilters,
    narrow: ListFilter,
    size: int,
    after: str | None,
    include_change_log: bool,
) -> tuple[LoadedBeliefs, str | None]:
    search_after = cursor.decode(after, arity=2, types=(int, str))
    body = queries.list_body(
        filters,
        narrow.clauses(),
        text=narrow.text,
        size=size,
        search_after=search_after,
        include_change_log=include_change_log,
    )
    hits = store._search(filters, body, "list beliefs")["hits"]["hits"]
    whole = store.with_logs(hits) if include_change_log else hits
    # The cursor follows the last hit, readable or not: a quarantined document never stops paging.
    return load_beliefs(whole), (cursor.encode(hits[-1]["sort"]) if len(hits) == size else None)


def list_page(
    store: BeliefStore,
    principal: Principal,
    narrow: ListFilter,
    *,
    size: int,
    after: str | None,
    view: ScopeView | None = None,
    tenant_wide: bool = False,
    include_change_log: bool = False,
) -> tuple[LoadedBeliefs, str | None]:
    """One page of the beliefs ``principal`` may see (or, for an admin with ``tenant_wide``, the
    whole tenant's), with the cursor of the next page (None at the end)."""
    view = view or ScopeView.everything()
    filters = access.for_principal(principal, view, tenant_wide=tenant_wide)
    return _page(store, filters, narrow, size, after, include_change_log)


FACETS = ("type", "lifecycle", "scope")


def facet_counts(
    store: BeliefStore, principal: Principal, *, tenant_wide: bool = False, size: int = 12
) -> dict[str, list[tuple[str, int]]]:
    """How many beliefs of each type, lifecycle and scope the principal may see (or, for an admin
    with ``tenant_wide``, the tenant holds): the console's overview figures. One aggregation
    request, no documents returned."""
    filters = access.for_principal(principal, ScopeView.everything(), tenant_wide=tenant_wide)
    body = {
        "size": 0,
        "track_total_hits": True,
        "query": filters.query(),
        "aggs": {facet: {"terms": {"field": facet, "size": size}} for facet in FACETS},
    }
    result = store._search(filters, body, "count beliefs")
    counts = {
        facet: [(str(b["key"]), int(b["doc_count"])) for b in result["aggregations"][facet]["buckets"]]
        for facet in FACETS
    }
    counts["total"] = [("all", int(result["hits"]["total"]["value"]))]
    return counts


def raw_tenant_page(
    store: BeliefStore, principal: Principal, *, size: int, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the admin's whole tenant as stored sources, unparsed (the quarantine scan), in
    list order, with the cursor of the next page. Each source has its change log put back, as a
    load of it would: a belief whose log document is missing is listed like any other that cannot
    load (a belief deleted since the search is left out)."""
    filters = access.for_admin(principal)
    body = queries.list_body(
        filters,
        [],
        text=None,
        size=size,
        search_after=cursor.decode(after, arity=2, types=(int, str)),
        include_change_log=True,
    )
    hits = store._search(filters, body, "scan the tenant's beliefs")["hits"]["hits"]
    next_cursor = cursor.encode(hits[-1]["sort"]) if len(hits) == size else None
    whole = store.with_logs([h for h in hits if isinstance(h.get("_source"), dict)])
    return [h["_source"] for h in whole], next_cursor


def raw_source(store: BeliefStore, principal: Principal, belief_id: str) -> dict[str, Any] | None:
    """The stored source of one of the tenant's beliefs by key, unparsed (None if absent)."""
    found = get_routed(
        store.client,
        index=store.alias,
        doc_id=doc_id(principal.tenant_id, belief_id),
        routing=access.routing(principal),
        action="read a stored belief",
    )
    if found is None or not isinstance(found.get("_source"), dict):
        return None
    whole = store.with_logs([found])  # its log too: what a load of it reads (and its texts to erase)
    return whole[0]["_source"] if whole else None


def delete_ids(store: BeliefStore, principal: Principal, belief_ids: list[str]) -> list[str]:
    """Hard-delete the given beliefs of the principal's tenant (admin erase), and every change-log
    document of theirs; returns the beliefs removed. The beliefs are addressed by ``<tenant>:<id>``
    from the principal, so another tenant's are out of reach by construction."""
    removed: list[str] = []
    with store._bumping([principal.tenant_id]):
        for belief_id in belief_ids:
            try:
                with translate_errors("erase beliefs", on_missing="already gone"):
                    store.client.delete(
                        index=store.alias,
                        id=doc_id(principal.tenant_id, belief_id),
                        routing=access.routing(principal),
                        refresh="wait_for",
                    )
                removed.append(belief_id)
            except NotFound:
                continue
    store.logs.delete_of_beliefs(principal, belief_ids)
    store.decoded.forget(doc_id(principal.tenant_id, belief_id) for belief_id in belief_ids)
    return removed


@dataclass
class MovedLogs:
    """What :func:`move_inline_logs` did."""

    scanned: int = 0
    moved: int = 0
    changed_meanwhile: int = 0  # written by someone else first: that write moved the log out
    unreadable: list[str] = field(default_factory=list)  # quarantined documents, left as they are
    failed: list[str] = field(default_factory=list)  # not written (the store refused): run it again


def move_inline_logs(store: BeliefStore, *, tenant_id: str | None = None, page: int = 500) -> MovedLogs:
    """Move the change logs still inside belief documents (written before the logs had their own
    index) into log documents, each belief rewritten with a compare-and-set exactly like any other
    write (log document first), a page at a time (one ``mget``, then :meth:`BeliefStore.put_many`).
    Idempotent and safe beside live traffic: a belief written meanwhile is skipped (that write moved
    its log). Recall reads such documents correctly either way; moved, its hits no longer carry the
    log (docs/operations.md, "Change logs"). ``tenant_id``: that tenant's beliefs only."""
    scan = access.maintenance_scan("move inline change logs", tenant_id)
    done = MovedLogs()
    after: list[Any] | None = None
    while True:
        body: dict[str, Any] = {
            "size": page,
            "track_total_hits": False,
            "_source": ["tenant_id", "id", "change_log"],
            "query": scan.query(),
            "sort": [{"tenant_id": "asc"}, {"id": "asc"}],
        }
        if after is not None:
            body["search_after"] = after
        with translate_errors("scan beliefs for inline change logs"):
            hits = store.client.search(index=store.alias, body=body)["hits"]["hits"]
        done.scanned += len(hits)
        inline = [
            (str(source.get("tenant_id")), str(source.get("id")))
            for source in (hit.get("_source") or {} for hit in hits)
            if source.get("change_log")
        ]
        if inline:
            _move_page(store, inline, done)
        if len(hits) < page:
            return done
        after = hits[-1]["sort"]


def _move_page(store: BeliefStore, keys: list[tuple[str, str]], done: MovedLogs) -> None:
    """The beliefs ``(tenant, id)`` read again in real time, each with the version its write
    expects, and written back with their logs moved out."""
    wanted = [{"_id": doc_id(tenant, belief_id), "routing": tenant} for tenant, belief_id in keys]
    with translate_errors("read beliefs to move their change logs"):
        found = store.client.mget(index=store.alias, body={"docs": wanted}).get("docs", [])
    beliefs: list[Belief] = []
    versions: dict[str, tuple[int, int]] = {}
    for (tenant, belief_id), doc in zip(keys, found, strict=True):
        source = doc.get("_source") or {}
        if not found_item(doc, "read beliefs to move their change logs") or not source.get("change_log"):
            done.changed_meanwhile += 1  # deleted, or rewritten (log moved) since the scan
            continue
        belief = load_belief(source, hit_id=doc.get("_id"))
        if belief is None:
            done.unreadable.append(belief_id)
            continue
        beliefs.append(belief)
        versions[doc_id(tenant, belief_id)] = (int(doc["_seq_no"]), int(doc["_primary_term"]))
    result = store.put_many(beliefs, refresh="false", versions=versions)
    done.moved += len(result.written)
    done.changed_meanwhile += len(result.changed_meanwhile)
    changed = set(result.changed_meanwhile)
    done.failed += [belief_id for belief_id in result.failed if belief_id not in changed]
