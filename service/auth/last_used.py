"""``last_used_at`` of API keys, recorded in batches off the request path.

Each process asks at most once per ``last_used_interval_s`` per key (the authenticator's in-process
deadline). The asks of one ``last_used_flush_s`` window are then recorded together on one
background thread: one Redis pipeline of ``SET NX`` gates elects, per key, the one process that
writes this interval, and one bulk request writes the elected keys' times. Before, each ask cost
its own Redis round trip and its own fsynced update, on a thread that shares the API process's
interpreter with its event loop: with many distinct keys (every request a new user) that was ~14 %
of an API worker's CPU (py-spy, docs/benchmarks.md, issue 16).

It is bookkeeping: a failure is logged and never fails a request, and what is pending when the
process stops may be lost (the next use records it again).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

import redis

from service import redis_keys
from service.errors import StoreUnavailable
from service.storage.accounts import AccountStore

log = logging.getLogger(__name__)


class LastUsedRecorder:
    def __init__(
        self,
        redis_client: redis.Redis[bytes],
        accounts: AccountStore,
        namespace: str,
        *,
        interval_s: int,
        flush_s: float,
    ):
        self.redis = redis_client
        self.accounts = accounts
        self.namespace = namespace
        self.interval_s = interval_s
        self.flush_s = flush_s
        self._pending: dict[str, datetime] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def note(self, key_id: str, when: datetime) -> None:
        """Ask for the key's ``last_used_at`` (returns at once; recorded with the window's others)."""
        with self._lock:
            self._pending[key_id] = when
            if self._thread is None:
                # started on first use: processes that never see an API key run no thread
                self._thread = threading.Thread(target=self._run, name="tenure-last-used", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            # let the window's other asks join this batch
            time.sleep(self.flush_s)
            with self._lock:
                batch, self._pending = self._pending, {}
            if batch:
                try:
                    self.record(batch)
                except Exception:  # noqa: BLE001 - the thread must outlive any one failed batch
                    log.exception("could not record API key use for %d keys", len(batch))

    def record(self, batch: dict[str, datetime]) -> list[str]:
        """Write the keys this process is elected for (the others were written this interval by
        another process); returns them."""
        keys = sorted(batch)
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for key_id in keys:
                    pipe.set(redis_keys.key_used(self.namespace, key_id), "1", nx=True, ex=self.interval_s)
                elected = [key_id for key_id, won in zip(keys, pipe.execute(), strict=True) if won]
        except redis.RedisError as exc:
            log.warning("could not record API key use for %d keys: %s", len(keys), exc)
            return []
        if not elected:
            return []
        try:
            self.accounts.touch_keys({key_id: batch[key_id] for key_id in elected})
        except StoreUnavailable as exc:
            # Last-used is bookkeeping: never fail an authenticated request over it.
            log.warning("could not record API key use for %d keys: %s", len(elected), exc.message)
        return elected
