"""service/process.py: the survivors of a generation-2 collection are frozen, a frozen object is
still freed by reference counting, and a reference cycle frozen and then dropped is collected at
the next thaw; the paced collector collects on its own clock, once per process."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

from service import process
from service.app import paced_collections
from service.process import (
    PacedCollector,
    SurvivorFreezer,
    collect_every,
    freeze_startup_heap,
    paced_interval,
    start_paced_collector,
)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def freezer() -> Iterator[SurvivorFreezer]:
    freezer = SurvivorFreezer(thaw_interval_s=3600).install()
    try:
        yield freezer
    finally:
        freezer.uninstall()
        gc.unfreeze()
        gc.collect()


def test_survivors_of_a_full_collection_are_frozen(freezer: SurvivorFreezer) -> None:
    kept = [_Node() for _ in range(1000)]
    before = gc.get_freeze_count()
    gc.collect()
    assert freezer.freezes >= 1  # the app's paced collector may have collected too
    assert gc.get_freeze_count() >= before + len(kept)
    assert all(not gc.is_finalized(n) for n in kept)


def test_a_frozen_object_is_still_freed_by_reference_counting(freezer: SurvivorFreezer) -> None:
    cached = _Node()
    gone = weakref.ref(cached)
    gc.collect()  # frozen now
    del cached
    assert gone() is None


def test_a_frozen_cycle_dropped_later_is_collected_at_the_next_thaw(freezer: SurvivorFreezer) -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.collect()  # the cycle is alive: frozen
    del a, b
    gc.collect()
    assert gone() is not None  # frozen garbage waits for the thaw
    freezer.thaw_interval_s = 0
    gc.collect()
    assert freezer.thaws >= 1
    assert gone() is None


def test_the_young_threshold_is_set_and_0_keeps_the_default() -> None:
    before = gc.get_threshold()
    try:
        freeze_startup_heap(thaw_interval_s=0, young_threshold=0)
        assert gc.get_threshold() == before
        freeze_startup_heap(thaw_interval_s=0, young_threshold=20_000)
        assert gc.get_threshold() == (20_000, *before[1:])
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_the_paced_collector_collects_a_dropped_cycle_with_cpython_s_collector_off() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.disable()  # only the paced collector can find the cycle now
    collector = PacedCollector(interval_s=0.02).start()
    try:
        del a, b
        deadline = time.monotonic() + 10
        while (gone() is not None or collector.collections == 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gone() is None
        assert collector.collections >= 1
    finally:
        collector.stop()
        gc.enable()
    done = collector.collections
    time.sleep(0.1)
    assert collector.collections == done  # stopped means stopped


@pytest.fixture
def no_process_collector() -> Iterator[None]:
    before = process._collector
    process._collector = None
    try:
        yield
    finally:
        if process._collector is not None:
            process._collector.stop()
        process._collector = before


@pytest.mark.usefixtures("no_process_collector")
def test_no_paced_collection_without_the_freezer() -> None:
    assert paced_interval(1.0, thaw_interval_s=1800) == 1.0
    assert paced_interval(1.0, thaw_interval_s=0) == 0.0
    try:
        freeze_startup_heap(thaw_interval_s=0, collect_interval_s=1.0)
        assert process._collector is None
    finally:
        gc.unfreeze()


@pytest.mark.usefixtures("no_process_collector")
def test_one_paced_collector_per_process_and_none_at_interval_0() -> None:
    assert start_paced_collector(0) is None
    first = start_paced_collector(60)
    assert first is not None
    assert start_paced_collector(60) is first
    first.pid = -1  # as the copy a forked child inherits: no thread of its own
    second = start_paced_collector(60)
    assert second is not None and second is not first
    first.stop()


class _Finalized(_Node):
    """A node that notes the thread its finalizer ran on."""

    threads: list[int] = []  # noqa: RUF012 - the test's record

    def __del__(self) -> None:
        _Finalized.threads.append(threading.get_ident())


def test_on_the_loop_a_dropped_cycle_is_collected_and_finalized_on_the_loop_s_thread() -> None:
    async def scenario() -> None:
        a, b = _Finalized(), _Finalized()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        task = paced_collections(0.02)
        assert task is not None
        try:
            deadline = time.monotonic() + 10
            while gone() is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert gone() is None
        finally:
            task.cancel()

    _Finalized.threads.clear()
    gc.disable()  # only the paced collection can find the cycle now
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
    assert _Finalized.threads and set(_Finalized.threads) == {threading.get_ident()}


def test_no_paced_collection_on_the_loop_at_interval_0() -> None:
    async def scenario() -> None:
        assert paced_collections(0) is None

    asyncio.run(scenario())


def test_collect_every_stops_when_cancelled() -> None:
    async def scenario() -> None:
        task = asyncio.create_task(collect_every(0.01))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
