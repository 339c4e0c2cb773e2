"""Tenant vocabularies shared between processes through Redis (service/recall/shared_vocabulary.py):
a second process loads what the first built, with the same matches, and never an entry of
another tenant, another write version, a damaged one, or one stored after a write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from deploy.devstack import free_port
from service.config import Settings
from service.recall.shared_vocabulary import SharedVocabularies
from service.recall.vocabulary import FieldVocabulary, TenantVocabulary, VocabularyCache, VocabularyMatcher
from service.storage.beliefs import BeliefStore
from tests.conftest import principal
from tests.factories import make_belief, put_all

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["kafkas setup", "postgress tuning", "rediss eviction", "message queue retries", "nothing here"]


def _seed(store: BeliefStore, tenant: str) -> None:
    put_all(
        store,
        make_belief(tenant, "ann", "event_bus", aliases=["kafka", "message queue"]),
        make_belief(tenant, "ann", "primary_database", aliases=["postgres"]),
        make_belief(tenant, "bob", "cache_layer", aliases=["redis", "eviction policy"]),
    )


def _shared(store: BeliefStore) -> SharedVocabularies:
    assert store.versions is not None
    return SharedVocabularies(store.versions.client, store.versions.namespace, ttl_s=600)


def _cache(store: BeliefStore, shared: SharedVocabularies | None) -> VocabularyCache:
    return VocabularyCache(store.vocabulary, store.versions, shared=shared)


def _clauses(store: BeliefStore, cache: VocabularyCache, tenant: str) -> list[list[dict[str, Any]]]:
    return VocabularyMatcher(store.vocabulary, cache).clauses_many(principal(tenant, "ann"), TEXTS)


def test_a_second_process_loads_the_first_ones_build(store: BeliefStore, settings: Settings) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    _seed(store, tenant)
    first = _cache(store, _shared(store))
    expected = _clauses(store, first, tenant)
    assert first.stats.builds == 1 and first.stats.shared_loads == 0
    assert any(expected), "the texts must match something, or the comparison proves nothing"
    # another interpreter, with another string hash seed (the pre-filter's keys differ): it loads
    # the entry instead of building, and matches exactly what the builder matches
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, settings.opensearch_url, settings.redis_url, settings.opensearch_namespace,
         tenant, json.dumps(TEXTS)],
        cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "12345"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    answer = json.loads(child.stdout)
    assert answer["stats"] == {"builds": 0, "shared_loads": 1}
    assert answer["clauses"] == json.loads(json.dumps(expected))


_CHILD = """
import json, sys
import redis
from service.config import Settings
from service.recall.shared_vocabulary import SharedVocabularies
from service.recall.vocabulary import VocabularyCache, VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.domain.principal import Principal
from service.write_versions import TenantWriteVersions

os_url, redis_url, namespace, tenant, texts = sys.argv[1:6]
client = redis.Redis.from_url(redis_url)
store = BeliefStore(build_client(Settings(opensearch_url=os_url)), namespace, TenantWriteVersions(client, namespace))
shared = SharedVocabularies(client, namespace, ttl_s=600)
cache = VocabularyCache(store.vocabulary, store.versions, shared=shared)
matcher = VocabularyMatcher(store.vocabulary, cache)
clauses = matcher.clauses_many(Principal(tenant_id=tenant, user_id="ann"), json.loads(texts))
print(json.dumps({"stats": {"builds": cache.stats.builds, "shared_loads": cache.stats.shared_loads},
                  "clauses": clauses}))
"""


def test_an_entry_of_an_older_version_is_rebuilt_and_replaced(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    _seed(store, tenant)
    shared = _shared(store)
    _clauses(store, _cache(store, shared), tenant)
    put_all(store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))  # bumps the version
    later = _cache(store, shared)
    assert later.get(principal(tenant, "ann")).field("aliases").terms >= {"kafka", "flink"}
    assert later.stats.builds == 1 and later.stats.shared_loads == 0  # the old entry was not used
    third = _cache(store, shared)
    assert "flink" in third.get(principal(tenant, "ann")).field("aliases").terms
    assert third.stats.shared_loads == 1  # the rebuild replaced it


def test_a_build_is_not_stored_once_the_tenant_has_written(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    _seed(store, tenant)
    assert store.versions is not None
    shared = _shared(store)
    version = store.versions.current(tenant)
    built = _cache(store, None).get(principal(tenant, "ann"), version)
    put_all(store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))
    assert shared.store(tenant, version, built.encode()) is False  # raced a write: never lands
    assert shared.load(tenant) is None
    assert shared.store(tenant, store.versions.current(tenant), built.encode()) is True


def test_another_tenants_entry_is_never_used(store: BeliefStore) -> None:
    mine, theirs = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    _seed(store, theirs)
    put_all(store, make_belief(mine, "ann", "build_tool", aliases=["gradle"]))
    shared = _shared(store)
    _clauses(store, _cache(store, shared), theirs)
    their_entry = shared.load(theirs)
    assert their_entry is not None
    assert store.versions is not None
    # their entry copied under my key (an operator's mistake, a bug): its header names them
    shared.client.set(shared.key(mine), their_entry)
    cache = _cache(store, shared)
    terms = cache.get(principal(mine, "ann")).field("aliases").terms
    assert "gradle" in terms and "kafka" not in terms
    assert cache.stats.builds == 1 and cache.stats.shared_loads == 0


def test_damaged_entries_are_rebuilt(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    _seed(store, tenant)
    shared = _shared(store)
    expected = _clauses(store, _cache(store, shared), tenant)
    good = shared.load(tenant)
    assert good is not None
    for damaged in (b"garbage", good[:-7], good[:40] + b"\x00" * 16 + good[56:], b"tenure-vocabulary/1\n" + b"x"):
        shared.client.set(shared.key(tenant), damaged)
        cache = _cache(store, shared)
        assert _clauses(store, cache, tenant) == expected
        assert cache.stats.builds == 1 and cache.stats.shared_loads == 0


def test_without_redis_the_vocabulary_is_built(store: BeliefStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    _seed(store, tenant)
    expected = _clauses(store, _cache(store, None), tenant)
    nowhere: redis.Redis[bytes] = redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2)
    unreachable = SharedVocabularies(nowhere, "nowhere", ttl_s=600)
    cache = _cache(store, unreachable)
    assert _clauses(store, cache, tenant) == expected
    assert cache.stats.builds == 1


def test_any_term_round_trips_through_the_encoding() -> None:
    """Whatever a stored name or alias analyses to (CJK, emoji, combining marks, a lone surrogate
    from a JSON escape) comes back as the same terms, pre-filter and fuzzy matches."""
    terms = ["kafka", "kafkas", "東京タワー", "データベース", "🚀rocket", "café", "cafe\u0301", "bad\ud800half", ""]
    fields = {
        "aliases": FieldVocabulary.build(terms, ranges=True),
        "aliases.shingle": FieldVocabulary.build(["message queue", "東京 タワー"]),
    }
    fields["canonical_name"] = fields["aliases"]  # shared groups stay shared
    built = TenantVocabulary("t-any", 7, fields, 3, 1.0, 100, 0, b"\x01" * 32)
    back = TenantVocabulary.decode(built.encode(), tenant_id="t-any", version=7, fingerprint=b"\x01" * 32)
    assert {name: f.terms for name, f in back.fields.items()} == {name: f.terms for name, f in fields.items()}
    assert back.fields["canonical_name"] is back.fields["aliases"]
    assert all(back.fields[name].pre_filter == f.pre_filter for name, f in fields.items())
    for word in ("kafkaa", "bad\ud800hal", "東京タワー", "cafe"):
        assert back.field("aliases").fuzzy(word) == fields["aliases"].fuzzy(word)
    for tenant_id, version, fingerprint in (
        ("t-other", 7, b"\x01" * 32),
        ("t-any", 8, b"\x01" * 32),
        ("t-any", 7, b"\x02" * 32),
    ):
        with pytest.raises(ValueError, match="another tenant, version or index mapping"):
            TenantVocabulary.decode(built.encode(), tenant_id=tenant_id, version=version, fingerprint=fingerprint)
