"""fastpath_bench.client_heap: the load generator's heap frozen while it measures, and given back after."""

from __future__ import annotations

import gc

import pytest

from benchmarks.fastpath_bench import client_heap, parse_args


def test_the_heap_is_frozen_inside_and_unfrozen_after() -> None:
    kept = [object() for _ in range(1000)]
    with client_heap(frozen=True):
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0


def test_unfrozen_on_an_error_too() -> None:
    with pytest.raises(RuntimeError), client_heap(frozen=True):
        raise RuntimeError("a phase failed")
    assert gc.get_freeze_count() == 0


def test_default_leaves_the_collector_alone() -> None:
    before = gc.get_freeze_count()
    with client_heap(frozen=False):
        assert gc.get_freeze_count() == before


def test_runs_freeze_unless_told_otherwise() -> None:
    assert parse_args([]).client_gc == "frozen"
    assert parse_args(["--client-gc", "default"]).client_gc == "default"
