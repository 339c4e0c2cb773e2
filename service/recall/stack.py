"""Recall as the API wires it, built in one place.

The API's services (``service/api/state.py``) and the evaluation's BM25 backends
(``evals/backends.py``) both build their belief store and context builder here, so what
``tenure-eval`` reports for ``bm25`` (tiers and latency) is the recall the API runs: the
tenant-vocabulary matcher when ``vocabulary_matching`` is on, the tier cache, the decoded-belief
cache's size, write versions in Redis and the in-process query analysis when the process has one.
"""

from __future__ import annotations

from opensearchpy import OpenSearch

from service.config import RecallDefaults
from service.recall.context import ContextBuilder
from service.recall.tier_cache import TierCache
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.local_analysis import LocalAnalysis
from service.write_versions import TenantWriteVersions


def recall_store(
    client: OpenSearch,
    namespace: str,
    recall: RecallDefaults,
    versions: TenantWriteVersions | None,
    local_analysis: LocalAnalysis | None,
) -> BeliefStore:
    """The belief store recall reads through: its writes bump ``versions`` (the caches below follow
    them; without them nothing is kept between recalls), its queries are analysed by
    ``local_analysis`` once checked against the node (None: by the node)."""
    store = BeliefStore(client, namespace, versions, local_analysis)
    store.decoded.max_entries = recall.decode_cache_entries
    return store


def recall_matcher(store: BeliefStore, recall: RecallDefaults) -> VocabularyMatcher | None:
    """Relevance from the tenant's own vocabulary when the setting is on (one LRU per process);
    None: the per-request Lucene fuzzy/shingle query."""
    return VocabularyMatcher.for_store(store, recall) if recall.vocabulary_matching else None


def recall_tier_cache(recall: RecallDefaults) -> TierCache:
    return TierCache(
        max_entries=recall.tier_cache_entries,
        max_age_s=recall.tier_cache_max_age_s,
        max_bytes=recall.tier_cache_mb * 1024 * 1024,
        message_max_bytes=recall.message_tier_cache_mb * 1024 * 1024,
    )


def context_builder(store: BeliefStore, recall: RecallDefaults) -> ContextBuilder:
    """The API's context builder over ``store`` with ``recall``'s settings."""
    return ContextBuilder(store, recall, recall_matcher(store, recall), recall_tier_cache(recall))


__all__ = ["context_builder", "recall_matcher", "recall_store", "recall_tier_cache"]
