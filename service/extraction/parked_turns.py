"""Proxy turns parked in Redis while OpenSearch is down (``service/outbox.py``).

The proxy answers first and records the turn after (non-streaming) or just before its final chunk
(streaming). If OpenSearch cannot take the turn at that moment, the answer has still gone out:
its memory (the sidecar) must not be lost with it. The turn is parked in a Redis outbox instead,
and the ``turns.drain_parked`` beat task stores it and enqueues its extraction once OpenSearch is
back. Storing is idempotent (``op_type=create`` on the turn id; a 409 means an earlier drain
stored it), and the extraction is too, so a drain that dies half-way and runs again applies
nothing twice. Only when Redis is unreachable as well is the turn lost, which is reported to the
client (``extraction: not_recorded``).
"""

from __future__ import annotations

import contextlib

import anyio.to_thread
import redis

from service import redis_keys
from service.config import Settings
from service.errors import Conflict, ValidationFailed
from service.extraction.queue import TaskQueue
from service.lean_redis import EventLoopRedis
from service.loops import LoopBound
from service.outbox import RedisOutbox
from service.storage.turns import TurnRecord, TurnStore

# Parked turns carry whole messages (up to loop.max_turn_message_chars each): a modest cap.
MAX_PARKED_TURNS = 50_000


class ParkedTurns:
    def __init__(
        self,
        rds: redis.Redis[bytes],
        turns: TurnStore,
        queue: TaskQueue,
        settings: Settings,
        async_redis: LoopBound[EventLoopRedis] | None = None,
    ):
        self.turns = turns
        self.queue = queue
        key = redis_keys.parked_turns(settings.opensearch_namespace)
        self.outbox = RedisOutbox(rds, key, TurnRecord, max_pending=MAX_PARKED_TURNS, async_redis=async_redis)

    def park(self, turn: TurnRecord) -> bool:
        """True when the turn is safe in Redis; False when Redis cannot take it either."""
        try:
            return self.outbox.put(turn)
        except redis.RedisError:
            return False

    def hold(self, turn: TurnRecord) -> str | None:
        """Keep a turn in Redis before its answer goes out (the proxy stores it just after): a
        process killed in between leaves it to the next drain. The entry's id, or None when
        Redis cannot take it."""
        try:
            return self.outbox.hold(turn)
        except redis.RedisError:
            return None

    async def ahold(self, turn: TurnRecord) -> str | None:
        """:meth:`hold` from the event loop: awaited on its asynchronous client when it has one,
        else on a worker thread."""
        if not self.outbox.has_async:
            return await anyio.to_thread.run_sync(self.hold, turn)
        try:
            return await self.outbox.ahold(turn)
        except redis.RedisError:
            return None

    def release(self, entry_id: str) -> None:
        """The held turn is stored: drop its entry (a failure leaves it to the drain, harmlessly)."""
        with contextlib.suppress(redis.RedisError):
            self.outbox.release(entry_id)

    def drain(self) -> int:
        return self.outbox.drain(self._store_and_enqueue, batch=100)

    def _store_and_enqueue(self, turns: list[TurnRecord]) -> None:
        for turn in turns:
            try:
                self.turns.create(turn)
            except Conflict:
                pass  # stored by an earlier drain that died before deleting its batch
            except ValidationFailed as exc:  # refused for good: retrying cannot help
                self.outbox.set_aside(turn, exc.message)
                continue
            if turn.extraction_status == "pending":
                self.queue.extract(turn.tenant_id, turn.turn_id)
