"""Vocabularies restored when a write's vocabulary is stored, before the tenant's next recall
(service/recall/vocabulary_warmer.py): each stored entry is announced, an API process that holds
the tenant restores the announced version off the request path with the same matches as a build,
and a tenant it does not hold, an idle one, a missing entry or a malformed notice changes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import redis
from fastapi.testclient import TestClient

from service.app import create_app
from service.config import Settings
from service.recall import vocabulary as vocabulary_module
from service.recall.prebuild import VocabularyPrebuilder
from service.recall.shared_vocabulary import SharedVocabularies
from service.recall.vocabulary import VocabularyCache
from service.recall.vocabulary_warmer import VocabularyWarmer, merged, parse_notice
from service.storage.beliefs import BeliefStore
from tests.conftest import principal
from tests.factories import make_belief, put_all
from tests.test_vocabulary_prebuild import _api_cache, _clauses, _seed, _tenant


def _shared(store: BeliefStore) -> SharedVocabularies:
    assert store.versions is not None
    return SharedVocabularies(store.versions.client, store.versions.namespace, ttl_s=600)


def _held_version(cache: VocabularyCache, tenant: str) -> int | None:
    held = {v.tenant_id: v.version for v in cache.entries()}
    return held.get(tenant)


@asynccontextmanager
async def _listening(
    cache: VocabularyCache, settings: Settings, channel: str
) -> AsyncIterator[tuple[VocabularyWarmer, asyncio.Task[None]]]:
    """A running listener (subscribed) over ``cache``; stopped on the way out."""
    warmer = VocabularyWarmer(cache, settings.redis_url, channel)
    task = asyncio.create_task(warmer.run())
    try:
        await asyncio.wait_for(warmer.listening.wait(), 10)
        yield warmer, task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until_current(cache: VocabularyCache, store: BeliefStore, tenant: str, timeout_s: float = 10) -> None:
    """Wait (at most ``timeout_s``) until ``cache`` holds the tenant's current version."""
    deadline = time.monotonic() + timeout_s
    while _held_version(cache, tenant) != _version(store, tenant) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _cache_holding(
    store: BeliefStore, prebuilder: VocabularyPrebuilder, held: list[str], also_seeded: Sequence[str] = ()
) -> VocabularyCache:
    """An API process's cache that used ``held`` (in that order), their entries and those of
    ``also_seeded`` stored by a worker."""
    for tenant in (*held, *also_seeded):
        _seed(store, tenant)
    prebuilder.run_pending()
    cache = _api_cache(store)
    for tenant in held:
        cache.get(principal(tenant, "ann"))
    return cache


def _version(store: BeliefStore, tenant: str) -> int:
    assert store.versions is not None
    return store.versions.current(tenant)


def _next_notice(listener: Any, timeout_s: float) -> Any:
    """The next message on the channel within ``timeout_s`` (get_message also answers None for
    a subscription's confirmation, which it skips)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = listener.get_message(timeout=0.1)
        if message is not None:
            return message
    return None


def test_a_stored_entry_is_announced_and_an_outdated_one_is_not(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], settings: Settings
) -> None:
    store, prebuilder = vocabulary_writer
    tenant = _tenant()
    shared = _shared(store)
    listener = redis.Redis.from_url(settings.redis_url).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(shared.channel)
    try:
        _seed(store, tenant)
        assert prebuilder.run_pending() == {tenant: "built"}
        notice = _next_notice(listener, 5)
        assert notice is not None and parse_notice(notice["data"]) == (tenant, _version(store, tenant))
        stale = _version(store, tenant)
        put_all(store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))
        assert not shared.store(tenant, stale, b"an entry of the version before the write")
        assert _next_notice(listener, 1) is None  # not stored, not announced
    finally:
        listener.close()


def test_an_announced_vocabulary_is_restored_before_the_next_recall(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], settings: Settings
) -> None:
    store, prebuilder = vocabulary_writer
    tenant = _tenant()
    cache = _cache_holding(store, prebuilder, [tenant])
    _clauses(store, cache, tenant)  # the tenant's recalls in this "API process" reach field groups
    first = _version(store, tenant)
    assert _held_version(cache, tenant) == first and cache.stats.shared_loads == 1
    reached = {name for name, f in cache.get(principal(tenant, "ann"), first).fields.items() if "pre_filter" in vars(f)}
    assert reached, "the recall computed the pre-filters of the groups its texts reached"

    async def scenario() -> None:
        async with _listening(cache, settings, _shared(store).channel):
            await asyncio.to_thread(put_all, store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))
            assert await asyncio.to_thread(prebuilder.run_pending) == {tenant: "built"}  # the worker's
            await _until_current(cache, store, tenant)

    asyncio.run(scenario())
    second = _version(store, tenant)
    assert second > first and _held_version(cache, tenant) == second, "restored without a recall"
    restored = cache.get(principal(tenant, "ann"), second)
    assert {name for name, f in restored.fields.items() if "pre_filter" in vars(f)} == reached
    assert (cache.stats.builds, cache.stats.shared_loads) == (0, 2)
    hits = cache.stats.hits
    after = _clauses(store, cache, tenant)  # the next recall: served from the process, as built
    assert cache.stats.hits > hits and (cache.stats.builds, cache.stats.shared_loads) == (0, 2)
    assert after == _clauses(store, VocabularyCache(store.vocabulary, store.versions), tenant)
    assert "flink" in restored.field("aliases").terms


def test_only_a_held_active_tenant_with_an_older_version_is_restored(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, prebuilder = vocabulary_writer
    held, elsewhere = _tenant(), _tenant()
    cache = _cache_holding(store, prebuilder, [held], also_seeded=[elsewhere])
    version = _version(store, held)
    assert cache.refresh(elsewhere, _version(store, elsewhere)) == "not_held"
    assert _held_version(cache, elsewhere) is None  # nothing loaded for a tenant not active here
    assert cache.refresh(held, version) == "current"
    assert cache.refresh(held, version + 5) == "missing"  # no entry at that version: left alone
    assert _held_version(cache, held) == version
    put_all(store, make_belief(held, "ann", "stream_processor", aliases=["flink"]))
    prebuilder.run_pending()
    monkeypatch.setattr(vocabulary_module, "MAX_IDLE_S", -1.0)  # every held tenant is idle
    assert cache.refresh(held, _version(store, held)) == "not_held"
    assert _held_version(cache, held) == version
    monkeypatch.undo()
    assert cache.refresh(held, _version(store, held)) == "restored"
    assert "flink" in cache.get(principal(held, "ann"), _version(store, held)).field("aliases").terms


def test_a_refresh_keeps_the_tenants_recency(vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder]) -> None:
    store, prebuilder = vocabulary_writer
    older, newer = _tenant(), _tenant()
    cache = _cache_holding(store, prebuilder, [older, newer])
    put_all(store, make_belief(older, "ann", "stream_processor", aliases=["flink"]))
    prebuilder.run_pending()
    assert cache.refresh(older, _version(store, older)) == "restored"
    assert [v.tenant_id for v in cache.entries()] == [older, newer]  # still the least recently used


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"{}",
        b"[]",
        b'["t"]',
        b'["t", 1, 2]',
        b'["", 1]',
        b'["t", -1]',
        b'["t", 1.5]',
        b'["t", true]',
        b"[1, 1]",
        b'["t", "1"]',
        None,
        7,
    ],  # fmt: skip
)
def test_malformed_notices_are_skipped(payload: object) -> None:
    assert parse_notice(payload) is None


def test_notices_are_merged_to_the_newest_version_per_tenant() -> None:
    assert parse_notice(orjson.dumps(["t-a", 3])) == ("t-a", 3)
    assert merged([("a", 3), ("b", 1), ("a", 5), ("a", 4)]) == {"a": 5, "b": 1}


def test_the_listener_survives_malformed_notices_and_a_failing_refresh(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, prebuilder = vocabulary_writer
    tenant = _tenant()
    cache = _cache_holding(store, prebuilder, [tenant])
    channel = _shared(store).channel
    refreshed: list[tuple[str, int]] = []
    real_refresh = cache.refresh

    def refresh(tenant_id: str, version: int) -> Any:
        refreshed.append((tenant_id, version))
        if tenant_id == "t-boom":
            raise RuntimeError("a store that does not answer")
        return real_refresh(tenant_id, version)

    monkeypatch.setattr(cache, "refresh", refresh)
    publisher = redis.Redis.from_url(settings.redis_url)

    async def scenario() -> None:
        async with _listening(cache, settings, channel) as (_, task):
            for payload in (b"garbage", orjson.dumps(["t-boom", 1]), b'["x"]'):
                publisher.publish(channel, payload)
            put_all(store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))
            prebuilder.run_pending()
            await _until_current(cache, store, tenant)
            assert not task.done()

    try:
        asyncio.run(scenario())
    finally:
        publisher.close()
    assert ("t-boom", 1) in refreshed
    assert _held_version(cache, tenant) == _version(store, tenant)


def test_the_api_process_listens_unless_turned_off(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        warmer = client.app.state.vocabulary_warmer  # type: ignore[attr-defined]
        assert isinstance(warmer, VocabularyWarmer)
        deadline = time.monotonic() + 10
        while not warmer.listening.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert warmer.listening.is_set()
    off = settings.model_copy(update={"recall": settings.recall.model_copy(update={"vocabulary_refresh": False})})
    with TestClient(create_app(off)) as client:
        assert client.app.state.vocabulary_warmer is None  # type: ignore[attr-defined]


def test_the_listener_subscribes_again_after_losing_its_connection(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], settings: Settings
) -> None:
    store, prebuilder = vocabulary_writer
    tenant = _tenant()
    cache = _cache_holding(store, prebuilder, [tenant])
    admin = redis.Redis.from_url(settings.redis_url)

    async def scenario() -> None:
        async with _listening(cache, settings, _shared(store).channel) as (warmer, _):
            assert admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub") >= 1  # as a Redis restart would
            deadline = time.monotonic() + 10
            while warmer.subscriptions < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert warmer.subscriptions == 2 and warmer.listening.is_set()
            await asyncio.to_thread(put_all, store, make_belief(tenant, "ann", "stream_processor", aliases=["flink"]))
            await asyncio.to_thread(prebuilder.run_pending)
            await _until_current(cache, store, tenant)

    try:
        asyncio.run(scenario())
    finally:
        admin.close()
    assert _held_version(cache, tenant) == _version(store, tenant)


def test_each_announced_tenant_also_gets_its_filter_tiers_refreshed(
    vocabulary_writer: tuple[BeliefStore, VocabularyPrebuilder], settings: Settings
) -> None:
    store, prebuilder = vocabulary_writer
    cache = _cache_holding(store, prebuilder, [])
    asked: list[str] = []

    def tiers(tenant_id: str) -> int:
        asked.append(tenant_id)
        if tenant_id == "t-boom":
            raise RuntimeError("a store that does not answer")
        return 1

    warmer = VocabularyWarmer(cache, settings.redis_url, _shared(store).channel, tiers=tiers)
    warmer.refresh_all({"t-boom": 3, "t-fine": 2})  # never raises
    assert asked == ["t-boom", "t-fine"]
