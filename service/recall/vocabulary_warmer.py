"""Tenant vocabularies (and the filter tiers of recent callers) refreshed in the API process when a
write's vocabulary is stored, before the tenant's next recall asks for them.

In a session, each turn's extraction writes the tenant's beliefs; a worker then builds the
vocabulary at the new write version and stores it in Redis (:mod:`service.recall.prebuild`,
:mod:`service.recall.shared_vocabulary`), and the next recall in each API process restores it: a
Redis read, a decompression and the pre-filters of the field groups the message reaches, ~2 ms of
the ~7.5 ms the first recall after a write paid over a steady-state one at 1M (docs/benchmarks.md,
issue 16). Meanwhile the user reads the answer and types for seconds.

Here each API process listens to the announcements the store makes with each entry (a pub/sub
channel, :func:`service.redis_keys.shared_vocabulary_stored`) and restores the entries of the
tenants it holds at an older version (:meth:`VocabularyCache.refresh`) on a worker thread, off the
request path; the recall that follows finds the vocabulary ready. A tenant this process does not
hold (or holds idle) is left alone, so memory and work follow the tenants active here.

On the same notice the filter tiers of the tenant's recent callers in this process are searched
again at the new write version (``tiers``: :func:`service.recall.tier_cache.refresh_filter_tiers`),
so the next recall of the author of the extracted turn sends only its relevant tier.

Nothing depends on it: a notice lost (Redis restarted, the listener reconnecting, the process
busy), late or for an entry already replaced only means the next recall restores the entry itself,
as before, with the same result (the entry and its checks are the same). Several notices waiting
at once are merged per tenant, the newest version kept. Outcomes are counted in
``tenure_vocabulary_refresh_total`` and ``tenure_tier_refresh_total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio
from redis.exceptions import RedisError

from service.recall.vocabulary import VocabularyCache
from service.telemetry import metrics

log = logging.getLogger(__name__)

# Waits between reconnections after the listener lost Redis (doubling up to the last).
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# A blocking read returns this often even when nothing is announced, so the connection's health
# check runs (a Redis that vanished without closing the socket is noticed).
LISTEN_TIMEOUT_S = 30.0
HEALTH_CHECK_INTERVAL_S = 15


def parse_notice(data: object) -> tuple[str, int] | None:
    """``(tenant, version)`` from a notice's payload (``[tenant, version]`` as JSON); None for
    anything else (the channel is shared by every process of the deployment: a malformed
    message is skipped, never fatal)."""
    if not isinstance(data, bytes | str):
        return None
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, list) or len(parsed) != 2:
        return None
    tenant, version = parsed
    if not isinstance(tenant, str) or not tenant or type(version) is not int or version < 0:
        return None
    return tenant, version


def merged(notices: list[tuple[str, int]]) -> dict[str, int]:
    """The newest announced version per tenant (an older entry is already replaced in Redis)."""
    newest: dict[str, int] = {}
    for tenant, version in notices:
        newest[tenant] = max(version, newest.get(tenant, version))
    return newest


class VocabularyWarmer:
    """Listens on ``channel`` and refreshes ``cache`` (see the module docstring). :meth:`run` is
    the API process's background task; :meth:`refresh_all` is one batch of notices."""

    def __init__(
        self,
        cache: VocabularyCache,
        redis_url: str,
        channel: str,
        *,
        tiers: Callable[[str], int] | None = None,
    ):
        """``tiers``: called with each announced tenant after its vocabulary (a write stored a new
        entry): the filter tiers of its recent recalls searched again
        (:func:`service.recall.tier_cache.refresh_filter_tiers`), returning how many."""
        self.cache = cache
        self.tiers = tiers
        self.redis_url = redis_url
        self.channel = channel
        self.listening = asyncio.Event()  # set while subscribed (tests wait for it)
        self.subscriptions = 0  # how many times it subscribed (a reconnection resets the wait)

    async def run(self) -> None:
        """Listen until cancelled, subscribing again after a lost connection (or a bug: nothing
        may end the listening for the process's lifetime), after a wait that doubles while
        subscribing keeps failing."""
        wait = RETRY_FIRST_S
        while True:
            subscribed = self.subscriptions
            try:
                await self._listen()
            except Exception as exc:
                unexpected = not isinstance(exc, RedisError | OSError)
                log.warning("vocabulary notices not received (%r); listening again", exc, exc_info=unexpected)
            wait = RETRY_FIRST_S if self.subscriptions > subscribed else min(RETRY_MAX_S, wait * 2)
            await asyncio.sleep(wait)

    async def _listen(self) -> None:
        # its own connection: a subscribed connection answers nothing else, and its reads block
        client: Any = redis.asyncio.Redis.from_url(
            self.redis_url, socket_connect_timeout=2, health_check_interval=HEALTH_CHECK_INTERVAL_S
        )
        try:
            async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(self.channel)
                self.subscriptions += 1
                self.listening.set()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_TIMEOUT_S)
                    if message is None:
                        continue
                    batch = [message]
                    while (more := await pubsub.get_message(ignore_subscribe_messages=True, timeout=0)) is not None:
                        batch.append(more)
                    notices = [n for m in batch if (n := parse_notice(m.get("data"))) is not None]
                    await asyncio.to_thread(self.refresh_all, merged(notices))
        finally:
            self.listening.clear()
            await client.aclose()

    def refresh_all(self, newest: dict[str, int]) -> None:
        """Refresh each tenant at its announced version; never raises (an optimisation only)."""
        for tenant, version in newest.items():
            outcome: str
            try:
                outcome = self.cache.refresh(tenant, version)
            except Exception:
                log.warning("vocabulary of %s not refreshed; its next recall restores it", tenant, exc_info=True)
                outcome = "failed"
            metrics.VOCABULARY_REFRESH.labels(outcome).inc()
            if self.tiers is not None:
                self._refresh_tiers(tenant, self.tiers)

    @staticmethod
    def _refresh_tiers(tenant: str, tiers: Callable[[str], int]) -> None:
        try:
            searched = tiers(tenant)
        except Exception:
            log.warning("filter tiers of %s not refreshed; its next recall searches them", tenant, exc_info=True)
            metrics.TIER_REFRESH.labels("failed").inc()
            return
        metrics.TIER_REFRESH.labels("searched" if searched else "none").inc(max(1, searched))
