"""Operations figures over HTTP (issue 6): recall with auth at 10k / 100k / 1M beliefs over 1,000
tenants, sustained recall throughput, bulk ingest rate, compaction time, memory of every process,
proxy overhead.

Starts the deployment topology as local processes (deploy/localstack.py: its own OpenSearch and
Redis unless URLs are given, the API under uvicorn with N workers, a Celery worker and beat, the
scripted LLM), provisions the tenants, users and API keys through the admin API, loads
``benchmarks.recall_bench``'s synthetic corpus through ``POST /v1/beliefs/import`` in stages, and
after each stage measures ``POST /v1/recall`` from a sequential client and from 32 concurrent ones.

    .venv/bin/python -m benchmarks.http_scale_bench                                # 10k, 100k, 1M
    .venv/bin/python -m benchmarks.http_scale_bench --sizes 2000,10000 --tenants 100 \\
        --compaction-beliefs 5000 --duration 10 --no-proxy                           # smoke run

This is a benchmark, not a test: it prints figures and writes a JSON (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson
from opensearchpy import OpenSearch
from tenure_client import AsyncTenure, Conflict, ConnectionFailed, Tenure, TenureError
from tenure_client.client import AsyncAdmin

from benchmarks.recall_bench import Query, Spec, belief_at, draw_queries, loadavg
from deploy.localstack import LocalStack, StackConfig
from loadtest.__main__ import CpuMeter
from loadtest.arguments import add_corpus_arguments, add_recall_arguments, add_stack_arguments
from loadtest.arguments import sizes as corpus_sizes
from loadtest.http import make_client
from loadtest.stats import latency_block
from service.domain.belief import Belief, BeliefType, EpistemicStatus
from service.storage.client import build_client
from service.storage.templates import AUDIT, BELIEFS
from workers import resources

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PY_SPY = Path(sys.executable).parent / "py-spy"
JSONL = "application/x-ndjson"
API_DEFAULT_BODY_BYTES = 1_000_000  # ApiSettings.max_body_bytes: what a default deployment accepts
MAX_IMPORT_RECORDS = 5000  # ApiSettings.max_import_records default
OPERATOR_BODY_BYTES = 8_000_000  # the stack's raised limit: room for 5,000-record import bodies
# the service calls the profiles are cut at, as py-spy names them (see _frame_key)
RECALL_FRAME = "RecallService.recall (recall/service.py)"
IMPORT_FRAME = "BeliefService.import_records (beliefs/api_service.py)"
TARGETS = {"p50_ms": 5.0, "p99_ms": 20.0, "recalls_per_s": 300.0, "ingest_per_s": 1000.0, "p50_growth": 2.0}


# ------------------------------------------------------------------------------ measurement helpers


def latency_summary(timings: list[float]) -> dict[str, float]:
    return latency_block(timings, with_mean=True)


def _proc_memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes: the resident set now and its peak since the process started."""
    values = {"VmRSS:": 0, "VmHWM:": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, *rest = line.split()
            if name in values:
                values[name] = int(rest[0]) * 1024
    except OSError:
        pass
    return values["VmRSS:"], values["VmHWM:"]


def _cmd(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
    return raw.strip()[:140]


class PhaseMeter:
    """Wall time, load average and CPU seconds of every stack component, of this client and of
    the rest of the machine over one phase (loadtest's CpuMeter): on two shared cores, who used
    the CPU explains most figures."""

    def __init__(self, stack: LocalStack):
        self.cpu = CpuMeter(stack.pids)
        self.load_before = loadavg()
        self.cpu.begin()

    def stop(self) -> dict[str, Any]:
        used = self.cpu.finish()
        wall = used["wall_s"] or 1.0
        cores = {k: round(v / wall, 2) for k, v in used["cpu_s"].items()}
        cores["other processes"] = round(used["other_processes_cpu_s"] / wall, 2)
        return {**used, "loadavg_before": self.load_before, "loadavg_after": loadavg(), "cores_used": cores}


def memory_snapshot(stack: LocalStack) -> dict[str, Any]:
    """``stack.rss_bytes()`` per component, plus every process of it (pid, command, RSS, peak)."""
    totals = stack.rss_bytes()
    out: dict[str, Any] = {}
    for name, pids in stack.pids().items():
        processes = []
        for pid in pids:
            rss, peak = _proc_memory(pid)
            processes.append(
                {"pid": pid, "cmd": _cmd(pid), "rss_mb": round(rss / 1e6, 1), "peak_mb": round(peak / 1e6)}
            )
        out[name] = {"rss_mb": round(totals.get(name, 0) / 1e6, 1), "processes": processes}
    return out


def api_worker_pids(stack: LocalStack) -> list[int]:
    """The uvicorn worker processes (the supervisor is the group leader; workers are spawned)."""
    children = stack.pids()["api"][1:]
    return [pid for pid in children if "multiprocessing.spawn" in _cmd(pid) and "resource_tracker" not in _cmd(pid)]


# ------------------------------------------------------------------------------ provisioning


@dataclass
class Tenancy:
    """API keys by (tenant, user); the first user of every tenant is its admin."""

    keys: dict[tuple[str, str], str] = field(default_factory=dict)
    admins: dict[str, str] = field(default_factory=dict)


class AdminClient:
    """Admin API calls through the SDK with at most ``concurrency`` in flight (so pooled connections
    stay busy and never sit idle into uvicorn's keep-alive timeout), retrying a dropped connection
    once: a create that did land before the drop then answers 409, which counts as done."""

    def __init__(self, client: httpx.AsyncClient, api_url: str, operator: str, concurrency: int):
        self.admin = AsyncTenure(api_url, operator, http_client=client, max_retries=0).admin
        self.gate = asyncio.Semaphore(concurrency)

    async def call(self, request: Callable[[AsyncAdmin], Awaitable[T]]) -> T | None:
        """``request(admin)``; None when only a retried create's 409 says it landed."""
        for attempt in range(2):
            try:
                async with self.gate:
                    return await request(self.admin)
            except ConnectionFailed:
                if attempt:
                    raise
            except Conflict:
                if not attempt:
                    raise
                return None
        raise AssertionError("unreachable")


async def _provision_tenant(admin: AdminClient, tenant: str, users: list[str], projects: list[str]) -> dict[str, str]:
    await admin.call(lambda a: a.create_tenant(tenant, tenant))

    async def user_and_key(user: str) -> tuple[str, str]:
        roles = ["member", "admin"] if user == users[0] else ["member"]
        await admin.call(lambda a: a.create_user(tenant, user, roles=roles, projects=projects))
        issued = await admin.call(lambda a: a.issue_key(tenant, user, name=f"bench-{user}"))
        assert issued is not None, f"no key issued for {tenant}/{user}"  # a key is new: never a 409
        return user, issued.key

    return dict(await asyncio.gather(*(user_and_key(u) for u in users)))


async def provision(
    api_url: str, operator: str, tenants: dict[str, list[str]], projects: list[str], concurrency: int
) -> Tenancy:
    """Every tenant with its users (all granted every project) and one key per user, over HTTP."""
    out = Tenancy()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        admin = AdminClient(client, api_url, operator, concurrency)

        async def one(tenant: str, users: list[str]) -> None:
            keys = await _provision_tenant(admin, tenant, users, projects)
            out.keys.update({(tenant, u): k for u, k in keys.items()})
            out.admins[tenant] = keys[users[0]]
            if len(out.admins) % 100 == 0:
                print(f"  {len(out.admins)} tenants provisioned", flush=True)

        await asyncio.gather(*(one(t, users) for t, users in tenants.items()))
    return out


# ------------------------------------------------------------------------------ bulk import bodies


def import_line(belief: Belief) -> bytes:
    """One JSONL record in the export format; the tenant always comes from the credential."""
    record = belief.model_dump(mode="json", exclude_none=True)
    record.pop("tenant_id", None)
    return orjson.dumps(record)


def split_bodies(lines: list[bytes], max_bytes: int, max_records: int) -> list[tuple[int, bytes]]:
    """Greedy JSONL request bodies of at most ``max_bytes`` and ``max_records``: (records, body)."""
    bodies: list[tuple[int, bytes]] = []
    current: list[bytes] = []
    size = 0
    for line in lines:
        if current and (size + len(line) + 1 > max_bytes or len(current) >= max_records):
            bodies.append((len(current), b"\n".join(current)))
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        bodies.append((len(current), b"\n".join(current)))
    return bodies


@dataclass(frozen=True)
class BodyJob:
    """The corpus beliefs of one tenant within [start, stop), as import bodies."""

    tenant: int
    start: int
    stop: int
    spec: Spec
    now: datetime
    max_bytes: int
    max_records: int


def corpus_bodies(job: BodyJob) -> tuple[str, list[tuple[int, bytes]]]:
    # belief i belongs to tenant i mod tenants (recall_bench.tenant_of)
    first = job.start + (job.tenant - job.start) % job.spec.tenants
    lines = [import_line(belief_at(i, job.spec, job.now)) for i in range(first, job.stop, job.spec.tenants)]
    return f"t{job.tenant:04d}", split_bodies(lines, job.max_bytes, job.max_records)


@dataclass(frozen=True)
class Batch:
    tenant: str
    records: int
    body: bytes


def stage_batches(start: int, stop: int, spec: Spec, now: datetime, max_bytes: int) -> list[Batch]:
    """Generate a stage's bodies up front (two processes), so generation is not timed as ingest."""
    jobs = [BodyJob(t, start, stop, spec, now, max_bytes, MAX_IMPORT_RECORDS) for t in range(spec.tenants)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(corpus_bodies, jobs, chunksize=max(1, len(jobs) // 40)))
    return [Batch(tenant, n, body) for tenant, bodies in results for n, body in bodies]


# ------------------------------------------------------------------------------ ingest


async def ingest(
    api_url: str, batches: list[Batch], admins: dict[str, str], importers: int, seconds: float | None = None
) -> dict[str, Any]:
    """Send the batches through ``POST /v1/beliefs/import`` from ``importers`` concurrent clients,
    each with the tenant admin's key (all of them, or as many as ``seconds`` allow); the rate
    counts acknowledged (imported) beliefs."""
    deadline = time.perf_counter() + seconds if seconds else float("inf")
    pending = list(reversed(batches))
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    counts = Counter[str]()
    limits = httpx.Limits(max_connections=importers)
    async with httpx.AsyncClient(base_url=api_url, timeout=600, limits=limits) as client:

        async def importer() -> None:
            while pending and time.perf_counter() < deadline:
                batch = pending.pop()
                headers = {"Authorization": f"Bearer {admins[batch.tenant]}", "Content-Type": JSONL}
                t0 = time.perf_counter()
                response = await client.post("/v1/beliefs/import", content=batch.body, headers=headers)
                latencies.append((time.perf_counter() - t0) * 1000)
                if response.status_code != 200:
                    errors[f"{response.status_code} {response.text[:120]}"] += 1
                    continue
                result = response.json()
                counts["imported"] += len(result["imported"])
                counts["failed"] += len(result["failed"])

        t0 = time.perf_counter()
        await asyncio.gather(*(importer() for _ in range(importers)))
        wall = time.perf_counter() - t0
    sent = batches[: len(batches) - len(pending)]
    return {
        "beliefs_sent": sum(b.records for b in sent),
        "acknowledged": counts["imported"],
        "failed_records": counts["failed"],
        "requests": len(latencies),
        "records_per_request_mean": round(sum(b.records for b in sent) / max(1, len(sent)), 1),
        "importers": importers,
        "wall_s": round(wall, 1),
        "beliefs_per_s": round(counts["imported"] / wall, 1) if wall else 0.0,
        "request_latency": latency_summary(latencies),
        "errors": dict(errors),
    }


# ------------------------------------------------------------------------------ recall


SESSION = "http-scale-bench"


def sdk_of(q: Query, tenancy: Tenancy, clients: dict[str, T], make: Callable[[str], T]) -> T:
    """The SDK client with the key of the query's user (one per key, made on first use)."""
    key = tenancy.keys[(q.principal.tenant_id, q.principal.user_id)]
    if key not in clients:
        clients[key] = make(key)
    return clients[key]


def sync_callers(api_url: str, client: httpx.Client, tenancy: Tenancy) -> Callable[[Query], Tenure]:
    """Query -> the SDK client of its user over ``client`` (retries off)."""
    sdks: dict[str, Tenure] = {}
    return lambda q: sdk_of(q, tenancy, sdks, lambda key: Tenure(api_url, key, http_client=client, max_retries=0))


def recall_unjudged(tenure: Tenure, q: Query) -> None:
    """A recall whose answer is not judged (warm-up, profiling): an error answer is ignored, a
    server that cannot be reached is not."""
    try:
        tenure.recall(q.message, scopes=q.scopes, session_id=SESSION)
    except ConnectionFailed:
        raise
    except TenureError:
        pass


def sequential_recall(api_url: str, queries: list[Query], tenancy: Tenancy, warmup: int) -> dict[str, Any]:
    """One client, one keep-alive connection (so one uvicorn worker), calls back to back, through
    the SDK (retries off; a timing includes reading the answer into its typed model)."""
    timings: list[float] = []
    kinds: dict[str, list[float]] = {}
    errors: Counter[str] = Counter()
    hits = 0
    with httpx.Client(timeout=60) as client:
        sdk = sync_callers(api_url, client, tenancy)
        for q in queries[:warmup]:
            recall_unjudged(sdk(q), q)
        wall0 = time.perf_counter()
        for q in queries[warmup:]:
            t0 = time.perf_counter()
            try:
                answer = sdk(q).recall(q.message, scopes=q.scopes, session_id=SESSION)
            except ConnectionFailed:
                raise
            except TenureError as exc:
                errors[str(exc.status)] += 1
                continue
            ms = (time.perf_counter() - t0) * 1000
            timings.append(ms)
            kinds.setdefault(q.kind, []).append(ms)
            hits += len(answer.tiers.relevant)
        wall = time.perf_counter() - wall0
    return {
        **latency_summary(timings),
        "recalls_per_s": round(len(timings) / wall, 1),
        "by_kind": {k: latency_summary(v) for k, v in sorted(kinds.items())},
        "mean_relevant_hits": round(hits / max(1, len(timings)), 2),
        "errors": dict(errors),
    }


async def sustained_recall(
    api_url: str, queries: list[Query], tenancy: Tenancy, clients: int, duration_s: float
) -> dict[str, Any]:
    """``clients`` concurrent asyncio clients doing recalls only, for ``duration_s`` seconds."""
    timings: list[float] = []
    errors: Counter[str] = Counter()
    # one connection per client, without a shared httpx pool scanning them all per request
    async with make_client(60, clients) as client:
        deadline = time.perf_counter() + duration_s
        sdks: dict[str, AsyncTenure] = {}

        def sdk(q: Query) -> AsyncTenure:
            return sdk_of(q, tenancy, sdks, lambda key: AsyncTenure(api_url, key, http_client=client, max_retries=0))

        async def one(k: int) -> None:
            i = k
            while time.perf_counter() < deadline:
                q = queries[i % len(queries)]
                i += clients
                t0 = time.perf_counter()
                try:
                    await sdk(q).recall(q.message, scopes=q.scopes, session_id=SESSION)
                except ConnectionFailed as exc:
                    errors[type(exc.__cause__).__name__] += 1
                    continue
                except TenureError as exc:
                    errors[str(exc.status)] += 1
                    continue
                timings.append((time.perf_counter() - t0) * 1000)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(clients)))
        wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "duration_s": round(wall, 1),
        "recalls": len(timings),
        "recalls_per_s": round(len(timings) / wall, 1),
        **latency_summary(timings),
        "error_count": sum(errors.values()),
        "errors": dict(errors),
    }


# ------------------------------------------------------------------------------ profiling


def start_py_spy(pid: int, seconds: int, out: Path, *, idle: bool) -> subprocess.Popen[bytes]:
    """py-spy on a running process without pausing it (``--nonblocking``); ``--idle`` keeps the
    samples of threads waiting on a socket, i.e. wall time rather than CPU time."""
    args = [str(PY_SPY), "record", "--pid", str(pid), "--duration", str(seconds), "--format", "raw"]
    args += ["--output", str(out), "--nonblocking", "--rate", "200"] + (["--idle"] if idle else [])
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _frame_key(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (file.py)``: a function, whatever line it was on."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


def read_folded(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append(([_frame_key(f) for f in frames.split(";")], int(count)))
    return stacks


def summarise_profile(stacks: list[tuple[list[str], int]], within: str, top: int = 25) -> dict[str, Any]:
    """Samples of the stacks that pass through the ``within`` function (e.g. the recall service;
    "" keeps every sample): the share of those samples each function is on the stack for
    (inclusive, counted from ``within`` down) and is the leaf of (self)."""
    kept = [(frames, n) for frames, n in stacks if any(f.startswith(within) for f in frames)]
    total = sum(n for _, n in kept)
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for frames, n in kept:
        for f in set(frames[frames.index(next(f for f in frames if f.startswith(within))) :]):
            inclusive[f] += n
        leaf[frames[-1]] += n

    def as_pct(counts: Counter[str]) -> dict[str, float]:
        return {k: round(100 * v / total, 1) for k, v in counts.most_common(top)}

    return {"within": within, "samples": total, "inclusive_pct": as_pct(inclusive), "self_pct": as_pct(leaf)}


def profile_workers(
    stack: LocalStack, seconds: int, tag: str, within: str, drive: Callable[[], Any], *, idle: bool
) -> dict[str, Any]:
    """Record every API worker while ``drive()`` runs; keep the worker that served the requests."""
    runs = {pid: RESULTS / f"{tag}-{pid}.txt" for pid in api_worker_pids(stack)}
    procs = {pid: start_py_spy(pid, seconds, out, idle=idle) for pid, out in runs.items()}
    time.sleep(1.0)  # py-spy attaches
    driven = drive()
    for proc in procs.values():
        proc.wait(timeout=seconds + 120)
    summaries = {pid: summarise_profile(read_folded(out), within) for pid, out in runs.items() if out.exists()}
    if not summaries:
        errors = {pid: (p.stderr.read() if p.stderr else b"").decode()[-300:] for pid, p in procs.items()}
        return {"error": f"py-spy produced nothing: {errors}"}
    busiest = max(summaries, key=lambda pid: summaries[pid]["samples"])
    for pid, out in runs.items():
        if pid != busiest:
            out.unlink(missing_ok=True)
    final = RESULTS / f"{tag}.txt"
    runs[busiest].replace(final)
    return {"pid": busiest, "file": str(final.relative_to(REPO)), "idle": idle, "driven": driven, **summaries[busiest]}


def receipt_probe(opensearch_url: str, namespace: str, n: int) -> dict[str, Any]:
    """What writing one injection receipt straight to the audit index costs (the path the Redis
    outbox of service/recall/receipts.py avoids, and the fallback when Redis is down or the outbox
    is full): index a real recall receipt ``n`` times into a scratch index (1 shard, like the
    audit index) with the default per-request translog fsync, then with
    ``index.translog.durability: async``."""
    client = OpenSearch(hosts=[opensearch_url], timeout=60)
    audit = AUDIT.alias(namespace)
    hit = client.search(index=audit, body={"size": 1, "query": {"term": {"action": "recall"}}})["hits"]["hits"]
    doc = hit[0]["_source"] if hit else {"action": "recall", "query": "x" * 200}
    scratch = f"{namespace}-receipt-probe"
    client.indices.create(index=scratch, body={"settings": {"number_of_shards": 1, "number_of_replicas": 0}})
    out: dict[str, Any] = {"receipt_bytes": len(orjson.dumps(doc))}
    try:
        for durability in ("request", "async"):
            client.indices.put_settings(index=scratch, body={"index": {"translog": {"durability": durability}}})
            timings = []
            for _ in range(n):
                t0 = time.perf_counter()
                client.index(index=scratch, body=doc, op_type="create", refresh="false")
                timings.append((time.perf_counter() - t0) * 1000)
            out[durability] = latency_summary(timings)
    finally:
        client.indices.delete(index=scratch)
        client.close()
    return out


# ------------------------------------------------------------------------------ compaction


COMPACTION_SCOPES = ("domain:code", "domain:code/python", "domain:writing", "project:p0", "project:p1")
COMPACTION_TYPES = (BeliefType.PREFERENCE, BeliefType.ENTITY, BeliefType.DECISION)
MAX_BUCKET = 400  # BeliefLookup.bucket reads at most 500 beliefs: stay below, so all are compacted


def compaction_users(n: int) -> list[str]:
    buckets_per_user = len(COMPACTION_SCOPES) * len(COMPACTION_TYPES)
    return [f"c{k}" for k in range(max(1, -(-n // (buckets_per_user * MAX_BUCKET))))]


def compaction_belief(k: int, users: int, spec: Spec, now: datetime, dup_fraction: float) -> Belief:
    """Belief ``k`` of the compaction tenant: recall_bench's belief ``k`` for its words, placed in
    bucket (owner, scope, type) round robin; a ``dup_fraction`` of them repeat the content of the
    previous belief of the same bucket (what the no-model path merges)."""
    stride = users * len(COMPACTION_SCOPES) * len(COMPACTION_TYPES)
    bucket = (k // users) % (len(COMPACTION_SCOPES) * len(COMPACTION_TYPES))
    base = belief_at(k, spec, now)
    duplicate = k >= stride and (k * 2654435761 % 10_000) < dup_fraction * 10_000
    content = belief_at(k - stride, spec, now).content if duplicate else base.content
    return base.model_copy(
        update={
            "id": f"c{k}",
            "owner_id": f"c{k % users}",
            "type": COMPACTION_TYPES[bucket % len(COMPACTION_TYPES)],
            "scope": [COMPACTION_SCOPES[bucket // len(COMPACTION_TYPES)]],
            "content": content,
            "epistemic_status": EpistemicStatus.ACTIVE,
            "superseded_by": None,
            "resolved_at": None,
            "participants": [],
        }
    )


@dataclass(frozen=True)
class CompactionJob:
    start: int
    stop: int
    users: int
    spec: Spec
    now: datetime
    dup_fraction: float


def compaction_lines(job: CompactionJob) -> list[bytes]:
    return [
        import_line(compaction_belief(k, job.users, job.spec, job.now, job.dup_fraction))
        for k in range(job.start, job.stop)
    ]


def compaction_batches(
    tenant: str, n: int, spec: Spec, now: datetime, dup: float, body_limits: tuple[int, int]
) -> tuple[list[Batch], list[Batch]]:
    """The tenant's ``n`` beliefs as import bodies in two halves: the first capped at
    ``body_limits[0]`` bytes per request (the API's default limit), the second at
    ``body_limits[1]`` (an operator-raised limit, so 5,000-record requests pass)."""
    users = len(compaction_users(n))
    step = 5000
    jobs = [CompactionJob(s, min(n, s + step), users, spec, now, dup) for s in range(0, n, step)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        lines = [line for chunk in pool.map(compaction_lines, jobs) for line in chunk]
    first, second = (
        [Batch(tenant, count, body) for count, body in split_bodies(half, limit, MAX_IMPORT_RECORDS)]
        for half, limit in zip((lines[: n // 2], lines[n // 2 :]), body_limits, strict=True)
    )
    return first, second


def compact_in_process(stack: LocalStack, tenant: str) -> dict[str, Any]:
    """Plan and run every bucket of the tenant sequentially with the worker's own Compactor
    (``workers.resources.build``), no model configured: exact-duplicate merging only."""
    res = resources.build(stack.settings())
    try:
        assert res.compactor.llm is None, "a compaction model is configured; this measures the no-model path"
        t0 = time.perf_counter()
        plan = res.compactor.plan(tenant_id=tenant)
        planned = time.perf_counter()
        merges = sources = 0
        for key in plan:
            report = res.compactor.compact(key)
            merges += len(report.merges)
            sources += sum(len(m["sources"]) for m in report.merges)
        done = time.perf_counter()
    finally:
        res.close()
    return {
        "path": "in-process (workers.resources.build -> Compactor.plan + Compactor.compact per bucket, sequential)",
        "buckets": len(plan),
        "beliefs_in_buckets": sum(k.count for k in plan),
        "merges": merges,
        "sources_retired": sources,
        "plan_s": round(planned - t0, 2),
        "buckets_s": round(done - planned, 1),
        "total_s": round(done - t0, 1),
        "llm_s": 0.0,
    }


def _audit_count(client: OpenSearch, namespace: str, tenant: str, action: str) -> int:
    body = {"query": {"bool": {"filter": [{"term": {"tenant_id": tenant}}, {"term": {"action": action}}]}}}
    return int(client.count(index=AUDIT.alias(namespace), body=body, routing=tenant)["count"])


def compact_through_worker(stack: LocalStack, tenant: str, admin_key: str, timeout_s: float) -> dict[str, Any]:
    """``POST /v1/admin/compaction`` -> planner task -> one task per bucket on the Celery worker;
    done when every planned bucket has written its ``compaction.run`` audit event."""
    settings = stack.settings()
    res = resources.build(settings)
    try:
        expected = len(res.compactor.plan(tenant_id=tenant))  # read-only: what the planner will find
    finally:
        res.close()
    client = build_client(settings)
    ns = settings.opensearch_namespace
    try:
        t0 = time.perf_counter()
        response = httpx.post(
            f"{stack.api_url}/v1/admin/compaction", headers={"Authorization": f"Bearer {admin_key}"}, timeout=60
        )
        response.raise_for_status()
        runs = 0
        while runs < expected and time.perf_counter() - t0 < timeout_s:
            time.sleep(0.5)
            runs = _audit_count(client, ns, tenant, "compaction.run")
        total = time.perf_counter() - t0
        merged = _audit_count(client, ns, tenant, "belief.compact")
    finally:
        client.close()
    return {
        "path": "worker (POST /v1/admin/compaction -> plan task -> bucket tasks, prefork concurrency "
        f"{stack.config.worker_concurrency}); end = last compaction.run audit event visible (1 s refresh)",
        "buckets": expected,
        "buckets_done": runs,
        "merges": merged,
        "total_s": round(total, 1),
        "llm_s": 0.0,
    }


# ------------------------------------------------------------------------------ the run


def run_proxy_bench(stack: LocalStack, out: Path) -> dict[str, Any]:
    """The existing proxy benchmark, unchanged, against this stack's OpenSearch and Redis."""
    cmd = [sys.executable, "-m", "benchmarks.proxy_bench", "--opensearch-url", stack.opensearch_url]
    redis_db5 = urlsplit(stack.redis_url)._replace(path="/5").geturl()  # a database the stack does not use
    cmd += ["--redis-url", redis_db5, "-n", "300", "--turns", "200"]
    cmd += ["--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    result: dict[str, Any] = {"command": " ".join(cmd[1:]), "returncode": done.returncode}
    result["stdout_tail"] = done.stdout[-2000:]
    if out.exists():
        result["figures"] = json.loads(out.read_text())
    else:
        result["stderr_tail"] = done.stderr[-2000:]
    return result


class Report:
    """The JSON result, rewritten after every phase (a long run that dies keeps what it measured)."""

    def __init__(self, path: Path, data: dict[str, Any]):
        self.path = path
        self.data = data
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def print_stage(stage: dict[str, Any]) -> None:
    s, c, i = stage["sequential"], stage["sustained"], stage["ingest"]
    print(
        f"  {stage['beliefs']:>9,} beliefs | ingest {i['beliefs_per_s']:.0f}/s ({i['records_per_request_mean']:.0f}"
        f"/request) | sequential p50 {s['p50_ms']} p95 {s['p95_ms']} p99 {s['p99_ms']} max {s['max_ms']} ms"
        f" ({s['recalls_per_s']}/s) | {c['clients']} clients: {c['recalls_per_s']}/s p50 {c['p50_ms']}"
        f" p99 {c['p99_ms']} ms, {c['error_count']} errors",
        flush=True,
    )
    print(
        "    by kind (p50/p95/p99 ms): "
        + ", ".join(f"{k} n={v['n']} {v['p50_ms']}/{v['p95_ms']}/{v['p99_ms']}" for k, v in s["by_kind"].items()),
        flush=True,
    )


def verdicts(data: dict[str, Any]) -> dict[str, Any]:
    """Each target of issue 6 against the largest stage (and p50 growth from the smallest)."""
    stages = data.get("stages", [])
    if not stages:
        return {}
    first, last = stages[0], stages[-1]
    growth = last["sequential"]["p50_ms"] / first["sequential"]["p50_ms"]
    ingest = min(s["ingest"]["beliefs_per_s"] for s in stages)
    sustained = last["sustained"]
    return {
        "recall_p50": {"measured": last["sequential"]["p50_ms"], "met": last["sequential"]["p50_ms"] <= 5.0},
        "recall_p99": {"measured": last["sequential"]["p99_ms"], "met": last["sequential"]["p99_ms"] <= 20.0},
        "sustained": {
            "measured": sustained["recalls_per_s"],
            "errors": sustained["error_count"],
            "met": sustained["recalls_per_s"] >= TARGETS["recalls_per_s"] and sustained["error_count"] == 0,
        },
        "ingest_min_stage": {"measured": ingest, "met": ingest >= TARGETS["ingest_per_s"]},
        "p50_growth": {"measured": round(growth, 2), "met": growth < TARGETS["p50_growth"]},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_corpus_arguments(parser)
    add_stack_arguments(parser, api_workers=2, heap="4g")
    parser.add_argument("--provision-concurrency", type=int, default=64, help="admin requests in flight")
    parser.add_argument("--importers", type=int, default=4, help="concurrent import clients")
    parser.add_argument("--max-body-bytes", type=int, default=API_DEFAULT_BODY_BYTES, help="per import request")
    add_recall_arguments(parser, clients=32)  # --queries, --warmup, --clients (of the sustained run)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of the sustained run")
    parser.add_argument("--profile-s", type=int, default=20, help="py-spy seconds at the last stage (0: off)")
    parser.add_argument("--compaction-beliefs", type=int, default=100_000, help="0: skip compaction")
    parser.add_argument("--dup-fraction", type=float, default=0.02, help="exact duplicates in the compaction tenant")
    parser.add_argument("--no-proxy", action="store_true", help="skip benchmarks.proxy_bench at the end")
    parser.add_argument("--out", type=Path, help="default benchmarks/results/ops-<UTC time>.json")
    parser.add_argument("--keep", action="store_true", help="keep the stack's state directory")
    return parser.parse_args(argv)


def stack_config(args: argparse.Namespace, root: Path) -> StackConfig:
    env = {
        # the beat would otherwise compact every tenant of the corpus mid-run (default every 30 min)
        "TENURE_LOOP_COMPACTION_INTERVAL_S": "86400",
        # an operator setting: lets the compaction tenant's second half arrive in 5,000-record bodies
        "TENURE_API_MAX_BODY_BYTES": str(OPERATOR_BODY_BYTES),
    }
    return StackConfig(
        root=root,
        opensearch_url=args.opensearch_url,
        redis_url=args.redis_url,
        opensearch_heap=args.heap,
        api_workers=args.api_workers,
        env=env,
    )


def run_stage(
    stack: LocalStack, args: argparse.Namespace, tenancy: Tenancy, loaded: int, size: int, spec: Spec, now: datetime
) -> dict[str, Any]:
    print(f"generating beliefs {loaded:,}..{size:,} ...", flush=True)
    t0 = time.perf_counter()
    batches = stage_batches(loaded, size, spec, now, args.max_body_bytes)
    generate_s = time.perf_counter() - t0
    print(f"  {len(batches):,} import requests generated in {generate_s:.0f}s; importing ...", flush=True)
    meter = PhaseMeter(stack)
    ingest_result = asyncio.run(ingest(stack.api_url, batches, tenancy.admins, args.importers))
    ingest_result["phase"] = meter.stop()
    ingest_result["generate_s"] = round(generate_s, 1)
    del batches
    stage: dict[str, Any] = {"beliefs": size, "ingest": ingest_result, "memory_after_ingest": memory_snapshot(stack)}
    queries = draw_queries(args.warmup + args.queries, size, spec, now, seed=size)
    meter = PhaseMeter(stack)
    stage["sequential"] = sequential_recall(stack.api_url, queries, tenancy, args.warmup)
    stage["sequential"]["phase"] = meter.stop()
    meter = PhaseMeter(stack)
    stage["sustained"] = asyncio.run(
        sustained_recall(stack.api_url, queries[args.warmup :], tenancy, args.clients, args.duration)
    )
    stage["sustained"]["phase"] = meter.stop()
    stage["memory"] = memory_snapshot(stack)
    stage["index"] = index_stats(stack)
    return stage


def index_stats(stack: LocalStack) -> dict[str, Any]:
    client = OpenSearch(hosts=[stack.opensearch_url], timeout=60)
    try:
        alias = BELIEFS.alias(stack.config.namespace)
        stats = client.indices.stats(index=alias, metric="docs,store,segments")["_all"]["primaries"]
    finally:
        client.close()
    return {
        "docs": stats["docs"]["count"],
        "size_mb": round(stats["store"]["size_in_bytes"] / 1e6, 1),
        "segments": stats["segments"]["count"],
    }


def run_profiles(
    stack: LocalStack, args: argparse.Namespace, tenancy: Tenancy, loaded: int, spec: Spec, now: datetime, prefix: str
) -> dict[str, Any]:
    """Separate runs after the measured ones, so py-spy's sampling does not skew the figures:
    wall-clock (``--idle``) and CPU profiles of the worker serving sequential recalls, the cost of
    one receipt write on its own, and a wall-clock profile of small per-tenant imports. Profiles
    are saved as ``results/<prefix>-<what>.txt``."""
    queries = draw_queries(20_000, loaded, spec, now, seed=loaded + 1)

    def drive_recalls() -> dict[str, Any]:
        # as many sequential recalls as fit into the profile window
        end = time.perf_counter() + args.profile_s - 2
        n = 0
        with httpx.Client(timeout=60) as client:
            sdk = sync_callers(stack.api_url, client, tenancy)
            while time.perf_counter() < end:
                q = queries[n % len(queries)]
                recall_unjudged(sdk(q), q)
                n += 1
        return {"recalls": n}

    # the next ~10 beliefs of every tenant (ids after the corpus): the small-request import case
    extra = stage_batches(loaded, loaded + 10 * spec.tenants, spec, now, args.max_body_bytes)

    def drive_imports() -> dict[str, Any]:
        return asyncio.run(ingest(stack.api_url, extra, tenancy.admins, args.importers, args.profile_s - 2))

    seconds = args.profile_s
    return {
        # wall clock of the recall service call (threadpool thread): recall, receipt, rendering
        "recall_wall": profile_workers(stack, seconds, f"{prefix}-recall-wall", RECALL_FRAME, drive_recalls, idle=True),
        # CPU of the whole worker: event loop (HTTP, auth, JSON) and the threadpool
        "recall_cpu": profile_workers(stack, seconds, f"{prefix}-recall-cpu", "", drive_recalls, idle=False),
        "receipt_probe": receipt_probe(stack.opensearch_url, stack.config.namespace, 300),
        "import_wall": profile_workers(stack, seconds, f"{prefix}-import-wall", IMPORT_FRAME, drive_imports, idle=True),
    }


def run_compaction(stack: LocalStack, args: argparse.Namespace, spec: Spec, now: datetime) -> dict[str, Any]:
    """Two identical tenants: one compacted in-process (sequential, per-phase timing), one through
    the admin trigger and the Celery worker (the deployed path)."""
    n = args.compaction_beliefs
    users = compaction_users(n)
    projects = [f"p{k}" for k in range(spec.projects_per_tenant)]
    tenancy = asyncio.run(
        provision(
            stack.api_url, stack.operator_key(), {"cmp-a": users, "cmp-b": users}, projects, args.provision_concurrency
        )
    )
    out: dict[str, Any] = {"beliefs_per_tenant": n, "users": len(users), "dup_fraction": args.dup_fraction}
    limits = (args.max_body_bytes, OPERATOR_BODY_BYTES)
    for tenant in ("cmp-a", "cmp-b"):
        halves = compaction_batches(tenant, n, spec, now, args.dup_fraction, limits)
        for label, part in zip(("default_body_limit", "5000_records"), halves, strict=True):
            meter = PhaseMeter(stack)
            result = asyncio.run(ingest(stack.api_url, part, tenancy.admins, args.importers))
            out.setdefault("ingest", {})[f"{tenant}/{label}"] = {**result, "phase": meter.stop()}
    meter = PhaseMeter(stack)
    out["in_process"] = {**compact_in_process(stack, "cmp-a"), "phase": meter.stop()}
    meter = PhaseMeter(stack)
    out["worker"] = {
        **compact_through_worker(stack, "cmp-b", tenancy.admins["cmp-b"], timeout_s=3600),
        "phase": meter.stop(),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = corpus_sizes(args)
    spec = Spec(tenants=args.tenants, users_per_tenant=args.users_per_tenant)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    root = Path(tempfile.mkdtemp(prefix="ops-bench-"))
    report = Report(
        args.out or RESULTS / f"ops-{started:%Y%m%dT%H%MZ}.json",
        {
            "benchmark": "operations figures over HTTP (issue 6)",
            "command": "python -m benchmarks.http_scale_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "started_at": started.isoformat(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "spec": asdict(spec),
            "loadavg_before": loadavg(),
            "stages": [],
        },
    )
    data = report.data
    print(f"starting the stack in {root} (load average {data['loadavg_before']}) ...", flush=True)
    stack = LocalStack(stack_config(args, root)).start()
    try:
        data["stack"] = {"api_url": stack.api_url, "opensearch": stack.opensearch_url, "owned": stack.owned}
        data["memory_idle"] = memory_snapshot(stack)
        tenants = {f"t{t:04d}": [f"u{u}" for u in range(spec.users_per_tenant)] for t in range(spec.tenants)}
        projects = [f"p{k}" for k in range(spec.projects_per_tenant)]
        meter = PhaseMeter(stack)
        tenancy = asyncio.run(
            provision(stack.api_url, stack.operator_key(), tenants, projects, args.provision_concurrency)
        )
        data["provisioning"] = {"tenants": len(tenants), "keys": len(tenancy.keys), **meter.stop()}
        print(f"provisioned {len(tenants)} tenants, {len(tenancy.keys)} keys in {data['provisioning']['wall_s']}s")
        report.save()
        loaded = 0
        for size in sizes:
            stage = run_stage(stack, args, tenancy, loaded, size, spec, now)
            loaded = size
            data["stages"].append(stage)
            print_stage(stage)
            report.save()
        if args.profile_s:
            print("profiling the API worker (py-spy) ...", flush=True)
            data["profiles"] = run_profiles(stack, args, tenancy, loaded, spec, now, f"{report.path.stem}-profile")
            report.save()
        if args.compaction_beliefs:
            print(f"compaction: two tenants of {args.compaction_beliefs:,} beliefs ...", flush=True)
            data["compaction"] = run_compaction(stack, args, spec, now)
            timing = data["compaction"]
            print(f"  in-process {timing['in_process']['total_s']}s, worker {timing['worker']['total_s']}s")
            report.save()
        if not args.no_proxy:
            print("proxy overhead (benchmarks.proxy_bench) ...", flush=True)
            data["proxy"] = run_proxy_bench(stack, RESULTS / f"ops-proxy-{started:%Y%m%dT%H%MZ}.json")
            print(data["proxy"]["stdout_tail"][-800:])
        data["memory_end"] = memory_snapshot(stack)
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        data["loadavg_after"] = loadavg()
        data["finished_at"] = datetime.now(UTC).isoformat()
        data["verdicts"] = verdicts(data)
        report.save()
        print(f"load average before {data['loadavg_before']}, after {data['loadavg_after']}; wrote {report.path}")
    print(json.dumps(data["verdicts"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
