"""Per-process worker resources, created in the ``worker_process_init`` signal (prefork children)
or on first use inside a task (solo/threads pools): never at import and never before a fork."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import redis
from celery.signals import task_postrun, worker_init, worker_process_init, worker_process_shutdown
from opensearchpy import OpenSearch

from service.auth.revocations import CredentialRevocations, JtiRevocations
from service.beliefs.lifecycle import BeliefLifecycle
from service.config import Settings
from service.extraction.compaction import Compactor, RedisBucketLock, RedisCooldown, llm_from_settings
from service.extraction.merge import REFRESH as LOOP_REFRESH
from service.extraction.parked_turns import ParkedTurns
from service.extraction.pipeline import ExtractionPipeline
from service.extraction.queue import TaskQueue
from service.process import freeze_startup_heap
from service.recall.prebuild import VocabularyPrebuilder
from service.recall.receipts import ReceiptOutbox
from service.storage.accounts import AccountStore
from service.storage.audit import AuditStore
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client, close_client
from service.storage.reviews import ReviewStore
from service.storage.turns import TurnStore
from service.write_versions import TenantAccountsVersions, TenantWriteVersions


@dataclass
class Resources:
    settings: Settings
    client: OpenSearch
    redis: redis.Redis[bytes]
    turns: TurnStore
    pipeline: ExtractionPipeline
    compactor: Compactor
    queue: TaskQueue
    receipts: ReceiptOutbox
    parked_turns: ParkedTurns
    # builds the vocabularies of the tenants a task wrote, after the task (None: turned off)
    prebuilder: VocabularyPrebuilder | None = None

    def close(self) -> None:
        close_client(self.client)
        self.redis.close()
        self.queue.close()


_lock = threading.Lock()
_current: Resources | None = None


def build(settings: Settings) -> Resources:
    client = build_client(settings)
    ns = settings.opensearch_namespace
    rds = redis.Redis.from_url(settings.redis_url)
    versions = TenantWriteVersions(rds, ns)
    beliefs = BeliefStore(client, ns, versions)  # the API's vocabularies see these writes
    prebuilder = VocabularyPrebuilder.for_store(beliefs, settings.recall)
    if prebuilder is not None:
        versions.on_bump = prebuilder.note  # every task's belief writes, whatever the task
    reviews = ReviewStore(client, ns)
    turns = TurnStore(client, ns)
    audit_store = AuditStore(client, ns)
    # belief writes by the memory loop are visible at once: a later item of the same payload reads
    # the belief again, and the very next turn must recall it
    lifecycle = BeliefLifecycle(beliefs, audit_store, refresh=LOOP_REFRESH)
    queue = TaskQueue(settings)
    accounts = AccountStore(client, ns, TenantAccountsVersions(rds, ns))
    # the request path's own revocation check: a turn whose credential was revoked writes nothing
    jtis = JtiRevocations(rds, ns, settings.auth.jwt_issuer, settings.auth.jwt_leeway_s)
    return Resources(
        settings=settings,
        client=client,
        redis=rds,
        turns=turns,
        pipeline=ExtractionPipeline(
            lifecycle,
            turns,
            reviews,
            settings.loop,
            actor_kind="worker",
            accounts=accounts,
            revocations=CredentialRevocations(accounts, jtis),
        ),
        compactor=Compactor(
            lifecycle,
            settings.loop,
            RedisCooldown(rds, ns),
            # held past the bucket task's hard time limit: a killed run's lock outlives the run
            RedisBucketLock(rds, ns, ttl_s=settings.celery.heavy_time_limit_s + 60),
            llm_from_settings(settings),
            actor_kind="worker",
        ),
        queue=queue,
        receipts=ReceiptOutbox.from_settings(settings, rds, audit_store),
        parked_turns=ParkedTurns(rds, turns, queue, settings),
        prebuilder=prebuilder,
    )


def get(settings: Settings) -> Resources:
    global _current
    with _lock:
        if _current is None:
            _current = build(settings)
        return _current


def reset() -> None:
    global _current
    with _lock:
        if _current is not None:
            _current.close()
        _current = None


@worker_init.connect  # type: ignore[untyped-decorator]
def _on_worker_init(**_: object) -> None:
    from workers.celery_app import app

    # the main process, before it forks: children start with a frozen heap
    freeze_startup_heap(app.conf.tenure_settings.gc_thaw_interval_s, app.conf.tenure_settings.gc_young_threshold)


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _on_process_init(**_: object) -> None:
    from workers.celery_app import app

    get(app.conf.tenure_settings)
    # each prefork child, once its resources exist (service/process.py)
    settings = app.conf.tenure_settings
    freeze_startup_heap(settings.gc_thaw_interval_s, settings.gc_young_threshold, settings.gc_collect_interval_s)


@task_postrun.connect  # type: ignore[untyped-decorator]
def _on_task_postrun(**_: object) -> None:
    # after the task returned or raised (its writes stand either way) and before a late ack: the
    # vocabularies of the tenants it wrote, so their next recall restores instead of building
    res = _current
    if res is not None and res.prebuilder is not None:
        res.prebuilder.run_pending()


@worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _on_process_shutdown(**_: object) -> None:
    reset()
