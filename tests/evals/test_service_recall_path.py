"""The evaluation's ``bm25`` runs recall as the API runs it (service/recall/stack.py builds both):
the tenant-vocabulary matcher, the tier cache, write versions in Redis and the in-process query
analysis; and on the same cases it returns what ``POST /v1/recall`` returns, tier by tier, in order.

``bm25-lucene-query`` keeps the Lucene fuzzy/shingle query (vocabulary matching off) and gives the
same answers. Runs against the session's real OpenSearch and Redis (tests/conftest.py); the API is
one app of this module, in its own namespace.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from prometheus_client import REGISTRY
from pydantic import SecretStr

from evals.backends import SPECS, ProcessResources, drop_backend_namespace, make_backend, prepare_namespace
from evals.cases import CaseSet, multilingual_case_set, paper_case_set
from evals.http_backend import run_over_http
from evals.runner import ContextBackend, RunResult, run_case_set
from service.api.state import Services
from service.app import create_app
from service.beliefs.api_service import SERVER_OWNED
from service.config import AuthSettings, Settings
from service.domain.principal import Principal
from service.recall.tier_cache import TierCache
from service.storage.local_analysis import LocalAnalysis
from service.storage.templates import FAMILIES, drop_namespace

# CJK, Korean particles, a Latin typo inside CJK, near misses, shared scopes with and without the
# grant, another user's same-named belief, noise; and both sessions (their mutations move the
# tenant's write version, so the caches must follow)
MULTILINGUAL_CASES = (
    "ja-alias-in-sentence",
    "ja-partial-payment",
    "ja-kyoto-boundary",
    "ja-latin-typo-in-cjk",
    "zh-mixed-redis",
    "zh-one-char-diff",
    "ko-particle-genitive",
    "ko-compound-unspaced",
    "de-typo",
    "ja-other-user",
    "zh-team-shared",
    "zh-team-no-grant",
    "ja-noise",
)


# aliases, a typo, scope walls, another user's and a new user's recall, supersession, the
# budget, open questions, the persona; and the drift session (12 turns with mutations)
PAPER_CASES = (
    "alias-kube-resolves",
    "conflict-scope-disambiguation-redis-writing",
    "isolation-user-scoping",
    "questions-pinned-active-only",
    "fuzzy-single-edit-fires-non-pinned",
    "multi-hop-supersession-chain-all-excluded",
    "cold-start-user-no-beliefs",
    "budget-ceiling-evicts-relevant-beliefs",
    "negative-guidance-mongoose",
    "persona-prelude-content-present",
)


def _subset(case_set: CaseSet, case_ids: tuple[str, ...]) -> CaseSet:
    """The cases named, over a corpus without the fields the API keeps for itself: a member's
    import gets the server's values for them (service/beliefs/api_service.py), so with the seed's
    own ``last_reinforced_at`` the in-process load would break score ties (and order the persona)
    differently from the import, which is the loaders' difference, not recall's."""
    static = [c for c in case_set.static if c.case_id in case_ids]
    assert len(static) == len(case_ids)
    beliefs = [{k: v for k, v in record.items() if k not in SERVER_OWNED} for record in case_set.beliefs]
    return dataclasses.replace(case_set, static=static, beliefs=beliefs)


CASE_SETS = {
    "multilingual": _subset(multilingual_case_set(), MULTILINGUAL_CASES),
    "paper": _subset(paper_case_set(), PAPER_CASES),
}


def _tiers(run: RunResult) -> list[tuple[Any, ...]]:
    """What the two paths must agree on, case by case: ids and order of every tier, the persona."""
    return [
        (v.case_id, v.passed, v.tiers.persona, v.tiers.pinned, v.tiers.relevant, v.tiers.questions)
        for v in run.verdicts
    ]


def _bounds(cache: TierCache) -> tuple[Any, ...]:
    return (cache.max_entries, cache.max_bytes, cache.max_age_s, cache.messages.max_bytes)


def _analysed_in_process() -> float:
    return REGISTRY.get_sample_value("tenure_recall_query_analysis_total", {"where": "process"}) or 0.0


@pytest.fixture(scope="module")
def process(settings: Settings, local_analysis: LocalAnalysis) -> Iterator[ProcessResources]:
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url)
    try:
        yield ProcessResources(client, local_analysis)
    finally:
        client.close()


@pytest.fixture(scope="module")
def api(settings: Settings, os_client: OpenSearch) -> Iterator[tuple[TestClient, str]]:
    """An API of this module (its own namespace, the default limits) and its operator key."""
    api_settings = settings.model_copy(
        update={
            "opensearch_namespace": f"evalapi-{uuid.uuid4().hex[:8]}",
            "auth": AuthSettings(api_key_pepper=SecretStr("test-pepper")),
        }
    )
    with TestClient(create_app(api_settings)) as client:
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        yield client, services.provisioning.bootstrap().plaintext
        drop_namespace(os_client, api_settings.opensearch_namespace, FAMILIES)
        for key in services.redis.scan_iter(match=f"{api_settings.opensearch_namespace}:*", count=1000):
            services.redis.delete(key)


def _run_backend(
    os_client: OpenSearch, settings: Settings, process: ProcessResources, case_set: CaseSet, name: str
) -> tuple[ContextBackend, RunResult]:
    """One backend as ``tenure-eval`` runs it (evals/cli.py ``run_backend``): a fresh namespace,
    the corpus in a static and a session tenant."""
    spec = SPECS[name]
    run_id = uuid.uuid4().hex[:8]
    namespace = f"eval-{run_id}-{name}"
    try:
        store = prepare_namespace(os_client, namespace, spec, settings.recall, process)
        backend = make_backend(spec, store, settings.recall)
        assert isinstance(backend, ContextBackend)
        tenants = {"static_tenant": f"static-{run_id}", "session_tenant": f"session-{run_id}"}
        run = run_case_set(case_set, backend, store, **tenants)
        # a third tenant of the same namespace, with no beliefs: the caches the run filled answer
        # for their own tenant only
        stranger = Principal(tenant_id=f"stranger-{run_id}", user_id="test-user")
        for case in case_set.static:
            tiers = backend.recall(stranger, case.scope, case.query, None)
            assert (tiers.pinned, tiers.relevant, tiers.questions, tiers.persona) == ([], [], [], None), case.case_id
    finally:
        drop_backend_namespace(os_client, namespace, process)
    return backend, run


@pytest.mark.parametrize("case_set", CASE_SETS.values(), ids=CASE_SETS.keys())
def test_bm25_runs_the_apis_recall_path_and_answers_as_the_api(
    case_set: CaseSet,
    os_client: OpenSearch,
    settings: Settings,
    process: ProcessResources,
    api: tuple[TestClient, str],
) -> None:
    client, operator_key = api
    analysed = _analysed_in_process()
    backend, run = _run_backend(os_client, settings, process, case_set, "bm25")
    builder = backend.builder
    service_builder = client.app.state.services.recall.builder  # type: ignore[attr-defined]

    # the API's wiring: relevance from the tenant's vocabulary, the tier cache, write versions,
    # the process's in-process analysis, the decoded-belief cache's size
    assert builder.matcher is not None and service_builder.matcher is not None
    assert builder.tier_cache is not None and service_builder.tier_cache is not None
    assert _bounds(builder.tier_cache) == _bounds(service_builder.tier_cache)
    assert builder.store.versions is not None
    assert builder.store.vocabulary.local is process.local_analysis
    assert builder.store.decoded.max_entries == service_builder.store.decoded.max_entries
    # ... and used: vocabularies looked up and kept between recalls, queries analysed in process
    hits, misses = builder.matcher.cache.counts().lookups["all"]
    assert misses >= 2 and hits > 0  # built once per tenant and write version, then reused
    assert _analysed_in_process() > analysed
    filter_hits, _ = builder.tier_cache.counts().lookups["filters"]
    assert filter_hits > 0  # the filter tiers came from the cache at an unchanged write version

    run_id = uuid.uuid4().hex[:8]
    over_http = run_over_http(
        case_set, client, operator_key, static_tenant=f"http-static-{run_id}", session_tenant=f"http-session-{run_id}"
    )
    assert len(run.verdicts) == len(over_http.verdicts) == case_set.total
    for ours, theirs in zip(_tiers(run), _tiers(over_http), strict=True):
        assert ours == theirs
    assert run.passed == run.total


def test_bm25_lucene_query_keeps_the_lucene_query_with_the_same_answers(
    os_client: OpenSearch, settings: Settings, process: ProcessResources
) -> None:
    case_set = CASE_SETS["multilingual"]
    lucene, lucene_run = _run_backend(os_client, settings, process, case_set, "bm25-lucene-query")
    assert lucene.builder.matcher is None
    assert lucene.builder.tier_cache is not None and lucene.builder.store.versions is not None
    _, vocabulary_run = _run_backend(os_client, settings, process, case_set, "bm25")
    assert _tiers(lucene_run) == _tiers(vocabulary_run)
    assert [sorted(v.tiers.scores.items()) for v in lucene_run.verdicts] == [
        sorted(v.tiers.scores.items()) for v in vocabulary_run.verdicts
    ]
