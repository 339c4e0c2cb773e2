"""The API side of the task queue: a broker-only Celery client that enqueues by task name.

``service`` never imports ``workers``; both share the task-name and queue constants defined here.
Every send carries ``expires`` and goes to an explicit queue; arguments are ids plus the tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis
from celery import Celery

from service import redis_keys
from service.config import Settings

log = logging.getLogger("tenure.queue")

# KEYS[1] the waiting marker, ARGV[1] the server's run id, ARGV[2] its TTL: 0 when a marker of this
# server run holds it (the message waits), else (absent, or left by an earlier run) set it and 1
_CLAIM_UNLESS_CURRENT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""

TASK_EXTRACT = "beliefs.extract"
TASK_ENRICH_ALIASES = "aliases.enrich"
TASK_COMPACT_BUCKET = "beliefs.compact"
TASK_PLAN_COMPACTION = "beliefs.compact_plan"
TASK_SWEEP_TURNS = "turns.sweep"
TASK_DRAIN_RECEIPTS = "audit.drain_receipts"
TASK_DRAIN_PARKED_TURNS = "turns.drain_parked"
TASK_MERGE_SEGMENTS = "beliefs.merge_segments"
TASK_APPLY_RETENTION = "retention.apply"
TASK_SWEEP_CHANGE_LOGS = "beliefs.sweep_change_logs"
TASK_PREBUILD_VOCABULARY = "vocabulary.prebuild"

# A prebuild is sent this long after the API's write, so that a burst of writes (an import's
# chunks, a console edit session) is built once, at the version it ends with.
PREBUILD_DELAY_S = 0.5
# How long a prebuild's waiting marker may outlive a lost message: that long without prebuilds
# for the tenant (its next recall then builds, as without them).
PREBUILD_MARKER_TTL_S = 60


def queue_names(settings: Settings) -> tuple[str, str]:
    """(cheap, heavy) queue names; the prefix lets deployments (and test runs) share a broker."""
    prefix = settings.celery.queue_prefix
    return f"{prefix}.cheap", f"{prefix}.heavy"


def extraction_task_id(tenant_id: str, turn_id: str) -> str:
    """The one Celery task id of a turn's extraction: every send of it (the API, parked turns,
    the sweep) carries this id, so its waiting marker can be found from the turn alone."""
    return f"{TASK_EXTRACT}:{tenant_id}:{turn_id}"


def _prebuild_task_id(tenant_id: str) -> str:
    return f"{TASK_PREBUILD_VOCABULARY}:{tenant_id}"


def broker_client(settings: Settings) -> Celery:
    app = Celery("tenure-client", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        broker_transport_options={"visibility_timeout": settings.celery.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
    )
    return app


class TaskQueue:
    """Enqueue memory-loop work. Call only after the data the task reads is durably written."""

    def __init__(self, settings: Settings, app: Celery | None = None):
        self.settings = settings
        self.app = app or broker_client(settings)
        self.cheap, self.heavy = queue_names(settings)
        self._broker: redis.Redis[bytes] | None = None

    def _send(
        self, name: str, args: list[Any], queue: str, countdown: float | None = None, task_id: str | None = None
    ) -> None:
        self.app.send_task(
            name,
            args=args,
            queue=queue,
            expires=self.settings.celery.task_expires_s,
            countdown=countdown,
            task_id=task_id,
        )

    # ------------------------------------------------------------ extraction and its marker
    # A turn's extraction message is marked as waiting in Redis (``redis_keys.queued_task``, in the
    # broker's Redis, so a broker that loses its messages loses the markers with them) from the
    # send until a worker takes it (``taken``). The sweep sends a stale turn again only when it
    # can SET NX that marker: a turn waiting behind a backlog (after a worker or Redis outage) is
    # not sent again at every sweep (the fault drills measured 188 duplicates of 329), while a
    # message a worker took and lost with its process is. The marker expires with the message
    # (``task_expires_s``). Not a Redis broker: no marker, every stale turn is sent again.
    # The marker holds the run id of the Redis server that stored it: a Redis killed and restarted
    # from its AOF (``appendfsync everysec``) can come back with the marker but without the message
    # written after it (or with a message a worker had popped), so a marker from an earlier server
    # run proves nothing and the sweep sends the turn again (once per restart; extraction is
    # idempotent). A marker of the current run was written by this server together with its message.

    def extract(self, tenant_id: str, turn_id: str) -> None:
        """Enqueue a turn's extraction (after the turn is durably written), marked as waiting."""
        task_id = extraction_task_id(tenant_id, turn_id)
        self._mark_waiting(task_id, only_if_absent=False)
        self._send_extraction(tenant_id, turn_id, task_id)

    def extract_unless_waiting(self, tenant_id: str, turn_id: str) -> bool:
        """The sweep's send: enqueue unless this turn's message still waits in the queue (SET NX
        on its marker). True when it was sent."""
        task_id = extraction_task_id(tenant_id, turn_id)
        if not self._mark_waiting(task_id, only_if_absent=True):
            return False
        self._send_extraction(tenant_id, turn_id, task_id)
        return True

    def extraction_queue_drained(self) -> bool:
        """True when no message waits in the extraction queue. Then a stale turn's waiting marker
        cannot be a message behind a backlog: it is one a worker popped and lost (prefetched by a
        worker that was killed or wedged, or unacknowledged in it), so the sweep sends the turn
        again whatever its marker says (a message a live worker is just starting makes a no-op
        duplicate; extraction is idempotent). Not a Redis broker: markers are not used anyway."""
        broker = self._marker_store()
        return broker is None or int(broker.llen(self.heavy)) == 0

    def taken(self, tenant_id: str, turn_id: str) -> None:
        """A worker took the turn's message: it no longer waits. From here a crash is the
        sweep's to recover (the turn goes stale and nothing marks it as waiting)."""
        self._clear(self._marker_store(), self._marker(extraction_task_id(tenant_id, turn_id)))

    def _send_extraction(self, tenant_id: str, turn_id: str, task_id: str) -> None:
        try:
            self._send(TASK_EXTRACT, [tenant_id, turn_id], self.heavy, task_id=task_id)
        except Exception:
            self.taken(tenant_id, turn_id)  # not sent: nothing waits
            raise

    def _marker(self, task_id: str) -> str:
        return redis_keys.queued_task(self.settings.opensearch_namespace, task_id)

    def _mark_waiting(self, task_id: str, *, only_if_absent: bool) -> bool:
        """Set the marker to the current server run; with ``only_if_absent`` only when no marker of
        this run is there (one atomic script: absent or from an earlier run -> set, True)."""
        broker = self._marker_store()
        if broker is None:
            return True
        ttl = self.settings.celery.task_expires_s
        run_id = str(broker.info("server")["run_id"])
        marker = self._marker(task_id)
        if not only_if_absent:
            return bool(broker.set(marker, run_id, ex=ttl))
        claim = broker.register_script(_CLAIM_UNLESS_CURRENT)
        return bool(claim(keys=[marker], args=[run_id, ttl]))

    def _marker_store(self) -> redis.Redis[bytes] | None:
        if not self.settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
            return None
        if self._broker is None:
            self._broker = redis.Redis.from_url(self.settings.broker_url, socket_timeout=10, socket_connect_timeout=2)
        return self._broker

    # ------------------------------------------------------------ vocabulary prebuilds

    def prebuild_vocabularies(self, tenant_ids: Sequence[str]) -> None:
        """After a belief write through the API: ask a worker to build the tenants' recall
        vocabularies at their new version (service/recall/prebuild.py). At most one message waits
        per tenant (SET NX on its marker, which the task clears before it reads the version, so
        a write after that sends a new one; a broker other than Redis has no marker, and every
        write sends one). Never raises: the write stands, and without a prebuild the tenant's next
        recall builds."""
        for tenant_id in tenant_ids:
            marker = self._marker(_prebuild_task_id(tenant_id))
            broker = None
            try:
                broker = self._marker_store()
                if broker is not None and not broker.set(marker, b"1", nx=True, ex=PREBUILD_MARKER_TTL_S):
                    continue  # one waits, and it reads the version after this write
                self._send(TASK_PREBUILD_VOCABULARY, [tenant_id], self.cheap, countdown=PREBUILD_DELAY_S)
            except Exception as exc:  # the broker is down: an optimisation is lost, not the write
                log.warning("vocabulary prebuild of %s not requested: %s", tenant_id, exc)
                self._clear(broker, marker)

    def prebuild_taken(self, tenant_id: str) -> None:
        """A worker took a tenant's prebuild: a write from now on requests another."""
        self._clear(self._marker_store(), self._marker(_prebuild_task_id(tenant_id)))

    @staticmethod
    def _clear(broker: redis.Redis[bytes] | None, marker: str) -> None:
        if broker is None:
            return
        try:
            broker.delete(marker)
        except redis.RedisError as exc:
            # best effort: a marker left behind expires (the extraction's: a re-send by the sweep
            # waits until then; a prebuild's: PREBUILD_MARKER_TTL_S without prebuilds at most)
            log.warning("waiting marker %s not cleared: %s", marker, exc)

    def enrich_aliases(self, tenant_id: str, turn_id: str) -> None:
        self._send(TASK_ENRICH_ALIASES, [tenant_id, turn_id], self.cheap)

    def compact_bucket(
        self,
        tenant_id: str,
        owner_id: str,
        scope: str,
        type_: str,
        subtype: str | None,
        force: bool,
    ) -> None:
        self._send(TASK_COMPACT_BUCKET, [tenant_id, owner_id, scope, type_, subtype, force], self.heavy)

    def plan_compaction(self, tenant_id: str | None, force: bool) -> None:
        self._send(TASK_PLAN_COMPACTION, [tenant_id, force], self.heavy)

    def drain_receipts(self) -> None:
        """Beat runs this every ``api.receipt_drain_interval_s``; also sendable by hand."""
        self._send(TASK_DRAIN_RECEIPTS, [], self.cheap)

    def drain_parked_turns(self) -> None:
        self._send(TASK_DRAIN_PARKED_TURNS, [], self.cheap)

    def close(self) -> None:
        self.app.close()
        if self._broker is not None:
            self._broker.close()
