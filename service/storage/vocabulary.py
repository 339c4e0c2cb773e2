"""OpenSearch reads behind recall by vocabulary (:mod:`service.recall.vocabulary`).

OpenSearch's analyzers stay the one definition of analysis: a tenant's vocabulary is the set of
terms OpenSearch's own index analysis produced for its names and aliases (term vectors of the
stored documents), and a query is split by the same search analyzers the Lucene query uses (term
vectors of an artificial document with per-field analyzers, one round trip for every clause).
Nothing here re-implements a tokenizer or a filter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opensearchpy import OpenSearch

from service.domain.principal import Principal
from service.storage import access, calls
from service.storage.calls import Call, Reads
from service.storage.client import item_error

# Same-position tokens together (the 2- and 3-word shingles starting at one word), in position order.
Positions = tuple[tuple[str, ...], ...]

# How many documents one term-vector request reads while a vocabulary is built.
_TERM_VECTOR_BATCH = 500
_ID_PAGE = 2000


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


class VocabularyStore:
    def __init__(self, client: OpenSearch, alias: str):
        self.client = client
        self.alias = alias
        self._mapping_lock = threading.Lock()
        self._search_analyzers: dict[str, str] | None = None

    # ------------------------------------------------------------------ the mapping

    def search_analyzers(self) -> dict[str, str]:
        """Every text field's search analyzer as the index mapping defines it (``name`` and
        ``name.sub``), read once: the query side of each clause is analysed by exactly these."""
        return calls.run(self.client, self.search_analyzers_reads())

    def search_analyzers_reads(self) -> Reads[dict[str, str]]:
        if self._search_analyzers is None:
            mappings = yield Call("indices.get_mapping", {"index": self.alias}, "read the beliefs mapping")
            # behind the alias there is one index, or two with the same fields during a reindex
            properties = next(iter(mappings.values()))["mappings"]["properties"]
            with self._mapping_lock:
                self._search_analyzers = dict(_search_analyzers(properties))
        return self._search_analyzers

    # ------------------------------------------------------------ a tenant's terms

    def tenant_terms(self, principal: Principal, fields: Sequence[str]) -> Reads[TenantTerms]:
        """The terms the index holds for ``fields`` over every document of the principal's tenant
        (any owner, scope or lifecycle: see :func:`access.for_vocabulary`)."""
        doc_ids = yield from self._tenant_doc_ids(principal)
        return (yield from self.document_terms(principal, doc_ids, fields))

    def document_terms(self, principal: Principal, doc_ids: Sequence[str], fields: Sequence[str]) -> Reads[TenantTerms]:
        """The terms of the given documents of the principal's tenant (routed to its shard, real
        time); ids that are not there are listed in ``missing``."""
        terms = TenantTerms(fields={f: set() for f in fields})
        for start in range(0, len(doc_ids), _TERM_VECTOR_BATCH):
            yield from self._add_term_vectors(principal, list(doc_ids[start : start + _TERM_VECTOR_BATCH]), terms)
        return terms

    def _tenant_doc_ids(self, principal: Principal) -> Reads[list[str]]:
        search_after: list[Any] | None = None
        filters = access.for_vocabulary(principal)
        ids: list[str] = []
        while True:
            body: dict[str, Any] = {
                "size": _ID_PAGE,
                "track_total_hits": False,
                "_source": False,
                "query": filters.query(),
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
        """Each request's tokens per field, grouped by position, in one round trip (a request
        with no field to analyse answers ``{}`` without being sent)."""
        sent = [r for r in requests if r.analyzers]
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
                "routing": access.routing(principal),
            }
            for request in sent
        ]
        answers: list[dict[str, Positions]] = []
        if docs:
            response = yield Call(
                "mtermvectors", {"index": self.alias, "body": {"docs": docs}}, "analyse the recall query"
            )
            for doc in response["docs"]:
                if "error" in doc:
                    raise item_error(doc.get("status"), doc["error"], "analyse the recall query")
                vectors = doc.get("term_vectors") or {}
                answers.append({name: _by_position(v.get("terms", {})) for name, v in vectors.items()})
        by_request = iter(answers)
        return [next(by_request) if r.analyzers else {} for r in requests]


def _search_analyzers(properties: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for name, spec in properties.items():
        path = f"{prefix}{name}"
        if spec.get("type") == "text":
            yield path, spec.get("search_analyzer") or spec.get("analyzer") or "standard"
        for sub, sub_spec in (spec.get("fields") or {}).items():
            if sub_spec.get("type") == "text":
                yield f"{path}.{sub}", sub_spec.get("search_analyzer") or sub_spec.get("analyzer") or "standard"
        if "properties" in spec:
            yield from _search_analyzers(spec["properties"], f"{path}.")


def _by_position(terms: Mapping[str, Any]) -> Positions:
    """Term vectors list each distinct term with its positions; the query builder needs the token
    stream back: one group per position (tokens stacked at one position are alternatives)."""
    at: dict[int, list[str]] = {}
    for term, info in terms.items():
        for token in info.get("tokens", []):
            at.setdefault(int(token["position"]), []).append(term)
    return tuple(tuple(sorted(at[p])) for p in sorted(at))
