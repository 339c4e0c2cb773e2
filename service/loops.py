"""Async clients belong to the event loop that created them.

The API's lifespan creates an ``AsyncOpenSearch`` and a ``redis.asyncio`` client on the server's
event loop; their connections cannot be used from another loop. :class:`LoopBound` keeps a client
with its loop and hands it out only on that loop, so a caller elsewhere (a test or tool driving the
ASGI app from its own ``asyncio.run``) takes the synchronous path on a worker thread instead of
failing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass(frozen=True)
class LoopBound(Generic[C]):
    client: C
    loop: asyncio.AbstractEventLoop

    @classmethod
    def here(cls, client: C) -> LoopBound[C]:
        """``client`` bound to the running loop (call it where the client was created)."""
        return cls(client, asyncio.get_running_loop())

    def get(self) -> C | None:
        """The client when called on its own loop, else None."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self.client if running is self.loop else None


def on_loop(bound: LoopBound[C] | None) -> C | None:
    """The client of ``bound`` usable here, or None (no client, or another loop)."""
    return bound.get() if bound is not None else None
