"""The API side of the task queue: a broker-only Celery client that enqueues by task name.

``service`` never imports ``workers``; both share the task-name and queue constants defined here.
Every send carries ``expires`` and goes to an explicit queue; arguments are ids plus the tenant.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import redis
from celery import Celery

from service.config import Settings

TASK_EXTRACT = "beliefs.extract"
TASK_ENRICH_ALIASES = "aliases.enrich"
TASK_COMPACT_BUCKET = "beliefs.compact"
TASK_PLAN_COMPACTION = "beliefs.compact_plan"
TASK_SWEEP_TURNS = "turns.sweep"
TASK_DRAIN_RECEIPTS = "audit.drain_receipts"
TASK_DRAIN_PARKED_TURNS = "turns.drain_parked"
TASK_MERGE_SEGMENTS = "beliefs.merge_segments"
TASK_APPLY_RETENTION = "retention.apply"


def queue_names(settings: Settings) -> tuple[str, str]:
    """(cheap, heavy) queue names; the prefix lets deployments (and test runs) share a broker."""
    prefix = settings.celery.queue_prefix
    return f"{prefix}.cheap", f"{prefix}.heavy"


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

    def _send(self, name: str, args: list[Any], queue: str, countdown: float | None = None) -> None:
        self.app.send_task(
            name,
            args=args,
            queue=queue,
            expires=self.settings.celery.task_expires_s,
            countdown=countdown,
        )

    def extract(self, tenant_id: str, turn_id: str) -> None:
        self._send(TASK_EXTRACT, [tenant_id, turn_id], self.heavy)

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

    def waiting_extractions(self, *, limit: int = 50_000) -> set[tuple[str, str]]:
        """``(tenant_id, turn_id)`` of the extraction messages still waiting in the heavy queue.

        The sweep asks before re-enqueueing a stale turn: a turn waiting behind a backlog (after
        a worker or Redis outage) is not lost, and re-sending it at every sweep only lengthened
        the backlog with no-op deliveries (the fault drills measured 188 of 329). Read from the
        broker as Celery's Redis transport keeps a queue: a list of JSON envelopes whose body
        (base64 JSON) holds the arguments. Messages a worker has taken are not in the list (in
        flight, or lost with a dead worker), and neither is anything past ``limit``: those turns
        are re-enqueued as before. Any other broker: nothing is known to be waiting."""
        if not self.settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
            return set()
        if self._broker is None:
            self._broker = redis.Redis.from_url(self.settings.broker_url, socket_timeout=10)
        waiting: set[tuple[str, str]] = set()
        for raw in self._broker.lrange(self.heavy, 0, limit - 1):
            key = _extraction_key(raw)
            if key is not None:
                waiting.add(key)
        return waiting

    def drain_parked_turns(self) -> None:
        self._send(TASK_DRAIN_PARKED_TURNS, [], self.cheap)

    def close(self) -> None:
        self.app.close()
        if self._broker is not None:
            self._broker.close()


def _extraction_key(raw: bytes) -> tuple[str, str] | None:
    """The ``(tenant_id, turn_id)`` of one queued ``beliefs.extract`` envelope; None otherwise."""
    try:
        envelope = json.loads(raw)
        if envelope.get("headers", {}).get("task") != TASK_EXTRACT:
            return None
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]), str(args[1])
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
