"""The service's Prometheus metrics, defined once; every layer records into them.

Several processes (uvicorn ``--workers``, Celery's prefork pool) each hold their own counters.
With ``PROMETHEUS_MULTIPROC_DIR`` set (to an empty directory, fresh per start: the compose file
and the Helm chart mount a tmpfs), prometheus-client writes them to per-process files and
:func:`exposition` merges every process's values, so one scrape of any process shows the whole
container. Without it (one process) the default registry is served.

Gauges of shared state (outbox depth and age, queue lengths) are not process-local counters: they
are read from Redis at scrape time by :class:`StoreCollector`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess as prom_multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_COUNT_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 20, 30, 50, 100)

HTTP_LATENCY = Histogram(
    "tenure_http_request_duration_seconds",
    "HTTP request latency by route template, method and status",
    ["method", "route", "status"],
)
RECALL_LATENCY = Histogram(
    "tenure_recall_duration_seconds",
    "Recall: the four tiers and the injection block, from query to block",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.35, 0.5, 1.0, 2.5),
)
TIER_SIZE = Histogram(
    "tenure_recall_tier_size", "Beliefs injected per recall, by tier", ["tier"], buckets=_COUNT_BUCKETS
)
INJECTED = Histogram("tenure_recall_injected_beliefs", "Beliefs injected per recall", buckets=_COUNT_BUCKETS)
EXTRACTIONS = Counter("tenure_extraction_outcomes_total", "Turn extractions by outcome", ["outcome"])
MERGE_DECISIONS = Counter(
    "tenure_merge_decisions_total", "Merge decisions on sidecar items, by section and outcome", ["section", "outcome"]
)
RECEIPTS_WRITTEN_DIRECTLY = Counter(
    "tenure_receipts_written_directly_total",
    "Injection receipts written straight to the audit index instead of the Redis outbox, by reason "
    "(outbox_full: the drainer is down or behind; redis_unreachable): a synchronous, fsynced write "
    "on the recall path",
    ["reason"],
)
SHARED_VOCABULARY = Counter(
    "tenure_shared_vocabulary_total",
    "Tenant vocabularies shared between API processes through Redis, by outcome (loaded: used "
    "instead of a build; stored; outdated: not stored, the tenant wrote meanwhile; rejected: an "
    "entry of another version, index or format, or unreadable, rebuilt; unreachable: Redis did "
    "not answer, built without it)",
    ["outcome"],
)
VOCABULARY_PREBUILD = Counter(
    "tenure_vocabulary_prebuild_total",
    "Tenant vocabularies built by a worker after its task wrote beliefs, by outcome (built: stored "
    "for the API processes to load; fresh: the shared entry already held the version; outdated: "
    "the tenant wrote again during the build, not stored; failed: a store did not answer, the next "
    "recall builds)",
    ["outcome"],
)
QUERY_ANALYSIS = Counter(
    "tenure_recall_query_analysis_total",
    "Recall queries analysed, by where (process: in the API process by the node's own analysis "
    "code, checked against the node; node: one _mtermvectors round trip)",
    ["where"],
)
VOCABULARY_REFRESH = Counter(
    "tenure_vocabulary_refresh_total",
    "Announced tenant vocabularies an API process restored before the tenant's next recall, by "
    "outcome (restored; not_held: the tenant is not active in the process; current: that version "
    "or a newer one was held; missing: no entry at that version, the next recall restores or "
    "builds; failed: a store did not answer)",
    ["outcome"],
)
TIER_REFRESH = Counter(
    "tenure_tier_refresh_total",
    "Filter tiers searched again by an API process after a tenant write, before the next recall "
    "of the same caller (searched: one cache entry, a caller's persona or a scope list's pinned facts "
    "and open questions, all of a notice's in one request; none: a notice with no recent "
    "recall of the tenant in the process, or all already current; failed: a store did not answer)",
    ["outcome"],
)
RECALL_AHEAD = Counter(
    "tenure_recall_ahead_total",
    "Recalls started beside their rate limit's round trip (service/api/recall_ahead.py), by outcome "
    "(used: the round trip confirmed the caller and the write version; discarded: it refused the "
    "request, the tenant had written or the credential was verified again, and the recall ran again)",
    ["outcome"],
)
RATE_LIMITED = Counter(
    "tenure_rate_limit_refusals_total",
    "Requests refused with 429, by bucket (credential, tenant, failed_auth)",
    ["bucket"],
)
OPENSEARCH_ERRORS = Counter(
    "tenure_opensearch_errors_total", "OpenSearch failures by kind (unreachable or the HTTP status)", ["kind"]
)
OPENSEARCH_NODE_LATENCY = Histogram(
    "tenure_opensearch_node_request_duration_seconds",
    "OpenSearch requests by node, answered or not (one per attempt: a retry on another node is a "
    "second sample): a node that is slow rather than down (a restarted JVM warming up, recovering "
    "shards) shows here while the failure count stays flat",
    ["node"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
OPENSEARCH_NODE_FAILURES = Counter(
    "tenure_opensearch_node_failures_total",
    "Requests to one OpenSearch node that got no answer (refused, reset, timed out), by node; with "
    "several nodes the client retries them on another, so a lost node shows here before anywhere else",
    ["node"],
)
# the worker's consumer loop sets it on every turn of its heartbeat (workers/liveness.py): a worker
# alive but not consuming (broker lost for good, a wedged event loop) shows as a timestamp that
# stops advancing while the process still answers scrapes
WORKER_CONSUMER_HEARTBEAT = Gauge(
    "tenure_worker_consumer_heartbeat_timestamp_seconds",
    "Unix time of the Celery worker's last consumer-loop heartbeat",
    multiprocess_mode="max",
)
TASKS = Counter("tenure_celery_tasks_total", "Celery tasks finished, by task and state", ["task", "state"])
TASK_LATENCY = Histogram(
    "tenure_celery_task_duration_seconds",
    "Celery task run time, by task",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
# The process's in-memory caches (service/telemetry/cache_metrics.py publishes what each counted
# in plain integers: no metric call on a lookup). ``part``: what a lookup asked the cache for (the
# tier cache: filters, relevant, linked; the others: all).
CACHE_LOOKUPS = Counter(
    "tenure_cache_lookups_total",
    "Lookups in an in-memory cache of the process, by cache, part and outcome (hit, miss)",
    ["cache", "part", "outcome"],
)
CACHE_EVICTIONS = Counter(
    "tenure_cache_evictions_total",
    "Entries an in-memory cache pushed out to stay within its bounds (entries or estimated bytes), by cache",
    ["cache"],
)
CACHE_ENTRIES = Gauge(
    "tenure_cache_entries",
    "Entries held by an in-memory cache (live processes summed)",
    ["cache"],
    multiprocess_mode="livesum",
)
CACHE_BYTES = Gauge(
    "tenure_cache_estimated_bytes",
    "Estimated bytes held by an in-memory cache bounded by memory (live processes summed)",
    ["cache"],
    multiprocess_mode="livesum",
)
RETENTION_DELETED = Counter(
    "tenure_retention_deleted_total", "Documents removed by the retention sweep, by index family", ["family"]
)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def exposition(*extra: Collector) -> bytes:
    """The text format of every process's metrics plus ``extra`` collectors (read now)."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        prom_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest(REGISTRY)
    if extra:
        scraped = CollectorRegistry(auto_describe=False)
        for collector in extra:
            scraped.register(collector)
        body += generate_latest(scraped)
    return body


def observe_recall(seconds: float, tiers: dict[str, int]) -> None:
    RECALL_LATENCY.observe(seconds)
    for tier, size in tiers.items():
        TIER_SIZE.labels(tier).observe(size)
    INJECTED.observe(sum(tiers.values()))


class StoreCollector(Collector):
    """Shared state read at scrape time: the Redis outboxes (depth and age of the oldest record)
    and the Celery queues' lengths. A store that cannot answer yields ``tenure_store_up 0``."""

    def __init__(self, redis_client: Any, outboxes: dict[str, str], queues: Iterable[str]):
        self.redis = redis_client
        self.outboxes = outboxes
        self.queues = list(queues)

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("tenure_redis_up", "Redis answered the scrape's reads", labels=[])
        depth = GaugeMetricFamily("tenure_outbox_depth", "Records waiting in a Redis outbox", labels=["outbox"])
        age = GaugeMetricFamily(
            "tenure_outbox_oldest_age_seconds", "Age of the oldest record waiting in an outbox", labels=["outbox"]
        )
        queued = GaugeMetricFamily("tenure_celery_queue_length", "Messages waiting in a Celery queue", labels=["queue"])
        try:
            for name, key in self.outboxes.items():
                pipe = self.redis.pipeline(transaction=False)
                pipe.xlen(key)
                pipe.xrange(key, count=1)
                length, first = pipe.execute()
                depth.add_metric([name], int(length))
                oldest_ms = int(first[0][0].split(b"-")[0]) if first else None
                age.add_metric([name], max(0.0, time.time() - oldest_ms / 1000) if oldest_ms else 0.0)
            for queue in self.queues:
                queued.add_metric([queue], int(self.redis.llen(queue)))
            up.add_metric([], 1)
        except Exception:  # the scrape must not fail: the outage is itself the metric
            up.add_metric([], 0)
            yield up
            return
        yield from (up, depth, age, queued)


def timed(histogram: Histogram) -> Callable[[], float]:
    """A stopwatch: call the returned function to observe the elapsed seconds (and get them)."""
    start = time.perf_counter()

    def stop() -> float:
        elapsed = time.perf_counter() - start
        histogram.observe(elapsed)
        return elapsed

    return stop
