"""One shared, immutable-by-convention value per key, for values many live objects would otherwise
each hold a copy of.

What a recall keeps (decoded beliefs, the relevant tier's hits) is walked once by each API worker's
paced full collection before it is frozen (:mod:`service.process`), so a per-object copy of the same
small structure (a fields set, a tuple of clause names) costs that walk for nothing. A
:class:`SharedValues` hands every caller asking with the same key the same value. It keeps at most
``max_keys`` keys (in case keys ever vary without bound); beyond them, each call gets a value of
its own. The values must never be changed in place by those that hold them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SharedValues(Generic[K, V]):
    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._values: dict[K, V] = {}

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The value shared under ``key``, made by ``make(key)`` the first time."""
        value = self._values.get(key)
        if value is None:
            value = make(key)
            if len(self._values) < self.max_keys:
                value = self._values.setdefault(key, value)  # a racing thread's value wins alike
        return value
