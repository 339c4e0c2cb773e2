"""service/process.py: the survivors of a generation-2 collection are frozen, a frozen object is
still freed by reference counting, and a reference cycle frozen and then dropped is collected at
the next thaw."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from service.process import SurvivorFreezer, freeze_startup_heap


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
    assert freezer.freezes == 1
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
    assert freezer.thaws == 1
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
