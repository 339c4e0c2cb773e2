"""OpenSearch reads behind recall by vocabulary (:mod:`service.recall.vocabulary`), and the
analysed units every belief write stores for it.

OpenSearch's analyzers stay the one definition of analysis: a tenant's vocabulary is the set of
terms OpenSearch's own index analysis produced for its names and aliases, and a query is split by
the same search analyzers the Lucene query uses (term vectors of an artificial document with
per-field analyzers, one round trip for every clause). Nothing here re-implements a tokenizer or
a filter. A recall query's analysis may run in the API process instead of on the node, by the
node's own analysis code (``service/storage/local_analysis.py``), only once that code was checked
against the node's answers for the index.

**Units at write time** (beliefs template v5): every belief write first asks OpenSearch for the
index analysis of its names and aliases (one ``_mtermvectors`` round trip of artificial documents
per write or bulk batch, each searched field's own index analyzer) and stores the result in the
document's ``vocabulary_units`` keyword field (doc values only, excluded from ``_source``), one
value ``<group>\u001f<term>`` per term. A *group* is one (source field, index analyzer) pair,
named by its shortest field (``canonical_name``, ``aliases.cjk``, ...): sub-fields that share an
index analyzer hold the same terms (``canonical_name`` and ``canonical_name.phrase``), so they are
stored once. A tenant's vocabulary is then one routed search reading that field's doc values of
each of its documents (a large tenant: a ``terms`` aggregation over it, ``execution_hint: map``,
no global ordinals over the shared shard), no re-analysis. Documents
written before the field existed (or by other means) have no units and are found by the same
request (a ``missing`` aggregation); their terms are read the old way (term vectors, i.e.
analysed again) so they still answer correctly.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from opensearchpy import OpenSearch, helpers

from service.domain.principal import Principal
from service.storage import access, calls
from service.storage.calls import Call, Reads
from service.storage.client import bulk_item, item_error
from service.storage.local_analysis import PROBE_TEXTS, IndexAnalysis, LocalAnalysis, Positions, Verdict, grouped
from service.storage.queries import WORD_ANALYZER
from service.telemetry import metrics

log = logging.getLogger(__name__)
_ANALYSED_IN_PROCESS = metrics.QUERY_ANALYSIS.labels(where="process")
_ANALYSED_BY_NODE = metrics.QUERY_ANALYSIS.labels(where="node")


# What the query analysis does not read of an ``_mtermvectors`` answer (exclusions only, like the
# recall ``_msearch``'s): each item's index, version and timing, and every term's frequency (the
# positions say it). ``found`` stays, so no item is ever emptied and none drops out of ``docs``
# (an item whose text analyses to nothing is ``{"found": true}``). ~10 % of a long message's answer.
ANALYSIS_FILTER_PATH = "-docs._index,-docs._id,-docs._version,-docs.took,-docs.term_vectors.*.terms.*.term_freq"

# How many documents one term-vector request reads while a vocabulary is built.
_TERM_VECTOR_BATCH = 500
_ID_PAGE = 2000

UNITS_FIELD = "vocabulary_units"
UNIT_SEPARATOR = "\u001f"
# Stored with every document's units, so a document whose names analyse to nothing still counts
# as one that has them (no group name is empty).
UNITS_MARKER = f"{UNIT_SEPARATOR}v1"
# The names and aliases of a belief are analysed from these source fields.
SOURCE_FIELDS = ("canonical_name", "aliases")
# Distinct units one aggregation page returns (below the default search.max_buckets, 65,535); a
# tenant with more is read in partitions.
_UNIT_PAGE = 60_000
# Documents per page and bulk request when a reindex stores the units of a whole generation.
_BACKFILL_PAGE = 500
# What a vocabulary read needs of the aggregation's response (``filter_path``): the unit keys, not
# each bucket's count, and the page overflow; less JSON to send and parse.
_UNITS_RESPONSE = "aggregations.units.buckets.key,aggregations.units.sum_other_doc_count"
# A tenant with at most this many documents has its units read from each document's doc values
# in one page (no aggregation: 4-6x less OpenSearch time at 1,000 documents, measured on the 1M
# corpus); a larger one by the terms aggregation above.
DOC_UNITS_PAGE = 4_000
_DOC_UNITS_RESPONSE = ",".join(["hits.total.value", f"hits.hits.fields.{UNITS_FIELD}", "aggregations.legacy.doc_count"])
# The mapping is read again after this long, so a process notices an alias moved by a reindex.
_MAPPING_TTL_S = 60.0


@dataclass(frozen=True)
class AnalysisRequest:
    """One artificial document (source field -> text) and the fields to analyse it for, each with
    the analyzer to use (a field's search analyzer, or the analyzer a clause names)."""

    doc: Mapping[str, str]
    analyzers: Mapping[str, str]


@dataclass
class TenantTerms:
    """A tenant's indexed terms per searched field (all of them, and per document), and which
    documents asked for by id no longer exist."""

    fields: dict[str, set[str]] = field(default_factory=dict)
    documents: int = 0
    by_document: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class NameMapping:
    """What the vocabulary needs of the index mapping: each text field's search and index
    analyzer, and whether the index stores units (beliefs template v5 and later)."""

    search_analyzers: dict[str, str]
    index_analyzers: dict[str, str]
    has_units: bool
    indices: tuple[str, ...] = ()  # the concrete indices behind the alias when it was read

    @functools.cached_property
    def fingerprint(self) -> bytes:
        """A digest of the query side of analysis: the concrete indices (whose settings define the
        analyzers; a reindex or template change means a new index) and every field's search
        analyzer. An analysis cached under one fingerprint is never used under another."""
        held = orjson.dumps([self.indices, sorted(self.search_analyzers.items())])
        return hashlib.blake2b(held, digest_size=32).digest()

    def group_of(self, field_name: str) -> str | None:
        """The unit group that holds ``field_name``'s terms: the shortest field of the same source
        field with the same index analyzer (None: not an analysed name field)."""
        source = field_name.split(".", 1)[0]
        analyzer = self.index_analyzers.get(field_name)
        if source not in SOURCE_FIELDS or analyzer is None:
            return None
        same = [f for f, a in self.index_analyzers.items() if a == analyzer and f.split(".", 1)[0] == source]
        return min(same, key=lambda f: (len(f), f))

    def groups(self, fields: Iterable[str]) -> dict[str, list[str]]:
        """group -> the given fields it holds (fields without a group are left out)."""
        out: dict[str, list[str]] = {}
        for name in fields:
            group = self.group_of(name)
            if group is not None:
                out.setdefault(group, []).append(name)
        return out

    def all_groups(self) -> list[str]:
        """Every unit group of the mapping (what a write stores)."""
        return sorted(self.groups(self.index_analyzers))


@dataclass
class TenantUnits:
    """A tenant's vocabulary as read: per unit group its terms; ``documents`` counted, of which
    ``legacy`` had no stored units (their terms were read from term vectors)."""

    groups: dict[str, set[str]] = field(default_factory=dict)
    documents: int = 0
    legacy: int = 0


class VocabularyStore:
    def __init__(self, client: OpenSearch, alias: str, local: LocalAnalysis | None = None):
        self.client = client
        self.alias = alias
        self._mapping_lock = threading.Lock()
        self._mapping: NameMapping | None = None
        self._mapping_read_at = 0.0
        # the query analysis in this process (the API's), and for which mapping read it was chosen
        self.local = local
        self._local_for: tuple[NameMapping, IndexAnalysis | None] | None = None

    # ------------------------------------------------------------------ the mapping

    def search_analyzers(self) -> dict[str, str]:
        """Every text field's search analyzer as the index mapping defines it (``name`` and
        ``name.sub``): the query side of each clause is analysed by exactly these."""
        return calls.run(self.client, self.search_analyzers_reads())

    def search_analyzers_reads(self) -> Reads[dict[str, str]]:
        mapping = yield from self.mapping_reads()
        return mapping.search_analyzers

    def mapping(self) -> NameMapping:
        return calls.run(self.client, self.mapping_reads())

    def mapping_reads(self) -> Reads[NameMapping]:
        """The mapping, read once a minute at most (a reindex moves the alias to an index whose
        mapping may differ: stores units where the old one did not)."""
        mapping = self._mapping
        if mapping is None or time.monotonic() - self._mapping_read_at > _MAPPING_TTL_S:
            mappings = yield Call("indices.get_mapping", {"index": self.alias}, "read the beliefs mapping")
            # Behind the alias there is one index, or two during a reindex: the write index is the
            # newest generation (the last name), and only if every index stores units do reads rely
            # on them (an older one's documents are then found by the missing aggregation anyway).
            ordered = [mappings[name]["mappings"] for name in sorted(mappings)]
            properties = ordered[-1]["properties"]
            mapping = NameMapping(
                dict(_analyzers(properties, search=True)),
                dict(_analyzers(properties, search=False)),
                has_units=UNITS_FIELD in properties,
                indices=tuple(sorted(mappings)),
            )
            with self._mapping_lock:
                self._mapping = mapping
                self._mapping_read_at = time.monotonic()
        return mapping

    # ----------------------------------------------------------- units at write time

    def units_of(self, names: Sequence[tuple[str, str, Sequence[str]]]) -> list[list[str]] | None:
        """The units to store with each belief (routing, canonical name, aliases), from one
        analysis round trip; None when the index does not store units (an older template)."""
        return calls.run(self.client, self.units_reads(names))

    def units_reads(self, names: Sequence[tuple[str, str, Sequence[str]]]) -> Reads[list[list[str]] | None]:
        mapping = yield from self.mapping_reads()
        if not mapping.has_units:
            return None
        groups = mapping.all_groups()
        if not names:
            return []
        docs = [
            {
                "doc": {"canonical_name": canonical, "aliases": list(aliases)},
                "fields": groups,
                "positions": False,
                "offsets": False,
                "payloads": False,
                "term_statistics": False,
                "field_statistics": False,
                "routing": routing_key,
            }
            for routing_key, canonical, aliases in names
        ]
        response = yield Call("mtermvectors", {"index": self.alias, "body": {"docs": docs}}, "analyse belief names")
        out: list[list[str]] = []
        for doc in response["docs"]:
            if "error" in doc:
                raise item_error(doc.get("status"), doc["error"], "analyse belief names")
            units = [UNITS_MARKER]
            for group, vectors in sorted((doc.get("term_vectors") or {}).items()):
                units += [f"{group}{UNIT_SEPARATOR}{term}" for term in sorted(vectors.get("terms", {}))]
            out.append(units)
        return out

    # ------------------------------------------------------- a tenant's vocabulary

    def tenant_units(self, principal: Principal, *, doc_page: int = DOC_UNITS_PAGE) -> Reads[TenantUnits]:
        """The principal's tenant's vocabulary (any owner, scope or lifecycle: see
        :func:`access.for_vocabulary`): one routed search reading every document's stored units
        from doc values (no stored field, no ``_source``), or, for a tenant with more than
        ``doc_page`` documents, a terms aggregation over them; documents without units (written
        before the field existed) read from term vectors."""
        mapping = yield from self.mapping_reads()
        filters = access.for_vocabulary(principal)
        body: dict[str, Any] = {
            "size": doc_page,
            "track_total_hits": True,
            "query": filters.query(),
            "sort": ["_doc"],
            "_source": False,
            "stored_fields": "_none_",  # no stored-field block decompressed per hit
            "docvalue_fields": [UNITS_FIELD],
            "aggs": {"legacy": {"missing": {"field": UNITS_FIELD}}},
        }
        params = {"index": self.alias, "body": body, "routing": filters.routing, "request_cache": False}
        found = yield Call("search", {**params, "filter_path": _DOC_UNITS_RESPONSE}, "read the tenant's vocabulary")
        read = TenantUnits(documents=int(found["hits"]["total"]["value"]))
        read.legacy = int(((found.get("aggregations") or {}).get("legacy") or {}).get("doc_count") or 0)
        if read.documents <= doc_page:  # every document is in this one answer
            per_document = ((hit.get("fields") or {}).get(UNITS_FIELD) or () for hit in found["hits"].get("hits") or ())
            _add_units(read.groups, set().union(*per_document))  # each unit once (documents share many)
        else:
            yield from self._aggregated_units(filters, read)
        if read.legacy:
            yield from self._add_legacy(principal, mapping, read)
        return read

    def _aggregated_units(self, filters: access.AccessFilters, read: TenantUnits) -> Reads[None]:
        """A large tenant's units: one routed terms aggregation (``execution_hint: map``: no global
        ordinals over the shared shard), in partitions when they overflow one page."""
        partitions = 1
        partition = 0
        while partition < partitions:
            terms: dict[str, Any] = {"field": UNITS_FIELD, "size": _UNIT_PAGE, "execution_hint": "map"}
            if partitions > 1:
                terms["include"] = {"partition": partition, "num_partitions": partitions}
            body: dict[str, Any] = {
                "size": 0,
                "track_total_hits": False,
                "query": filters.query(),
                "aggs": {"units": {"terms": terms}},
            }
            found = yield Call(
                "search",
                {
                    "index": self.alias,
                    "body": body,
                    "routing": filters.routing,
                    "request_cache": False,
                    "filter_path": _UNITS_RESPONSE,
                },
                "read the tenant's vocabulary",
            )
            units = (found.get("aggregations") or {}).get("units") or {}
            buckets = units.get("buckets") or ()
            if partitions == 1 and int(units.get("sum_other_doc_count") or 0) > 0:
                # more distinct units than one page: read them again in partitions of a page each
                distinct = len(buckets) + int(units["sum_other_doc_count"])
                partitions = distinct // _UNIT_PAGE + 2
                read.groups = {}
                continue
            _add_units(read.groups, (bucket["key"] for bucket in buckets))
            partition += 1

    def _add_legacy(self, principal: Principal, mapping: NameMapping, read: TenantUnits) -> Reads[None]:
        """Documents of the tenant without stored units: their terms from term vectors (analysed
        again by OpenSearch), only for one field per group."""
        no_units = {"bool": {"must_not": [{"exists": {"field": UNITS_FIELD}}]}}
        doc_ids = yield from self._tenant_doc_ids(principal, no_units)
        groups = mapping.all_groups()
        terms = yield from self.document_terms(principal, doc_ids, groups)
        for group in groups:
            read.groups.setdefault(group, set()).update(terms.fields.get(group, ()))

    # ------------------------------------------------------------ a tenant's terms

    def tenant_terms(self, principal: Principal, fields: Sequence[str]) -> Reads[TenantTerms]:
        """The terms the index holds for ``fields`` over every document of the principal's tenant,
        from term vectors (any owner, scope or lifecycle: see :func:`access.for_vocabulary`)."""
        doc_ids = yield from self._tenant_doc_ids(principal)
        return (yield from self.document_terms(principal, doc_ids, fields))

    def document_terms(self, principal: Principal, doc_ids: Sequence[str], fields: Sequence[str]) -> Reads[TenantTerms]:
        """The terms of the given documents of the principal's tenant (routed to its shard, real
        time); ids that are not there are listed in ``missing``."""
        terms = TenantTerms(fields={f: set() for f in fields})
        for start in range(0, len(doc_ids), _TERM_VECTOR_BATCH):
            yield from self._add_term_vectors(principal, list(doc_ids[start : start + _TERM_VECTOR_BATCH]), terms)
        return terms

    def _tenant_doc_ids(self, principal: Principal, *narrowing: dict[str, Any]) -> Reads[list[str]]:
        search_after: list[Any] | None = None
        filters = access.for_vocabulary(principal)
        ids: list[str] = []
        while True:
            body: dict[str, Any] = {
                "size": _ID_PAGE,
                "track_total_hits": False,
                "_source": False,
                "query": filters.query(*narrowing),
                "sort": [{"id": "asc"}],
            }
            if search_after is not None:
                body["search_after"] = search_after
            found = yield Call(
                "search",
                {"index": self.alias, "body": body, "routing": filters.routing},
                "list the tenant's beliefs for its vocabulary",
            )
            hits = found["hits"]["hits"]
            ids += [str(hit["_id"]) for hit in hits]
            if len(hits) < _ID_PAGE:
                return ids
            search_after = hits[-1]["sort"]

    def _add_term_vectors(self, principal: Principal, doc_ids: list[str], terms: TenantTerms) -> Reads[None]:
        response = yield Call(
            "mtermvectors",
            {
                "index": self.alias,
                "body": {"ids": doc_ids},
                "routing": access.routing(principal),
                "fields": ",".join(terms.fields),
                "positions": False,
                "offsets": False,
                "payloads": False,
                "term_statistics": False,
                "field_statistics": False,
            },
            "read the tenant's vocabulary",
        )
        for doc in response["docs"]:
            if "error" in doc:
                raise item_error(doc.get("status"), doc["error"], "read the tenant's vocabulary")
            if not doc.get("found"):
                terms.missing.add(str(doc.get("_id")))  # deleted (after the listing, or erased)
                continue
            terms.documents += 1
            mine: dict[str, frozenset[str]] = {}
            for name, vectors in (doc.get("term_vectors") or {}).items():
                if name in terms.fields:
                    mine[name] = frozenset(vectors.get("terms", {}))
                    terms.fields[name].update(mine[name])
            terms.by_document[str(doc["_id"])] = mine

    # --------------------------------------------------------------- query analysis

    def analyze(self, principal: Principal, requests: Sequence[AnalysisRequest]) -> Reads[list[dict[str, Positions]]]:
        """Each request's tokens per field, grouped by position: in this process when its analysis
        of the index was checked against the node (no request), else in one round trip (a request
        with no field to analyse answers ``{}`` without being sent)."""
        sent = [r for r in requests if r.analyzers]
        if not sent:
            return [{} for _ in requests]
        local = yield from self.local_analysis_reads()
        if local is not None and all(IndexAnalysis.accepts(r.doc) for r in sent):
            try:
                answered = [local.analyze(r.doc, r.analyzers) if r.analyzers else {} for r in requests]
            except Exception as exc:  # the JVM failed: the node answers, as it would without it
                log.warning("the in-process query analysis failed (%s); the node analyses this query", exc)
            else:
                _ANALYSED_IN_PROCESS.inc()
                return answered
        _ANALYSED_BY_NODE.inc()
        answers = iter((yield from self.node_analyze(access.routing(principal), sent)))
        return [next(answers) if r.analyzers else {} for r in requests]

    def node_analyze(self, routing: str, requests: Sequence[AnalysisRequest]) -> Reads[list[dict[str, Positions]]]:
        """The node's analysis of each request (every one has a field to analyse), one round trip."""
        docs = [
            {
                "doc": dict(request.doc),
                "fields": list(request.analyzers),
                "per_field_analyzer": dict(request.analyzers),
                "positions": True,
                "offsets": False,
                "payloads": False,
                "term_statistics": False,
                "field_statistics": False,
                "routing": routing,
            }
            for request in requests
        ]
        response = yield Call(
            "mtermvectors",
            {"index": self.alias, "body": {"docs": docs}, "filter_path": ANALYSIS_FILTER_PATH},
            "analyse the recall query",
        )
        answers: list[dict[str, Positions]] = []
        for doc in response["docs"]:
            if "error" in doc:
                raise item_error(doc.get("status"), doc["error"], "analyse the recall query")
            vectors = doc.get("term_vectors") or {}
            answers.append({name: _by_position(v.get("terms", {})) for name, v in vectors.items()})
        return answers

    def local_analysis_reads(self) -> Reads[IndexAnalysis | None]:
        """The index's analyzers in this process, if they were checked against the node for the
        index behind the alias (once per mapping read, i.e. once a minute: a reindex moves the
        alias); None: the node analyses. Never during a reindex (two indices behind the alias)."""
        local = self.local
        if local is None or not local.usable:
            return None
        mapping = yield from self.mapping_reads()
        held = self._local_for
        if held is not None and held[0] is mapping:
            return held[1]
        analysis = None
        if len(mapping.indices) == 1:
            analysis = yield from self._checked_analysis(local, mapping)
        self._local_for = (mapping, analysis)
        return analysis

    def prepare_local_analysis(self) -> None:
        """Check the in-process analysis against the node now (the API's start-up) rather than on
        the first recall, which would wait for the analyzers to load (the CJK dictionaries take
        ~0.2 s) and for the probe. A failure only leaves the check to that first recall."""
        if self.local is None:
            return
        try:
            calls.run(self.client, self.local_analysis_reads())
        except Exception as exc:  # the node down or the index missing at start-up
            log.warning("the in-process query analysis is checked on the first recall instead: %s", exc)

    def _checked_analysis(self, local: LocalAnalysis, mapping: NameMapping) -> Reads[IndexAnalysis | None]:
        index = mapping.indices[0]
        settings = yield Call("indices.get_settings", {"index": index}, "read the beliefs index settings")
        info = yield Call("info", {}, "read the node's version")
        node_versions = f"{info['version']['number']} {info['version']['lucene_version']}"
        index_settings = settings[index]["settings"]
        key = local.verdict_key(index_settings, node_versions)
        verdict = local.known(key)
        if verdict is None:
            verdict = local.build(index_settings, node_versions)
            if verdict.analysis is not None:
                difference = yield from self._probe(verdict.analysis, mapping)
                if difference is not None:
                    verdict = Verdict(None, difference)
            verdict = local.remember(key, verdict)
        return verdict.analysis

    def _probe(self, analysis: IndexAnalysis, mapping: NameMapping) -> Reads[str | None]:
        """Every analyzer a name field searches with (and the recall's word analyzer) on every
        probe text, here and on the node (one round trip); the first difference, or None."""
        names = {a for f, a in mapping.search_analyzers.items() if f.split(".", 1)[0] in SOURCE_FIELDS}
        requests = [
            AnalysisRequest({"canonical_name": text}, {"canonical_name": analyzer})
            for analyzer in sorted(names | {WORD_ANALYZER})
            for text in PROBE_TEXTS
        ]
        answers = yield from self.node_analyze("query-analysis-probe", requests)
        for request, answer in zip(requests, answers, strict=True):
            if analysis.analyze(request.doc, request.analyzers) != answer:
                analyzer, text = request.analyzers["canonical_name"], request.doc["canonical_name"]
                return f"{analyzer} analyses {text[:40]!r} differently from the node"
        return None


def store_units(client: OpenSearch, index: str) -> int:
    """Give every belief of ``index`` (a concrete generation nobody writes to yet: the target of
    ``tenure reindex``) the units of its names, analysed by that index's own analyzers, and
    return how many were rewritten. Units are not in ``_source``, so a reindex cannot copy them;
    recomputing them also keeps them right when the upgrade changed an analyzer. A scan across
    tenants, so maintenance's own filters (:func:`access.maintenance_scan`); each document keeps
    its own routing."""
    names = VocabularyStore(client, index)
    if not names.mapping().has_units:
        return 0
    # _reindex does not refresh its target: without this the scan can run before the copied
    # documents are searchable and store nothing (seen once in CI: 0 of 29).
    client.indices.refresh(index=index)
    scan = access.maintenance_scan("store the vocabulary units of a new generation")
    search_after: list[Any] | None = None
    rewritten = 0
    while True:
        body: dict[str, Any] = {
            "size": _BACKFILL_PAGE,
            "query": scan.query(),
            "sort": [{"tenant_id": "asc"}, {"id": "asc"}],
        }
        if search_after is not None:
            body["search_after"] = search_after
        hits = client.search(index=index, body=body, request_timeout=120)["hits"]["hits"]
        if not hits:
            return rewritten
        sources = [hit["_source"] for hit in hits]
        units = names.units_of(
            [(str(s["tenant_id"]), str(s["canonical_name"]), list(s.get("aliases") or [])) for s in sources]
        )
        if units is None:  # the mapping was read above: it stores units
            return rewritten
        actions = [
            {
                "_index": index,
                "_id": hit["_id"],
                "_routing": hit.get("_routing") or source["tenant_id"],
                "_source": {**source, UNITS_FIELD: held},
            }
            for hit, source, held in zip(hits, sources, units, strict=True)
        ]
        for ok, item in helpers.streaming_bulk(client, actions, raise_on_error=False, request_timeout=120):
            if not ok:
                raise RuntimeError(f"could not store the units of {bulk_item(item).get('_id')}: {bulk_item(item)}")
            rewritten += 1
        search_after = hits[-1]["sort"]


def _add_units(groups: dict[str, set[str]], keys: Iterable[str]) -> None:
    """Stored units (``<group>\u001f<term>``) into their groups' term sets; the marker and
    anything without a group is skipped."""
    for key in keys:
        group, separator, term = key.partition(UNIT_SEPARATOR)
        if separator and group:
            groups.setdefault(group, set()).add(term)


def _analyzer(spec: Mapping[str, Any], *, search: bool) -> str:
    index = str(spec.get("analyzer") or "standard")
    return str(spec.get("search_analyzer") or index) if search else index


def _analyzers(properties: Mapping[str, Any], prefix: str = "", *, search: bool) -> Iterator[tuple[str, str]]:
    """Every text field's search (or index) analyzer: ``name`` and ``name.sub``."""
    for name, spec in properties.items():
        path = f"{prefix}{name}"
        if spec.get("type") == "text":
            yield path, _analyzer(spec, search=search)
        for sub, sub_spec in (spec.get("fields") or {}).items():
            if sub_spec.get("type") == "text":
                yield f"{path}.{sub}", _analyzer(sub_spec, search=search)
        if "properties" in spec:
            yield from _analyzers(spec["properties"], f"{path}.", search=search)


def _by_position(terms: Mapping[str, Any]) -> Positions:
    """Term vectors list each distinct term with its positions; the query builder needs the token
    stream back: one group per position (tokens stacked at one position are alternatives)."""
    at: dict[int, list[str]] = {}
    for term, info in terms.items():
        for token in info.get("tokens", []):
            at.setdefault(int(token["position"]), []).append(term)
    return grouped(at)
