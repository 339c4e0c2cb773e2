"""Session fixtures: a real OpenSearch node and a real Redis server for the whole test run.

By default both are started fresh (free ports, throw-away dirs) and stopped at the end. During
development, point ``TENURE_TEST_OPENSEARCH_URL`` / ``TENURE_TEST_REDIS_URL`` at running servers
to skip the ~20 s start-up; every session still gets its own index namespace and Redis DB keys.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opensearchpy import OpenSearch

from deploy.devstack import Service, start_opensearch, start_redis
from evals.runner import ContextBackend, RunResult
from service.config import RecallDefaults, Settings
from service.domain.principal import Principal
from service.recall.context import ContextBuilder
from service.recall.prebuild import VocabularyPrebuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.storage.local_analysis import LocalAnalysis
from service.storage.templates import apply_templates, drop_namespace
from service.write_versions import TenantWriteVersions

# The pytest process builds and drops many apps in turn: their reference cycles must not wait
# frozen for a thaw (service/process.py; tests/test_process.py covers the freezer). Server
# processes the tests start as a deployment would (deploy/localstack.py) keep the default.
os.environ.setdefault("TENURE_GC_THAW_INTERVAL_S", "0")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Service]:
    """A redis-server of this test alone, started as the dev stack starts it (appendonly yes,
    appendfsync everysec, rdbcompression no): for tests that kill it, reconfigure it or make it
    rewrite its append-only file."""
    svc = start_redis(tmp_path / "redis")
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def opensearch_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("TENURE_TEST_OPENSEARCH_URL")
    if external:
        yield external
        return
    svc: Service = start_opensearch(Path(tmp_path_factory.mktemp("opensearch")) / "home")
    try:
        yield svc.url
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("TENURE_TEST_REDIS_URL")
    if external:
        yield external
        return
    svc = start_redis(Path(tmp_path_factory.mktemp("redis")) / "home")
    try:
        yield svc.url
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def settings(opensearch_url: str, redis_url: str, namespace: str) -> Settings:
    return Settings(opensearch_url=opensearch_url, redis_url=redis_url, opensearch_namespace=namespace)


@pytest.fixture(scope="session")
def os_client(settings: Settings) -> Iterator[OpenSearch]:
    client = build_client(settings)
    apply_templates(client, settings.opensearch_namespace)
    try:
        yield client
    finally:
        drop_namespace(client, settings.opensearch_namespace)
        client.close()


@pytest.fixture(scope="session")
def store(os_client: OpenSearch, settings: Settings) -> Iterator[BeliefStore]:
    """Writes bump the tenants' write versions in the session's Redis, like the service's own
    store, so the API's cached recall vocabularies see what tests write directly."""
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url)
    try:
        yield BeliefStore(
            os_client, settings.opensearch_namespace, TenantWriteVersions(client, settings.opensearch_namespace)
        )
    finally:
        client.close()


@pytest.fixture(scope="session")
def local_analysis(opensearch_url: str) -> LocalAnalysis:
    """The API's in-process query analysis (one JVM for the test process, as in an API process):
    it must start here, so the suite runs the recall as the API does. After the node fixture,
    which builds deploy/opensearch (its jars and the QueryAnalysis class)."""
    started = LocalAnalysis.start()
    assert started is not None, "the JVM with the node's analysis code did not start (scripts/setup.sh builds it)"
    return started


@pytest.fixture
def vocabulary_writer(os_client: OpenSearch, settings: Settings) -> Iterator[tuple[BeliefStore, VocabularyPrebuilder]]:
    """A store wired like a worker's (workers/resources.py): its write-version bumps note the
    tenants its prebuilder then builds and shares (service/recall/prebuild.py)."""
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url)
    versions = TenantWriteVersions(client, settings.opensearch_namespace)
    store = BeliefStore(os_client, settings.opensearch_namespace, versions)
    prebuilder = VocabularyPrebuilder.for_store(store, RecallDefaults())
    assert prebuilder is not None
    versions.on_bump = prebuilder.note
    try:
        yield store, prebuilder
    finally:
        client.close()


@pytest.fixture
def tenant() -> str:
    """A fresh tenant per test: tests share one index, as tenants do in production."""
    return f"t-{uuid.uuid4().hex[:10]}"


def principal(
    tenant_id: str, user_id: str, *, projects: tuple[str, ...] = (), teams: tuple[str, ...] = (), admin: bool = False
) -> Principal:
    from service.domain.principal import Role

    roles = frozenset({Role.MEMBER, Role.ADMIN}) if admin else frozenset({Role.MEMBER})
    return Principal(
        tenant_id=tenant_id, user_id=user_id, roles=roles, projects=frozenset(projects), teams=frozenset(teams)
    )


def recall_builder(store: BeliefStore, settings: Settings, relevance: str) -> ContextBuilder:
    """A context builder with the given relevance path: ``lucene`` (the fuzzy/shingle query) or
    ``vocabulary`` (the tenant's own vocabulary, exact weighted terms; issue 16)."""
    matcher = VocabularyMatcher.for_store(store, settings.recall) if relevance == "vocabulary" else None
    return ContextBuilder(store, settings.recall, matcher)


SuiteBackend = Callable[..., ContextBackend]


@pytest.fixture(scope="session")
def suite_backend(settings: Settings) -> SuiteBackend:
    """The case suites' recall backend over a store, as the service runs it: the tenant-vocabulary
    path by default (``relevance="lucene"`` for the fuzzy/shingle query), with explain on so the
    verdicts carry the matched clauses. ``suite_backend(store, relevance=..., name=...)``."""

    def make(store: BeliefStore, relevance: str = "vocabulary", name: str = "bm25") -> ContextBackend:
        return ContextBackend(recall_builder(store, settings, relevance), name=name, explain=True)

    return make


def fingerprint(run: RunResult) -> list[tuple[Any, ...]]:
    """What two runs of a case suite must agree on, verdict by verdict: pass, tiers, scores."""
    return [
        (
            v.case_id,
            v.passed,
            v.tiers.persona,
            tuple(v.tiers.pinned),
            tuple(v.tiers.relevant),
            tuple(v.tiers.questions),
            tuple(sorted(v.tiers.scores.items())),
        )
        for v in run.verdicts
    ]
