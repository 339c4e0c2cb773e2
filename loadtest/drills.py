"""Fault drills: kill one component of the local topology under load, bring it back, measure.

    python -m loadtest.drills opensearch|redis|worker|api|api-graceful|all \\
        --out docs/fault-drills/results.json

Each drill starts a fresh :class:`deploy.localstack.LocalStack` that owns its OpenSearch node and
redis-server (under a temporary directory), provisions a fleet, and drives the load generator's
mix. After a warm period it injects the fault (SIGKILL of the component's whole process group,
or SIGTERM for the graceful API restart), keeps the component down for a fixed time, starts it
again on the same port and data directory, keeps loading for a recovery period, stops, lets the
worker drain and verifies every acknowledged write and turn. A low-rate probe beside the load
records what the load generator does not: the ``Retry-After`` header of each 503.

What a drill judges (:class:`loadtest.drill_analysis.Criteria`): no 5xx other than 503, no
request hanging until the client timeout, every failure of an expected kind (503, or a refused
connection while the API process is gone) and faster than ``fail_fast_ms``, every operation
served steadily again within ``recovery_budget_s`` of the component's return without anyone
touching the stack, every 503 carrying Retry-After, no unhandled exception in the API log, and the
verification: no acknowledged write lost, no stored turn left unextracted, none extracted twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from tenure_client import AsyncTenure

from deploy.localstack import LocalStack, StackConfig
from loadtest import names
from loadtest.drill_analysis import Criteria, InFlight, Recovery, Window, per_second
from loadtest.generator import Fleet, LoadConfig, provision, run_load, verify
from loadtest.http import Outcome, sdk_call
from loadtest.report import OPS, LoadReport, TurnRecord
from loadtest.stats import LatencySummary
from loadtest.verification import Verification, patiently
from service.config import Settings
from service.storage.client import build_client
from service.storage.templates import FAMILIES, drop_namespace
from service.storage.turns import TURNS

REPO = Path(__file__).resolve().parents[1]
# the sweep at drill speed: a turn untouched for 10 s counts as lost, checked every 2 s (the
# defaults, 120 s and 60 s, would make the whole-worker drill wait minutes for its in-flight turns)
DRILL_ENV = {"TENURE_LOOP_SWEEP_STALE_AFTER_S": "10", "TENURE_LOOP_SWEEP_INTERVAL_S": "2"}
STORE_DOWN = frozenset({"503"})
# what a client sees while the API process is gone: a refused connection, or a connection broken
# off mid-request ("other": the server closed it without an answer)
API_DOWN = frozenset({"connect", "other"})


@dataclass(frozen=True)
class DrillPlan:
    name: str
    component: str  # a LocalStack component name
    description: str
    sig: int = signal.SIGKILL
    warm_s: float = 10.0
    outage_s: float = 10.0  # how long the component stays down before it is started again
    recovery_s: float = 25.0  # load after the component is ready again
    concurrency: int = 8
    mix: dict[str, int] = field(default_factory=lambda: {"recall": 70, "write": 20, "turn": 10})
    tenants: int = 2
    users_per_tenant: int = 2
    seed_beliefs_per_user: int = 5
    request_timeout_s: float = 10.0
    allowed_failures: frozenset[str] = STORE_DOWN
    fail_fast_ms: float = 2000.0
    recovery_budget_s: float = 15.0
    # kill only once an extraction is running (the worker drill), at most this long after warm_s
    wait_for_running_extraction_s: float = 0.0
    drain_timeout_s: float = 150.0
    # the cluster drill: nodes, API servers, and a worker per queue (deploy/cluster.py)
    opensearch_nodes: int = 1
    api_processes: int = 1
    split_worker_queues: bool = False
    # the cluster drill: load between the data node's return to green and the manager's loss
    between_s: float = 10.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["sig"] = signal.Signals(self.sig).name
        data["allowed_failures"] = sorted(self.allowed_failures)
        return data


PLANS: dict[str, DrillPlan] = {
    plan.name: plan
    for plan in (
        DrillPlan(
            "opensearch",
            "opensearch",
            "SIGKILL the OpenSearch node under load; restart it on the same data directory "
            "(the restart replays the translog and recovers the shards).",
            # a write arriving while a primary is still recovering waits for it (and succeeds)
            fail_fast_ms=2000.0,
        ),
        DrillPlan(
            "redis",
            "redis",
            "SIGKILL redis-server (AOF, appendfsync everysec) under load; restart it on the same "
            "directory (the AOF is replayed).",
        ),
        DrillPlan(
            "worker",
            "worker",
            "SIGKILL the whole Celery worker (main process and prefork pool) while extractions run; "
            "start a new one after the outage. Fewer turns than the default mix: one worker (concurrency 2) "
            "extracts only a few turns a second on the shared box, and the backlog should come from the outage.",
            mix={"recall": 72, "write": 20, "turn": 8},
            allowed_failures=frozenset(),
            wait_for_running_extraction_s=30.0,
        ),
        DrillPlan(
            "cluster",
            "cluster",
            "A 3-node OpenSearch cluster (beliefs with 1 replica), 2 API servers, one Celery worker per "
            "queue: SIGKILL a data node that is not the cluster manager, start it again, wait for green; "
            "then SIGKILL the elected cluster manager, start it again, wait for green. No request may fail "
            "other than with a 503, and nothing acknowledged may be lost.",
            outage_s=10.0,
            recovery_s=15.0,
            opensearch_nodes=3,
            api_processes=2,
            split_worker_queues=True,
            recovery_budget_s=20.0,
            fail_fast_ms=5000.0,
            drain_timeout_s=180.0,
        ),
        DrillPlan(
            "api",
            "api",
            "SIGKILL the uvicorn supervisor and its workers under load; start the API again at once.",
            outage_s=0.0,
            allowed_failures=API_DOWN,
        ),
        DrillPlan(
            "api-graceful",
            "api",
            "SIGTERM the uvicorn supervisor and its workers under load (graceful shutdown: in-flight "
            "requests should complete); start the API again once it has exited.",
            sig=signal.SIGTERM,
            outage_s=0.0,
            allowed_failures=API_DOWN,
        ),
    )
}


# ---------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class ProbeSample:
    t_s: float
    op: str
    outcome: str
    latency_ms: float
    retry_after: str | None


class Probe:
    """A steady low-rate recall and write of its own tenant, recording headers the load generator
    does not keep (Retry-After). Its acknowledged writes are checked after the drill too."""

    def __init__(self, url: str, key: str, interval_s: float = 0.5):
        self.url = url
        self.key = key
        self.started = time.perf_counter()  # the drill aligns it with the load's clock
        self.interval_s = interval_s
        self.samples: list[ProbeSample] = []
        self.acknowledged: list[str] = []
        self._n = 0

    @classmethod
    async def create(cls, url: str, operator_key: str) -> Probe:
        tenant = f"probe-{names.run_tag()}"
        async with AsyncTenure(url, operator_key, timeout=30, max_retries=0) as operator:
            await operator.admin.create_tenant(tenant, tenant)
            await operator.admin.create_user(tenant, "probe")
            issued = await operator.admin.issue_key(tenant, "probe", name="drill")
        return cls(url, issued.key)

    def _sdk(self) -> AsyncTenure:
        """The probe's own client: its retries are off, so every 503 and its Retry-After is seen."""
        return AsyncTenure(self.url, self.key, timeout=10, max_retries=0)

    async def run(self, stop: asyncio.Event) -> None:
        async with self._sdk() as sdk:
            while not stop.is_set():
                await asyncio.gather(self._recall(sdk), self._write(sdk))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)

    async def _send(self, op: str, request: Awaitable[BaseModel], status: int) -> Outcome:
        t0 = time.perf_counter()
        out = await sdk_call(request, status, started=t0)
        self.samples.append(
            ProbeSample(round(t0 - self.started, 4), op, out.kind, round(out.latency_ms, 2), out.retry_after)
        )
        return out

    async def _recall(self, sdk: AsyncTenure) -> None:
        await self._send("recall", sdk.recall("probe drill state", scopes=["domain:code"]), 200)

    async def _write(self, sdk: AsyncTenure) -> None:
        belief_id = f"probe-{names.write_word(self._n)}"
        self._n += 1
        body = {
            "id": belief_id,
            "type": "decision",
            "canonical_name": f"probe_{belief_id.replace('-', '_')}",
            "content": f"Probe write {belief_id} of the fault drill.",
            "why_it_matters": "The drill checks that it survived.",
            "scope": ["domain:code"],
        }
        if (await self._send("write", sdk.beliefs.create(**body), 201)).status == 201:
            self.acknowledged.append(belief_id)

    async def lost_writes(self) -> list[str]:
        """Acknowledged probe writes that cannot be read back, read as the load's verification
        reads (:func:`loadtest.verification.patiently`: a 429 waited out, a fault retried)."""
        lost: list[str] = []
        async with self._sdk() as sdk:
            for belief_id in self.acknowledged:

                async def read(belief_id: str = belief_id) -> Outcome:
                    return await sdk_call(sdk.beliefs.get(belief_id), 200)

                if (await patiently(read)).status != 200:
                    lost.append(belief_id)
        return lost

    def summary(self, fault_s: float, ready_s: float) -> dict[str, Any]:
        unavailable = [s for s in self.samples if s.outcome == "503"]
        during = [s for s in self.samples if fault_s <= s.t_s < ready_s]
        outcomes: dict[str, dict[str, int]] = {}
        for s in during:
            outcomes.setdefault(s.op, {}).setdefault(s.outcome, 0)
            outcomes[s.op][s.outcome] += 1
        return {
            "requests": len(self.samples),
            "during_outage": outcomes,
            "failed_latency_ms": LatencySummary.of(
                [s.latency_ms for s in self.samples if not s.outcome.startswith("2")]
            ).to_json(),
            "responses_503": len(unavailable),
            "responses_503_without_retry_after": sum(1 for s in unavailable if not s.retry_after),
            "retry_after_values": sorted({s.retry_after for s in unavailable if s.retry_after}),
            "acknowledged_writes": len(self.acknowledged),
        }


# ---------------------------------------------------------------------------- broker and turn state


def extraction_state(stack: LocalStack) -> dict[str, int]:
    """Turns by extraction status (after a refresh) and the broker's queue and unacked counts."""
    settings = stack.settings()
    client = build_client(settings)
    rds: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    try:
        alias = TURNS.alias(settings.opensearch_namespace)
        client.indices.refresh(index=alias)
        body = {"size": 0, "aggs": {"status": {"terms": {"field": "extraction_status", "size": 10}}}}
        buckets = client.search(index=alias, body=body)["aggregations"]["status"]["buckets"]
        state = {f"turns_{b['key']}": int(b["doc_count"]) for b in buckets}
        prefix = settings.celery.queue_prefix
        state["queued_heavy"] = int(rds.llen(f"{prefix}.heavy"))
        # kombu's Redis transport keeps delivered, unacknowledged messages here until acked or
        # restored after the visibility timeout (1 h): what a dead worker leaves behind
        state["broker_unacked"] = int(rds.hlen("unacked"))
        return state
    finally:
        client.close()
        rds.close()


async def wait_for_running_extraction(stack: LocalStack, timeout_s: float) -> dict[str, int]:
    """Poll until at least one turn is being extracted (status ``running``); the last state seen."""
    deadline = time.monotonic() + timeout_s
    state: dict[str, int] = {}
    while time.monotonic() < deadline:
        state = await asyncio.to_thread(extraction_state, stack)
        if state.get("turns_running", 0) > 0:
            break
        await asyncio.sleep(0.1)
    return state


class BacklogMonitor:
    """Extraction state once a second while the drill runs: how the backlog grew while the
    component was down and how fast the worker worked it off afterwards."""

    def __init__(self, stack: LocalStack, events: Events):
        self.stack = stack
        self.events = events
        self.series: list[dict[str, Any]] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t_s = round(time.perf_counter() - self.events.started, 2)
            try:
                state: dict[str, Any] = await asyncio.to_thread(extraction_state, self.stack)
            except Exception as exc:  # noqa: BLE001 - a store is down: that is the drill
                state = {"error": type(exc).__name__}
            self.series.append({"t_s": t_s, **state})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    def backlog_recovered_s(self, fault_s: float, ready_s: float) -> float | None:
        """Seconds after "ready" until the unfinished turns (pending + running) were back to their
        level before the fault (the highest of the last three samples: under load it is never 0).
        Turns, not queue messages: the sweep's re-enqueued duplicates inflate the queue."""
        sampled = [p for p in self.series if "queued_heavy" in p]
        before = [_unfinished(p) for p in sampled if p["t_s"] <= fault_s][-3:]
        baseline = max(before, default=0)
        after = (p for p in sampled if p["t_s"] >= ready_s)
        return next((round(p["t_s"] - ready_s, 2) for p in after if _unfinished(p) <= baseline), None)


def _unfinished(point: dict[str, Any]) -> int:
    return int(point.get("turns_pending", 0)) + int(point.get("turns_running", 0))


def worker_log_counts(stack: LocalStack) -> dict[str, int]:
    """What the worker did, from its log (every worker of the drill appends to it)."""
    text = "".join(log.read_text(errors="replace") for log in sorted(stack.logs.glob("worker*.log")))
    extract_done = [line for line in text.splitlines() if "Task beliefs.extract[" in line and "succeeded" in line]
    return {
        "extract_tasks_succeeded": len(extract_done),
        # a turn already finished by an earlier message: a duplicate delivery, a no-op
        "extract_tasks_already_final": sum(1 for line in extract_done if "already_final" in line),
        "extract_retries": text.count("] retry: Retry in"),
        "sweep_reenqueued": sum(int(m) for m in re.findall(r"sweep re-enqueued (\d+) turns", text)),
        # the consumer died under a live process (Celery 5.7.0 on a broker reconnect)
        "unrecoverable_errors": text.count("Unrecoverable error"),
        # workers the stack's supervisor restarted: exited, or their consumer heartbeat went stale
        "supervisor_restarts": len(stack.supervisor_restarts),
    }


SEEN_FAMILIES = {"tenure_opensearch_node_failures": "node_failures", "tenure_opensearch_errors": "errors"}


NODE_LATENCY = "tenure_opensearch_node_request_duration_seconds"
SLOW_S = ("1.0", "5.0", "10.0")  # histogram bounds: requests slower than these are counted per node


def add_node_latency(into: dict[str, dict[str, float]], samples: Sequence[Any]) -> None:
    """Per node (summed over the API servers): requests, seconds spent, and how many took longer
    than each of :data:`SLOW_S` (from the cumulative buckets)."""
    for sample in samples:
        node = sample.labels.get("node", "")
        row = into.setdefault(node, {"requests": 0, "seconds": 0.0, **{f"over_{b}s": 0 for b in SLOW_S}})
        if sample.name.endswith("_count"):
            row["requests"] += int(sample.value)
            for bound in SLOW_S:
                row[f"over_{bound}s"] += int(sample.value)
        elif sample.name.endswith("_sum"):
            row["seconds"] = round(row["seconds"] + sample.value, 3)
        elif sample.name.endswith("_bucket") and sample.labels.get("le") in SLOW_S:
            row[f"over_{sample.labels['le']}s"] -= int(sample.value)


def opensearch_as_operators_see_it(stack: LocalStack) -> dict[str, Any]:
    """What the API servers' metrics and logs say about OpenSearch after the run: requests a node
    did not answer (retried on another node, so invisible to clients), failures that reached the
    service, and opensearch-py's WARNING lines (a failed request, a node put to rest)."""
    seen: dict[str, Any] = {"node_failures": {}, "errors": {}, "client_warning_lines": 0, "node_latency": {}}
    for url in stack.api_urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            if family.name == NODE_LATENCY:
                add_node_latency(seen["node_latency"], family.samples)
            key = SEEN_FAMILIES.get(family.name)
            if key is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    label = sample.labels.get("node") or sample.labels.get("kind") or ""
                    seen[key][label] = seen[key].get(label, 0) + int(sample.value)
    for log in stack.logs.glob("api*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"logger": "opensearch"' in line and '"level": "WARNING"' in line:
                seen["client_warning_lines"] += 1
    return seen


def unhandled_errors(stack: LocalStack) -> int:
    """Requests the API answered with its generic 500 (logged by the last-resort handler)."""
    return sum(
        log.read_text(errors="replace").count("unhandled error in request") for log in stack.logs.glob("api*.log")
    )


# ---------------------------------------------------------------------------- one drill


@dataclass
class Events:
    """Seconds since the load started (the samples' clock)."""

    started: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)
    skew_bound_ms: float = 0.0  # how much earlier than ``started`` the samples' origin may be

    def mark(self, name: str) -> float:
        self.marks[name] = round(time.perf_counter() - self.started, 3)
        return self.marks[name]


async def lose_node(stack: LocalStack, plan: DrillPlan, events: Events, node: str, phase: str) -> dict[str, Any]:
    """SIGKILL one cluster node, keep it down ``outage_s``, start it again, wait for green."""
    cluster = stack.cluster
    assert cluster is not None
    manager_before = await asyncio.to_thread(cluster.cluster_manager)
    events.mark(f"{phase}_killed")
    await asyncio.to_thread(stack.kill, node, signal.SIGKILL)
    # how long until the survivors have noticed: the node gone from their cluster state and a
    # cluster manager that is not it (a new election when it was the manager). Reading the status
    # before that (as the first runs did) reported the cluster as it was before the loss.
    manager, during = await asyncio.to_thread(cluster.wait_until_removed, node, 120.0)
    events.mark(f"{phase}_node_removed")
    down_for = time.perf_counter() - events.started - events.marks[f"{phase}_killed"]
    await asyncio.sleep(max(0.0, plan.outage_s - down_for))
    events.mark(f"{phase}_restart")
    await asyncio.to_thread(stack.start_component, node)
    events.mark(f"{phase}_rejoined")
    await asyncio.to_thread(cluster.wait_for, status="green", nodes=cluster.size, timeout_s=600.0)
    events.mark(f"{phase}_green")
    marks = events.marks
    return {
        "node": node,
        "manager_before": manager_before,
        "manager_after": manager,
        "status_during": during["status"],
        "nodes_during": during["number_of_nodes"],
        "unassigned_shards_during": during["unassigned_shards"],
        "node_removed_after_kill_s": round(marks[f"{phase}_node_removed"] - marks[f"{phase}_killed"], 2),
        "rejoined_after_restart_s": round(marks[f"{phase}_rejoined"] - marks[f"{phase}_restart"], 2),
        "green_after_restart_s": round(marks[f"{phase}_green"] - marks[f"{phase}_restart"], 2),
        "green_after_kill_s": round(marks[f"{phase}_green"] - marks[f"{phase}_killed"], 2),
    }


async def inject_cluster(stack: LocalStack, plan: DrillPlan, events: Events) -> dict[str, Any]:
    """Lose a data node that is not the cluster manager, then the elected cluster manager."""
    cluster = stack.cluster
    assert cluster is not None
    manager = await asyncio.to_thread(cluster.cluster_manager)
    data_node = next(n.name for n in cluster.nodes if n.name != manager)
    events.mark("fault")
    data = await lose_node(stack, plan, events, data_node, "data_node")
    await asyncio.sleep(plan.between_s)
    manager = await asyncio.to_thread(cluster.cluster_manager)
    elected = await lose_node(stack, plan, events, manager, "cluster_manager")
    events.mark("ready")
    return {"cluster": {"data_node": data, "cluster_manager": elected}}


async def inject(stack: LocalStack, plan: DrillPlan, events: Events) -> dict[str, Any]:
    """The fault: signal the component, keep it down ``outage_s``, start it again."""
    if plan.component == "cluster":
        return await inject_cluster(stack, plan, events)
    notes: dict[str, Any] = {}
    if plan.wait_for_running_extraction_s:
        notes["at_kill"] = await wait_for_running_extraction(stack, plan.wait_for_running_extraction_s)
    events.mark("fault")
    await asyncio.to_thread(stack.kill, plan.component, plan.sig)
    events.mark("down")
    if plan.outage_s:
        await asyncio.sleep(plan.outage_s)
    events.mark("restart")
    await asyncio.to_thread(stack.start_component, plan.component)
    events.mark("ready")
    return notes


async def drive(stack: LocalStack, plan: DrillPlan) -> dict[str, Any]:
    config = LoadConfig(
        url=",".join(stack.api_urls),
        operator_key=stack.operator_key(),
        tenants=plan.tenants,
        users_per_tenant=plan.users_per_tenant,
        concurrency=plan.concurrency,
        duration_s=3600.0,  # stopped by the drill
        mix=plan.mix,
        seed_beliefs_per_user=plan.seed_beliefs_per_user,
        request_timeout_s=plan.request_timeout_s,
    )
    fleet = await provision(config)
    probe = await Probe.create(stack.api_url, config.operator_key)
    stop = asyncio.Event()
    before = time.perf_counter()
    load = asyncio.create_task(run_load(config, fleet, stop))
    # run_load takes its clock origin in its first step, which runs to its first suspension
    # before this task resumes: the origin lies between ``before`` and now, and the first
    # request is sent after now. Events count from now: a mark is early by at most the bound.
    await asyncio.sleep(0)
    events = Events()
    events.skew_bound_ms = round((events.started - before) * 1000, 2)
    probe.started = events.started
    probing = asyncio.create_task(probe.run(stop))
    backlog = BacklogMonitor(stack, events)
    monitoring = asyncio.create_task(backlog.run(stop))
    try:
        await asyncio.sleep(plan.warm_s)
        notes = await inject(stack, plan, events)
        await asyncio.sleep(plan.recovery_s)
    finally:
        stop.set()
        report = await load
        await probing
        await monitoring
    events.mark("stopped")
    notes["after_stop"] = await asyncio.to_thread(extraction_state, stack)
    report, unrecorded = await split_unrecorded(config, fleet, report)
    events.mark("turns_checked")
    verification = await verify(config, fleet, report, drain_timeout_s=plan.drain_timeout_s)
    events.mark("verified")
    notes["after_verify"] = await asyncio.to_thread(extraction_state, stack)
    lost_probe_writes = await probe.lost_writes()
    notes["turns_answered_but_not_recorded"] = [asdict(t) for t in unrecorded]
    notes["worker_log"] = worker_log_counts(stack)
    if plan.component == "cluster":  # one worker per API server: its /metrics is the whole server's
        notes["opensearch_seen"] = await asyncio.to_thread(opensearch_as_operators_see_it, stack)
    notes["extraction_backlog"] = backlog.series
    notes["backlog_recovered_s"] = backlog.backlog_recovered_s(events.marks["fault"], events.marks["ready"])
    return judge(plan, stack, report, verification, probe, lost_probe_writes, events, notes, fleet)


def judge(
    plan: DrillPlan,
    stack: LocalStack,
    report: LoadReport,
    verification: Verification,
    probe: Probe,
    lost_probe_writes: list[str],
    events: Events,
    notes: dict[str, Any],
    fleet: Fleet,
) -> dict[str, Any]:
    marks = events.marks
    samples = report.timeline
    ops = [op for op in OPS if any(s.op == op for s in samples)]
    recoveries = [Recovery.of(op, samples, marks["ready"]) for op in ops]
    criteria = Criteria(plan.allowed_failures, plan.fail_fast_ms, plan.recovery_budget_s)
    criteria.judge_timeline(samples, marks["fault"], recoveries)
    probe_summary = probe.summary(marks["fault"], marks["ready"])
    criteria.check(
        probe_summary["responses_503_without_retry_after"] == 0,
        f"{probe_summary['responses_503_without_retry_after']} probe 503s without Retry-After",
    )
    crashes = unhandled_errors(stack)
    criteria.check(crashes == 0, f"{crashes} unhandled exceptions in the API log")
    judge_verification(criteria, verification, lost_probe_writes)
    if plan.wait_for_running_extraction_s:
        running = notes.get("at_kill", {}).get("turns_running", 0)
        criteria.check(running > 0, "no extraction was running when the worker was killed")
    if "cluster" in notes:
        notes["cluster"]["recall"] = cluster_recall(samples, marks)
    return {
        "drill": plan.name,
        "plan": plan.to_json(),
        "events_s": marks,
        "clock_skew_bound_ms": events.skew_bound_ms,
        "slow_failures": [s._asdict() for s in samples if not s.ok and s.latency_ms > plan.fail_fast_ms][:50],
        "outage": Window.of(samples, marks["fault"], marks["ready"]).to_json(),
        "before": Window.of(samples, 0.0, marks["fault"]).to_json(),
        "after": Window.of(samples, marks["ready"], marks["stopped"]).to_json(),
        "in_flight_at_fault": asdict(InFlight.of(samples, marks["fault"])),
        "recovery_s": {r.op: asdict(r) for r in recoveries},
        "probe": {**probe_summary, "lost_writes": lost_probe_writes},
        "load": {
            "requests": report.total_requests,
            "errors": report.total_errors,
            "ops": {op: stats.to_json() for op, stats in report.ops.items()},
            "acknowledged_writes": len(report.acknowledged_writes),
            "acknowledged_turns": len(report.acknowledged_turns),
            # the box is shared: what else ran shows in the load average around the run
            "load_average_before": report.load_average_before,
            "load_average_after": report.load_average_after,
        },
        "verification": verification_summary(verification, len(notes["turns_answered_but_not_recorded"])),
        "state": notes,
        "fleet": {"tag": fleet.tag, "tenants": fleet.tenants, "users": len(fleet.users), "seeds": len(fleet.seeds)},
        "timeline_per_s": per_second(samples),
        "criteria": criteria.to_json(),
        "passed": not criteria.failures,
    }


def cluster_recall(samples: Sequence[Any], marks: dict[str, float]) -> dict[str, Any]:
    """Recall before the first loss and while each node was gone (kill to green again)."""

    def window(start: float, end: float) -> dict[str, Any]:
        recalls = [s for s in samples if s.op == "recall" and start <= s.t_s < end]
        return {
            "requests": len(recalls),
            "errors": sum(1 for s in recalls if not s.ok),
            "outcomes": dict(sorted(Counter(s.outcome for s in recalls).items())),
            "ok_latency_ms": LatencySummary.of([s.latency_ms for s in recalls if s.ok]).to_json(),
        }

    return {
        "before": window(0.0, marks["fault"]),
        "data_node_lost": window(marks["data_node_killed"], marks["data_node_green"]),
        "cluster_manager_lost": window(marks["cluster_manager_killed"], marks["cluster_manager_green"]),
    }


async def split_unrecorded(config: LoadConfig, fleet: Fleet, report: LoadReport) -> tuple[LoadReport, list[TurnRecord]]:
    """Move the answered turns that were never stored to the unacknowledged ones.

    The load generator's proxy turns are non-streaming, and a non-streaming answer records its
    turn *after* the response (``tenure.turn_recording: after_response``): the answer does not
    acknowledge that the turn is stored. A turn whose recording failed (OpenSearch down) or was
    cut off (the API killed) is absent for good: a documented window, not a lost extraction, and
    without this split the verifier would wait its whole drain timeout for turns that cannot
    appear. Asked after the load stopped, so no recording is still under way; a turn is read by
    key (real time), so a 404 is final."""
    base_url = config.url.split(",")[0]
    async with httpx.AsyncClient(timeout=config.request_timeout_s) as client:
        gate = asyncio.Semaphore(16)

        async def absent(turn: TurnRecord) -> bool:
            sdk = AsyncTenure(base_url, fleet.user(turn.user).key, http_client=client, max_retries=0)
            for attempt in range(4):
                async with gate:
                    got = await sdk_call(sdk.get_turn(str(turn.turn_id)), 200)
                if got.status is not None and got.status < 500:
                    return got.status == 404
                await asyncio.sleep(0.5 * (attempt + 1))
            return False  # unknown: leave it to the verifier

        flags = await asyncio.gather(*(absent(t) for t in report.acknowledged_turns))
    unrecorded = [t for t, gone in zip(report.acknowledged_turns, flags, strict=True) if gone]
    stored = [t for t, gone in zip(report.acknowledged_turns, flags, strict=True) if not gone]
    split = replace(report, acknowledged_turns=stored, unacknowledged_turns=[*report.unacknowledged_turns, *unrecorded])
    return split, unrecorded


def judge_verification(criteria: Criteria, verification: Verification, lost_probe_writes: list[str]) -> None:
    criteria.check(not verification.lost_writes, f"{len(verification.lost_writes)} acknowledged writes lost")
    criteria.check(
        not verification.unrecallable_writes,
        f"{len(verification.unrecallable_writes)} acknowledged writes present but not recallable",
    )
    criteria.check(not lost_probe_writes, f"{len(lost_probe_writes)} acknowledged probe writes lost")
    lost = verification.lost_extractions
    criteria.check(not lost, f"{len(lost)} acknowledged turns never extracted")
    doubled = len(verification.duplicate_extractions) + len(verification.reapplied_extractions)
    criteria.check(doubled == 0, f"{doubled} extractions applied twice")
    criteria.check(verification.turns_not_drained == 0, f"{verification.turns_not_drained} turns not drained")
    criteria.check(not verification.isolation_leaks, f"{len(verification.isolation_leaks)} isolation leaks")


def verification_summary(verification: Verification, unrecorded: int) -> dict[str, Any]:
    data = verification.to_json()
    data["turns_answered_but_not_recorded"] = unrecorded
    data["extractions_applied_twice"] = len(verification.duplicate_extractions) + len(
        verification.reapplied_extractions
    )
    return data


def drop_indices(settings: Settings) -> None:
    """The namespace's indices and templates in a shared node (the drill's Redis is its own)."""
    client = build_client(settings)
    try:
        drop_namespace(client, settings.opensearch_namespace, FAMILIES)
    finally:
        client.close()


def stack_config(root: Path, opensearch_url: str | None = None, plan: DrillPlan | None = None) -> StackConfig:
    if plan and plan.opensearch_nodes > 1:
        # three JVMs on a shared 2-core box: small heaps, one uvicorn process per API server
        return StackConfig(
            root=root,
            opensearch_heap="512m",
            opensearch_nodes=plan.opensearch_nodes,
            api_processes=plan.api_processes,
            api_workers=1,
            split_worker_queues=plan.split_worker_queues,
            worker_concurrency=1,
            # the service's own OpenSearch timeout (10 s), as an operator runs it: template and index
            # creation wait longer by themselves (storage/templates.py ADMIN_TIMEOUT_S); a stack-wide
            # 30 s let a request wait on the store three times the client's patience
            env=dict(DRILL_ENV),
        )
    return StackConfig(root=root, opensearch_url=opensearch_url, opensearch_heap="1g", env=dict(DRILL_ENV))


def run_drill(plan: DrillPlan, root: Path, *, opensearch_url: str | None = None) -> dict[str, Any]:
    """One drill on a fresh stack under ``root`` (its own Redis; its own OpenSearch unless
    ``opensearch_url`` is given, which only a drill that does not kill OpenSearch may share)."""
    if opensearch_url and plan.component in ("opensearch", "cluster"):
        raise ValueError("the OpenSearch drill kills its node: it cannot use a shared one")
    started = time.monotonic()
    stack = LocalStack(stack_config(root, opensearch_url, plan))
    try:
        with stack:
            result = asyncio.run(drive(stack, plan))
            result["stack"] = {"root": str(root), "namespace": stack.config.namespace, "owned": list(stack.owned)}
    finally:
        if opensearch_url:  # leave nothing in a node the drill does not own (once no process can re-create it)
            drop_indices(stack.settings())
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return result


# ---------------------------------------------------------------------------- CLI


def format_result(result: dict[str, Any]) -> str:
    ev = result["events_s"]
    out = result["outage"]
    lines = [
        f"== {result['drill']}: {'PASSED' if result['passed'] else 'FAILED'} ({result['wall_s']} s)",
        "events (s): " + ", ".join(f"{k} {v}" for k, v in ev.items()),
        f"outage requests: {json.dumps(out['outcomes'])}; failed max {out['failed_latency_ms']['max']} ms, "
        f"p99 {out['failed_latency_ms']['p99']} ms",
        "recovery after ready (s): "
        + ", ".join(
            f"{op} first {r['first_success_s']} sustained {r['sustained_s']}" for op, r in result["recovery_s"].items()
        ),
        f"in flight at fault: {result['in_flight_at_fault']}",
        f"unfinished turns back to their level before the fault {result['state']['backlog_recovered_s']} s "
        "after ready; "
        f"worker: {result['state']['worker_log']}",
    ]
    for phase, info in result["state"].get("cluster", {}).items():
        if phase != "recall":
            lines.append(f"cluster {phase}: {json.dumps(info)}")
    for phase, info in result["state"].get("cluster", {}).get("recall", {}).items():
        lat = info["ok_latency_ms"]
        counts = f"{info['requests']} requests, {info['errors']} errors"
        lines.append(f"recall {phase}: {counts}, p50 {lat['p50']} p99 {lat['p99']} ms")
    if "opensearch_seen" in result["state"]:
        lines.append(f"opensearch in the API's metrics and logs: {json.dumps(result['state']['opensearch_seen'])}")
    v = result["verification"]
    lines.append(
        f"verification: writes {v['acknowledged_writes']} acknowledged, {len(v['lost_writes'])} lost; turns "
        f"{v['acknowledged_turns']} acknowledged, {len(v['lost_extractions'])} not extracted, "
        f"{v['turns_answered_but_not_recorded']} answered-not-recorded, {v['extractions_applied_twice']} twice"
    )
    lines += [f"  FAILED: {f}" for f in result["criteria"]["failures"]]
    return "\n".join(lines)


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def machine() -> dict[str, Any]:
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "commit": commit, "load_average": os.getloadavg()}


def save(out: Path, results: dict[str, dict[str, Any]]) -> None:
    """Merge into ``out``: drills run one at a time keep the others' results."""
    data: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    data.setdefault("drills", {}).update(results)
    data["machine"] = machine()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest.drills", description=__doc__.split("\n")[0])
    parser.add_argument("drill", choices=[*PLANS, "all"])
    parser.add_argument("--out", type=Path, help="merge the results into this JSON file")
    parser.add_argument("--root", type=Path, help="where each drill's new state directory goes (default: /tmp)")
    parser.add_argument("--outage", type=float, help="override the plan's seconds of outage")
    parser.add_argument("--recovery", type=float, help="override the plan's seconds of load after recovery")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plans = list(PLANS.values()) if args.drill == "all" else [PLANS[args.drill]]
    results: dict[str, dict[str, Any]] = {}
    for plan in plans:
        if args.outage is not None:
            plan = replace(plan, outage_s=args.outage)
        if args.recovery is not None:
            plan = replace(plan, recovery_s=args.recovery)
        # a new directory per run: the component logs are appended to, and the worker counts read them
        parent = args.root or Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"tenure-drill-{plan.name}-", dir=parent))
        say(f"drill {plan.name}: {plan.description} (state in {root})")
        result = run_drill(plan, root)
        say(format_result(result))
        results[plan.name] = result
        if args.out:
            save(args.out, {plan.name: result})
    return 0 if all(r["passed"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
