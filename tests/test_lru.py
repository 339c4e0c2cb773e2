"""The shared LRU of the in-process caches (service/lru.py): bounds, recency, weights, evictions."""

from __future__ import annotations

import gc
import threading

from service.lru import BoundedLru


def _filled(lru: BoundedLru[str, int], *keys: str, weight: int = 0) -> BoundedLru[str, int]:
    for i, key in enumerate(keys):
        lru.put(key, i, weight)
    return lru


def test_bounded_by_count_least_recent_first() -> None:
    lru = _filled(BoundedLru(2), "a", "b", "c")
    assert len(lru) == 2 and lru.items() == [("b", 1), ("c", 2)] and lru.evictions == 1
    assert lru.get("a") is None


def test_get_makes_an_entry_the_most_recent_and_peek_does_not() -> None:
    lru = _filled(BoundedLru(3), "a", "b", "c")
    assert lru.peek("a") == 0 and lru.peek_oldest() == ("a", 0)
    assert lru.get("a") == 0 and lru.peek_oldest() == ("b", 1)
    lru.put("d", 3)
    assert lru.values() == [2, 0, 3]  # b, the least recently used, went


def test_peek_oldest_of_an_empty_lru_is_none() -> None:
    lru: BoundedLru[str, int] = BoundedLru(2)
    assert lru.peek_oldest() is None and lru.get("a") is None and lru.peek("a") is None


def test_bounded_by_weight() -> None:
    lru = _filled(BoundedLru(100, max_weight=25), "a", "b", weight=10)
    lru.put("c", 2, 10)
    assert lru.items() == [("b", 1), ("c", 2)] and lru.weight == 20 and lru.evictions == 1
    lru.put("d", 3, 25)  # everything else goes to make room
    assert lru.items() == [("d", 3)] and lru.weight == 25 and lru.evictions == 3


def test_both_bounds_apply() -> None:
    lru = _filled(BoundedLru(2, max_weight=100), "a", "b", "c", weight=1)
    assert len(lru) == 2 and lru.weight == 2
    lru.put("heavy", 9, 100)  # b goes for the count, c for the weight
    assert lru.items() == [("heavy", 9)] and lru.weight == 100 and lru.evictions == 3


def test_replacing_an_entry_adjusts_the_weight_and_recency() -> None:
    lru = _filled(BoundedLru(10, max_weight=100), "a", "b", weight=10)
    lru.put("a", 7, 30)
    assert lru.items() == [("b", 1), ("a", 7)] and lru.weight == 40 and lru.evictions == 0
    lru.put("a", 8, 5)
    assert lru.weight == 15 and len(lru) == 2


def test_an_entry_heavier_than_the_bound_is_not_kept_and_evicts_nothing() -> None:
    lru = _filled(BoundedLru(10, max_weight=50), "a", "b", weight=20)
    lru.put("big", 9, 51)
    assert lru.peek("big") is None and lru.items() == [("a", 0), ("b", 1)] and lru.weight == 40
    lru.put("a", 9, 51)  # a replacement too heavy drops the old value: it is no longer current
    assert lru.items() == [("b", 1)] and lru.weight == 20 and lru.evictions == 0


def test_zero_or_negative_capacity_keeps_nothing() -> None:
    for capacity in (0, -1):
        lru = _filled(BoundedLru(capacity), "a", "b")
        assert len(lru) == 0 and lru.get("a") is None and lru.evictions == 2
    zero_weight = _filled(BoundedLru(10, max_weight=0), "a", weight=1)
    assert len(zero_weight) == 0 and zero_weight.weight == 0


def test_lowered_bounds_apply_from_the_next_put() -> None:
    lru = _filled(BoundedLru(10), "a", "b", "c")
    lru.max_entries = 1
    assert len(lru) == 3
    lru.put("d", 3)
    assert lru.items() == [("d", 3)] and lru.evictions == 3


def test_pop_removes_without_counting_an_eviction() -> None:
    evicted: list[tuple[str, int]] = []
    lru = _filled(BoundedLru(10, max_weight=100, on_evict=lambda k, v: evicted.append((k, v))), "a", "b", weight=10)
    assert lru.pop("a") == 0 and lru.pop("a") is None
    assert lru.items() == [("b", 1)] and lru.weight == 10 and lru.evictions == 0 and evicted == []


def test_on_evict_sees_each_evicted_entry_least_recent_first() -> None:
    evicted: list[tuple[str, int]] = []
    lru = _filled(BoundedLru(3, max_weight=30, on_evict=lambda k, v: evicted.append((k, v))), "a", "b", "c", weight=10)
    lru.put("b", 9, 10)  # replaced: not an eviction
    lru.put("d", 3, 25)
    assert evicted == [("a", 0), ("c", 2), ("b", 9)] and lru.evictions == 3 and lru.items() == [("d", 3)]


def test_on_evict_may_use_the_lru() -> None:
    """The callback runs after the lock is released, so it may read the cache."""
    seen: list[tuple[str, int]] = []
    lru: BoundedLru[str, int] = BoundedLru(1, on_evict=lambda key, _value: seen.append((key, len(lru))))
    _filled(lru, "a", "b")
    assert seen == [("a", 1)]


def test_snapshots_do_not_follow_later_changes() -> None:
    lru = _filled(BoundedLru(3), "a", "b")
    values, items = lru.values(), lru.items()
    lru.put("c", 2)
    lru.pop("a")
    assert values == [0, 1] and items == [("a", 0), ("b", 1)]


def test_concurrent_use_keeps_the_bounds_and_the_weight() -> None:
    evicted: list[str] = []
    lock = threading.Lock()

    def on_evict(key: str, value: int) -> None:
        with lock:
            evicted.append(key)

    lru: BoundedLru[str, int] = BoundedLru(50, max_weight=400, on_evict=on_evict)
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        start.wait()
        for i in range(2_000):
            key = f"{worker}-{i % 120}"
            lru.put(key, i, 1 + i % 13)
            lru.get(f"{(worker + 1) % 8}-{i % 120}")
            if i % 7 == 0:
                lru.pop(f"{(worker + 3) % 8}-{i % 120}")
            lru.peek_oldest()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    items = lru.items()
    assert 0 < len(items) <= 50 and len(items) == len(lru)
    assert lru.weight == sum(1 + v % 13 for _, v in items) <= 400
    assert lru.evictions == len(evicted) > 0


def test_lru_put_can_keep_an_entrys_place() -> None:
    lru: BoundedLru[str, int] = BoundedLru(2, max_weight=10)
    lru.put("a", 1, 3)
    lru.put("b", 2, 3)
    lru.put("a", 10, 4, keep_place=True)
    assert lru.items() == [("a", 10), ("b", 2)] and lru.weight == 7
    lru.put("c", 3, 3)  # "a" is still the least recently used: evicted
    assert lru.items() == [("b", 2), ("c", 3)]
    lru.put("b", 20, 11, keep_place=True)  # heavier than the whole budget: dropped
    assert lru.items() == [("c", 3)] and lru.weight == 3
    lru.put("d", 4, keep_place=True)  # not held: stored as the most recently used
    assert lru.items() == [("c", 3), ("d", 4)]


class _Held:
    """A cached value the collector tracks (a decoded belief, a cache entry)."""


def test_a_frozen_lru_is_not_walked_again_by_the_next_collection() -> None:
    """The API freezes what survives each paced collection (service/process.py), so the next one
    walks only what was kept since. An LRU of many weighted entries under tuple keys, frozen,
    then given one more entry, must add only that entry to what the collector walks: no
    structure of its own that lists every entry comes back (a dict holding only ints under
    tuple keys once did, untracked by one collection and tracked again by the next put)."""
    lru: BoundedLru[tuple[str, bytes], _Held] = BoundedLru(10_000, max_weight=10**9)
    for i in range(2_000):
        lru.put(("t1", i.to_bytes(4, "big")), _Held(), weight=100)
    gc.collect()
    gc.freeze()
    try:
        lru.put(("t1", (2_000).to_bytes(4, "big")), _Held(), weight=100)  # a key made at run time
        walked_next = gc.get_objects()
        largest = max(len(gc.get_referents(o)) for o in walked_next if o is not walked_next)
        assert largest < 100, f"an object holding {largest} references is walked again"
    finally:
        gc.unfreeze()
    assert len(lru) == 2_001 and lru.weight == 200_100
