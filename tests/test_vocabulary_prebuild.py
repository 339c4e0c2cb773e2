"""Vocabularies built after a write, off the recall path (service/recall/prebuild.py): what a
writer prebuilds is what an API process then loads instead of building, for that tenant and write
version only; a build that raced a newer write never lands; a failure never reaches the writer."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from opensearchpy import OpenSearch

from deploy.devstack import free_port
from service.config import RecallDefaults, Settings
from service.recall.prebuild import VocabularyPrebuilder
from service.recall.shared_vocabulary import SharedVocabularies
from service.recall.vocabulary import TenantVocabulary, VocabularyCache, VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.write_versions import TenantWriteVersions
from tests.conftest import principal
from tests.factories import make_belief, put_all

TEXTS = ["kafkas setup", "postgress tuning", "flinks windows", "nothing here"]


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _api_cache(store: BeliefStore) -> VocabularyCache:
    """An API process's cache (a fresh one: nothing of this tenant held yet)."""
    assert store.versions is not None
    shared = SharedVocabularies(store.versions.client, store.versions.namespace, ttl_s=600)
    return VocabularyCache(store.vocabulary, store.versions, shared=shared)


def _clauses(store: BeliefStore, cache: VocabularyCache, tenant: str) -> list[list[dict[str, Any]]]:
    return VocabularyMatcher(store.vocabulary, cache).clauses_many(principal(tenant, "ann"), TEXTS)


def _seed(store: BeliefStore, tenant: str) -> None:
    put_all(
        store,
        make_belief(tenant, "ann", "event_bus", aliases=["kafka", "message queue"]),
        make_belief(tenant, "bob", "primary_database", aliases=["postgres"]),
    )


def test_the_api_loads_what_the_writer_prebuilt_and_matches_the_same(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder],
) -> None:
    store, prebuilder = vocabulary_writer
    tenant = _tenant()
    _seed(store, tenant)
    assert prebuilder.run_pending() == {tenant: "built"}
    assert prebuilder.run_pending() == {}  # each noted tenant once
    cache = _api_cache(store)
    loaded = _clauses(store, cache, tenant)
    assert (cache.stats.builds, cache.stats.shared_loads) == (0, 1)
    built_here = VocabularyCache(store.vocabulary, store.versions)  # no shared entry: builds
    assert loaded == _clauses(store, built_here, tenant) and any(loaded)
    assert built_here.stats.builds == 1
    assert prebuilder.prebuild(tenant) == "fresh"  # already shared at this version: not rebuilt


def test_a_later_write_is_prebuilt_again_and_the_old_entry_never_served(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder],
) -> None:
    store, prebuilder = vocabulary_writer
    tenant = _tenant()
    _seed(store, tenant)
    prebuilder.run_pending()
    put_all(store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))
    before_prebuild = _api_cache(store)  # the entry is of the old version: built, not loaded
    assert "flink" in before_prebuild.get(principal(tenant, "ann")).field("aliases").terms
    assert (before_prebuild.stats.builds, before_prebuild.stats.shared_loads) == (1, 0)
    assert prebuilder.run_pending() == {tenant: "fresh"}  # the API's build was shared first
    put_all(store, make_belief(tenant, "ann", "object_store", aliases=["minio"]))
    assert prebuilder.run_pending() == {tenant: "built"}
    cache = _api_cache(store)
    assert {"kafka", "flink", "minio"} <= cache.get(principal(tenant, "ann")).field("aliases").terms
    assert (cache.stats.builds, cache.stats.shared_loads) == (0, 1)


def test_a_prebuild_that_raced_a_write_is_not_stored(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], store: BeliefStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, prebuilder = vocabulary_writer
    tenant = _tenant()
    _seed(ours, tenant)
    prebuilder.run_pending()
    read_units = prebuilder.store.tenant_units

    def units_then_a_write(*args: Any, **kwargs: Any) -> Any:
        units = yield from read_units(*args, **kwargs)
        put_all(store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))  # bumps
        return units

    put_all(ours, make_belief(tenant, "ann", "object_store", aliases=["minio"]))
    monkeypatch.setattr(prebuilder.store, "tenant_units", units_then_a_write)
    assert prebuilder.run_pending() == {tenant: "outdated"}
    monkeypatch.undo()
    cache = _api_cache(store)  # nothing of the current version is shared: built, with flink
    assert "flink" in cache.get(principal(tenant, "ann")).field("aliases").terms
    assert (cache.stats.builds, cache.stats.shared_loads) == (1, 0)


def test_each_tenant_gets_its_own_entry_with_its_own_terms_only(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder],
) -> None:
    store, prebuilder = vocabulary_writer
    mine, theirs = _tenant(), _tenant()
    put_all(store, make_belief(mine, "ann", "build_tool", aliases=["gradle"]))
    put_all(store, make_belief(theirs, "bob", "event_bus", aliases=["kafka"]))
    assert prebuilder.run_pending() == {mine: "built", theirs: "built"}
    for tenant, own, other in ((mine, "gradle", "kafka"), (theirs, "kafka", "gradle")):
        cache = _api_cache(store)
        terms = cache.get(principal(tenant, "ann")).field("aliases").terms
        assert own in terms and other not in terms
        assert cache.stats.shared_loads == 1


def test_a_store_that_does_not_answer_never_fails_the_writer(os_client: OpenSearch, settings: Settings) -> None:
    nowhere: redis.Redis[bytes] = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)
    store = BeliefStore(os_client, settings.opensearch_namespace, TenantWriteVersions(nowhere, "nowhere"))
    prebuilder = VocabularyPrebuilder.for_store(store, RecallDefaults())
    assert prebuilder is not None
    prebuilder.note(["t-unreachable"])
    assert prebuilder.run_pending() == {"t-unreachable": "failed"}


@pytest.mark.parametrize(
    "defaults",
    [
        RecallDefaults(vocabulary_prebuild=False),
        RecallDefaults(vocabulary_shared_ttl_s=0),
        RecallDefaults(vocabulary_matching=False),
    ],
    ids=["prebuild-off", "sharing-off", "lucene-matching"],
)
def test_nothing_is_prebuilt_when_it_could_not_be_used(store: BeliefStore, defaults: RecallDefaults) -> None:
    assert VocabularyPrebuilder.for_store(store, defaults) is None


def test_nothing_is_prebuilt_without_write_versions(os_client: OpenSearch, settings: Settings) -> None:
    unversioned = BeliefStore(os_client, settings.opensearch_namespace)
    assert VocabularyPrebuilder.for_store(unversioned, RecallDefaults()) is None


def test_only_an_entry_of_that_tenant_version_and_mapping_counts_as_fresh() -> None:
    ours, theirs = b"\x01" * 32, b"\x02" * 32
    encoded = TenantVocabulary("t-a", 3, {}, 0, 1.0, 100, 0, ours).encode()
    assert TenantVocabulary.is_encoded_for(encoded, tenant_id="t-a", version=3, fingerprint=ours)
    for tenant_id, version, mapping in (("t-b", 3, ours), ("t-a", 4, ours), ("t-a", 3, theirs)):
        assert not TenantVocabulary.is_encoded_for(encoded, tenant_id=tenant_id, version=version, fingerprint=mapping)
    for damaged in (b"", b"garbage", encoded[:-5], b"tenure-vocabulary/1\n" + b"x"):
        assert not TenantVocabulary.is_encoded_for(damaged, tenant_id="t-a", version=3, fingerprint=ours)
