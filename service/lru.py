"""One bounded, thread-safe LRU for the process's in-memory caches.

The credential caches (:mod:`service.auth.authenticator`, :mod:`service.auth.guard`), the tier,
analysis and vocabulary caches of recall (:mod:`service.recall.versioned_cache`,
:mod:`service.recall.vocabulary`) and the decode cache of stored beliefs
(:mod:`service.storage.unreadable`) all keep their entries in a :class:`BoundedLru`; what makes an
entry valid (versions, ages, expiry) stays with each cache.

Bounds: at most ``max_entries`` entries (0 or less: nothing is kept) and, optionally, a total
``max_weight`` of the weights given at :meth:`BoundedLru.put` (estimated bytes). A put evicts the
least recently used entries until both bounds hold; an entry heavier than ``max_weight`` on its own
is never kept (and evicts nothing). Bounds may be changed at any time; they apply from the next put.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar, cast

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
B = TypeVar("B")


class BoundedLru(Generic[K, V]):
    """A thread-safe LRU (one lock) bounded by count and, optionally, by total weight.

    ``evictions`` counts the entries a put pushed out (not those replaced or popped);
    ``on_evict(key, value)`` is called for each of them, least recent first, after the lock is
    released, so a caller can keep side indexes in step. A stored ``None`` reads as absent."""

    def __init__(
        self,
        max_entries: int,
        *,
        max_weight: int | None = None,
        on_evict: Callable[[K, V], None] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_weight = max_weight
        self.evictions = 0
        self._on_evict = on_evict
        # Each value with its weight. A plain dict of the weights apart held only ints under key
        # tuples, which a collection untracks; CPython then untracked the whole dict, tracked it
        # again at the next put, and every paced collection walked all of it (docs/benchmarks.md,
        # "Paced collections, again"). An OrderedDict is always tracked: frozen once, it stays.
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def weight(self) -> int:
        """The total weight of the entries held (within ``max_weight``)."""
        return self._weight

    def get(self, key: K) -> V | None:
        """The value of ``key``, now the most recently used; None if absent."""
        with self._lock:
            held = self._entries.get(key)
            if held is None or held[0] is None:
                return None
            self._entries.move_to_end(key)
            return held[0]

    def peek(self, key: K) -> V | None:
        """The value of ``key`` without using it (its recency is unchanged); None if absent."""
        with self._lock:
            held = self._entries.get(key)
            return None if held is None else held[0]

    def peek_oldest(self) -> tuple[K, V] | None:
        """The least recently used entry, left where it is; None when empty."""
        with self._lock:
            for key, (value, _weight) in self._entries.items():
                return key, value
            return None

    def put(self, key: K, value: V, weight: int = 0, *, keep_place: bool = False) -> None:
        """Store ``value`` (replacing any under ``key``) as the most recently used, then evict the
        least recently used until both bounds hold. Heavier than ``max_weight``: ``key`` is
        dropped and nothing else changes. ``keep_place``: a value replacing one under ``key``
        keeps that one's recency (a refresh that is not a use)."""
        with self._lock:
            held = self._entries.get(key)
            if held is not None:
                self._weight -= held[1]
                if not keep_place:  # stored again below, as the most recent
                    del self._entries[key]  # (an OrderedDict assignment keeps the place)
            if self.max_weight is not None and weight > self.max_weight:
                self._entries.pop(key, None)
                return
            self._entries[key] = (value, weight)
            self._weight += weight
            evicted = self._evict()
        self._notify(evicted)

    def pop(self, key: K) -> V | None:
        """Remove ``key`` (not an eviction); its value, or None if absent."""
        with self._lock:
            return self._remove(key)

    def values(self) -> list[V]:
        """A snapshot of the values, least recently used first."""
        with self._lock:
            return [value for value, _weight in self._entries.values()]

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the entries, least recently used first."""
        with self._lock:
            return [(key, value) for key, (value, _weight) in self._entries.items()]

    def _remove(self, key: K) -> V | None:
        held = self._entries.pop(key, None)
        if held is None:
            return None
        self._weight -= held[1]
        return held[0]

    def _over(self) -> bool:
        if len(self._entries) > self.max_entries:
            return True
        return self.max_weight is not None and self._weight > self.max_weight

    def _evict(self) -> list[tuple[K, V]]:
        evicted: list[tuple[K, V]] = []
        while self._entries and self._over():
            key, (value, weight) = self._entries.popitem(last=False)
            self._weight -= weight
            evicted.append((key, value))
        self.evictions += len(evicted)
        return evicted

    def _notify(self, evicted: list[tuple[K, V]]) -> None:
        if self._on_evict is not None:
            for key, value in evicted:
                self._on_evict(key, value)


class LruBound(Generic[B]):
    """A cache's settable attribute that is one bound (``max_entries``, ``max_weight``) of the
    :class:`BoundedLru` it keeps in ``_entries``: ``max_entries = LruBound[int]("max_entries")``."""

    def __init__(self, bound: str) -> None:
        self.bound = bound

    def __get__(self, cache: Any, owner: Any = None) -> B:
        return cast(B, getattr(cache._entries, self.bound))

    def __set__(self, cache: Any, value: B) -> None:
        setattr(cache._entries, self.bound, value)
