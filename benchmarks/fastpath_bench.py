"""Recall over HTTP before and after the fast-path changes (issue 16), same machine, one run.

For each corpus size (default 10k, 100k, 1M beliefs over 1,000 tenants, ``recall_bench``'s corpus)
and each *variant* (a source tree plus environment: "before" is a checkout of the code before the
changes, "after" this tree, with single changes switched off by their settings), it starts the API
under uvicorn against one OpenSearch node and one Redis and measures ``POST /v1/recall`` with the
query's own tenant user's API key (rate limit on, defaults):

1. **sequential**: one keep-alive client, p50/p95/p99 after a warm-up;
2. **paced**: an open-loop run at ``--rate`` recalls/s (300) for ``--paced-s`` seconds, latency
   from the scheduled send time (so queueing counts), errors;
3. **ceiling**: ``--clients`` closed-loop clients for ``--ceiling-s`` seconds: recalls/s;
4. **CPU per recall** during the sequential run, from ``/proc``: OpenSearch (the JVM), the API
   (uvicorn and its workers), the receipt drain (Celery beat and a cheap-queue worker, as a
   deployment runs them: :class:`ReceiptDrain`), Redis and this client, in ms of CPU per recall;
   plus the rest of the machine (other people's work on a shared box), and the load average
   before and after. The receipt outbox's depth is recorded before and after each phase.
5. **run queue** in the paced pass, per recall and component: the time its threads spent runnable
   but waiting for a CPU, and over how many scheduling slices (``benchmarks/run_queue.py``): on
   two shared cores, how much of the paced latency is the wait for a core rather than work.

Each size has its own namespace on the node (``fastpath-10k``, ``fastpath-100k``, ``fastpath-1m``:
beliefs 0..N-1 of the corpus and the accounts), built once with bulk indexing under ``--state-dir``
and reused by the next run in any order (nothing is deleted unless ``--fresh``), so a later run
can measure 1M first and 10k last without reloading: generating 1M beliefs takes minutes.
Accounts (1,000 tenants x 5 users, one API key each, every user granted projects p0..p4) are
bulk-written in the storage layer's own shapes with deterministic keys. A variant whose source
tree has its own ``.venv`` runs under that interpreter (the code before issue 16 needs the
dependencies of its day, e.g. authlib), otherwise under this one.

    # the whole run (own OpenSearch 2g heap + Redis under /tmp/tenure-fastpath; reused next time)
    git worktree add --detach /tmp/tenure-before ed3a7e7      # the code before issue 16
    .venv/bin/python -m benchmarks.fastpath_bench --variant before=/tmp/tenure-before \\
        --variant after-no-tier-cache=.:TENURE_RECALL_TIER_CACHE_ENTRIES=0 --variant after=.
    # smoke run
    .venv/bin/python -m benchmarks.fastpath_bench --sizes 10000 --queries 300 --paced-s 5 --ceiling-s 5

This is a benchmark, not a test: it prints figures and writes a JSON (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
import redis
from opensearchpy import OpenSearch, helpers
from tenure_client import AsyncTenure, ConnectionFailed, Tenure, TenureError
from tenure_client.keepalive import KeepAliveSyncTransport, KeepAliveTransport

from benchmarks import pacer, run_queue, thread_bursts
from benchmarks.machine_speed import speed_check, speed_line
from benchmarks.recall_bench import Query, Spec, draw_queries, draw_sessions, load_range, loadavg, tenant_of
from deploy.devstack import Service, free_port, start_opensearch, start_redis
from deploy.localstack import celery_beat_args, celery_worker_args
from loadtest.__main__ import CpuMeter, process_cpu_s
from loadtest.http import make_client
from loadtest.stats import latency_block
from service import redis_keys
from service.api.http_protocol import uvicorn_http_option
from service.auth import keys
from service.config import Settings
from service.domain.accounts import ApiKeyRecord, TenantRecord, UserRecord
from service.domain.principal import Principal, Role
from service.storage.accounts import KEY_ROUTING
from service.storage.client import build_client
from service.storage.templates import ACCOUNTS, BELIEFS, FAMILIES, apply_templates

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
NAMESPACE = "fastpath"
PEPPER = "fastpath-bench-pepper"
NOW = datetime(2026, 11, 1, tzinfo=UTC)  # the corpus's clock: the same beliefs on every run
# The paced run's client keeps at most this many recalls unanswered (at 300/s, 64 in flight is
# over 200 ms of queue: far past the p99 target already).
MAX_IN_FLIGHT = 64
TIMEOUT_S = 30.0


@dataclass
class Variant:
    name: str
    source: Path
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``name=path[:VAR=value[,VAR=value]]``"""
        name, _, rest = text.partition("=")
        path, _, env_text = rest.partition(":")
        env = dict(item.split("=", 1) for item in env_text.split(",") if item)
        variant = cls(name, Path(path or ".").resolve(), env)
        variant.require_analysis_build()
        return variant

    def require_analysis_build(self) -> None:
        """Refuse a tree that analyses recall messages in process but whose analysis class was never
        built (``deploy/opensearch/classes`` is ignored by git: a fresh worktree has none). Its API
        would quietly send every message to the node instead, ~0.6 ms of node CPU and ~0.65 ms of
        wall time per recall, and an A/B against it would credit that to the change measured."""
        deploy = self.source / "deploy" / "opensearch"
        if "TENURE_RECALL_ANALYSIS_CLASSPATH" in self.env or not (deploy / "QueryAnalysis.java").exists():
            return
        if not (deploy / "classes" / "QueryAnalysis.class").exists():
            raise SystemExit(
                f"variant {self.name}: {deploy}/classes has no QueryAnalysis.class, so its recalls would be "
                "analysed by the node; run scripts/setup.sh in that tree, or link deploy/opensearch/lib and "
                "deploy/opensearch/classes from a tree built from the same QueryAnalysis.java"
            )

    def app_factory(self) -> str:
        """The tree's app factory: ``service.app`` since the composition root left the api package
        (a8d8b24), ``service.api.app`` in older trees such as the code before issue 16."""
        new_root = (self.source / "service" / "app.py").exists()
        return "service.app:create_app" if new_root else "service.api.app:create_app"

    def server_options(self) -> list[str]:
        """uvicorn options the tree is served with in production: its HTTP protocol class (the JSON
        400s, the keep-alive floor) when it has one."""
        own = (self.source / "service" / "api" / "http_protocol.py").exists()
        return ["--http", uvicorn_http_option()] if own else []

    def python(self) -> Path:
        """The source tree's own interpreter if it has one (its dependencies of the day), else ours."""
        own = self.source / ".venv" / "bin" / "python"
        return own if own.exists() else Path(sys.executable)


# ------------------------------------------------------------------------------ state: corpus, accounts


def key_of(tenant: str, user: str) -> tuple[str, str]:
    """A deterministic API key (id, plaintext) per user, so a reused state needs no key file."""
    digest = hashlib.sha256(f"fastpath:{tenant}:{user}".encode()).hexdigest()
    secret = hashlib.sha256(digest.encode()).hexdigest()[:43]
    key_id = digest[:16]
    return key_id, f"{keys.PREFIX}{key_id}_{secret}"


def namespace_of(size: int) -> str:
    """One namespace per corpus size: ``fastpath-10k``, ``fastpath-1m``, ``fastpath-2500``."""
    for unit, scale in (("m", 1_000_000), ("k", 1_000)):
        if size % scale == 0:
            return f"{NAMESPACE}-{size // scale}{unit}"
    return f"{NAMESPACE}-{size}"


def account_actions(spec: Spec, namespace: str) -> Any:
    alias = ACCOUNTS.alias(namespace)
    projects = [f"p{p}" for p in range(spec.projects_per_tenant)]
    for t in range(spec.tenants):
        tenant = f"t{t:04d}"
        record = TenantRecord(tenant_id=tenant, name=tenant)
        yield {"_index": alias, "_id": f"tenant:{tenant}", "_routing": tenant,
               "_source": {"kind": "tenant", **record.model_dump(mode="json")}}  # fmt: skip
        for u in range(spec.users_per_tenant):
            user = f"u{u}"
            grants = {"roles": [Role.MEMBER], "projects": projects, "teams": []}
            urec = UserRecord(tenant_id=tenant, user_id=user, **grants)
            yield {"_index": alias, "_id": f"user:{tenant}:{user}", "_routing": tenant,
                   "_source": {"kind": "user", **urec.model_dump(mode="json")}}  # fmt: skip
            key_id, plaintext = key_of(tenant, user)
            krec = ApiKeyRecord(
                key_id=key_id, tenant_id=tenant, user_id=user, key_hash=keys.hash_key(plaintext, PEPPER), **grants
            )
            yield {"_index": alias, "_id": f"key:{key_id}", "_routing": KEY_ROUTING,
                   "_source": {"kind": "key", **krec.model_dump(mode="json")}}  # fmt: skip


def ensure_state(client: OpenSearch, state: Path, spec: Spec, size: int) -> dict[str, Any]:
    """Templates, accounts and beliefs 0..size-1 in the size's own namespace (loaded once, reused);
    returns the namespace's record (load time)."""
    namespace = namespace_of(size)
    marker = state / "fastpath-state.json"
    states: dict[str, Any] = json.loads(marker.read_text()) if marker.exists() else {}
    done: dict[str, Any] = states.setdefault(namespace, {"loaded": 0})
    # a restarted node replays its translog first (minutes on a busy machine)
    client.cluster.health(wait_for_status="yellow", timeout="1800s", request_timeout=1800)
    apply_templates(client, namespace, FAMILIES)
    if not done.get("accounts"):
        t0 = time.perf_counter()
        actions = account_actions(spec, namespace)
        for ok, item in helpers.streaming_bulk(client, actions, chunk_size=2000, raise_on_error=False):
            if not ok:
                raise RuntimeError(f"account not written: {item}")
        client.indices.refresh(index=ACCOUNTS.alias(namespace))
        done["accounts"] = spec.tenants * spec.users_per_tenant
        print(f"{namespace}: {done['accounts']} users with keys in {time.perf_counter() - t0:.0f} s", flush=True)
        marker.write_text(json.dumps(states))
    trim_to(client, namespace, done["loaded"], spec)
    if done["loaded"] < size:
        print(f"{namespace}: loading beliefs {done['loaded']:,} -> {size:,} (bulk, merge) ...", flush=True)
        took = load_range(client, BELIEFS.alias(namespace), done["loaded"], size, spec, NOW, chunk=2000)
        done["load_s"] = round(took + done.get("load_s", 0.0), 1)
        done["loaded"] = size
        marker.write_text(json.dumps(states))
        print(f"  {size:,} loaded in {took:.0f} s", flush=True)
    return done


def trim_to(client: OpenSearch, namespace: str, loaded: int, spec: Spec) -> None:
    """An interrupted load leaves documents past the recorded size (and refresh off): delete them,
    so a stage measures exactly the corpus it names."""
    alias = BELIEFS.alias(namespace)
    client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "1s"}})
    client.indices.refresh(index=alias, request_timeout=600)
    if int(client.count(index=alias)["count"]) <= loaded:
        return
    wanted = [f"{tenant_of(i, spec)}:b{i}" for i in range(loaded)]
    body = {"query": {"bool": {"must_not": [{"ids": {"values": wanted}}]}}}
    client.delete_by_query(index=alias, body=body, refresh=True, request_timeout=3600, conflicts="proceed")
    client.indices.forcemerge(index=alias, max_num_segments=1, request_timeout=3600)
    print(f"{namespace}: trimmed the corpus back to {loaded:,} beliefs", flush=True)


def segments(client: OpenSearch, namespace: str) -> int:
    rows = client.cat.segments(index=BELIEFS.alias(namespace), format="json")
    return len(rows)


# ------------------------------------------------------------------------------ the API under test


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Api:
    def __init__(self, variant: Variant, opensearch_url: str, redis_url: str, namespace: str, workers: int, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        env = {
            **os.environ,
            "PYTHONPATH": str(variant.source),
            "TENURE_OPENSEARCH_URL": opensearch_url,
            "TENURE_REDIS_URL": redis_url,
            "TENURE_OPENSEARCH_NAMESPACE": namespace,
            "TENURE_AUTH_API_KEY_PEPPER": PEPPER,
            "TENURE_LOOP_COMPACTION_INTERVAL_S": "86400",
            "TENURE_CELERY_QUEUE_PREFIX": namespace,
            **variant.env,
        }
        args = [str(variant.python()), "-m", "uvicorn", "--factory", variant.app_factory(),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers),
                "--no-access-log", "--log-level", "warning", *variant.server_options()]  # fmt: skip
        self.log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(args, cwd=variant.source, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.drain = ReceiptDrain(variant, env, redis_url, namespace, self.log, log.with_suffix(".beat-schedule"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # /healthz: up, whatever the variant's readiness rules
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the API of {variant.name} did not start (see {log})")

    def pids(self) -> list[int]:
        return [self.process.pid, *_children(self.process.pid)]

    def worker_cpu(self) -> dict[int, float]:
        """The CPU seconds so far of uvicorn's child processes (its workers; also multiprocessing's
        resource tracker, idle), or of uvicorn itself when it serves in process."""
        return {pid: process_cpu_s(pid) for pid in _children(self.process.pid) or [self.process.pid]}

    def worker_cpu_since(self, before: dict[int, float]) -> list[float]:
        """Each of those processes' CPU seconds since ``before`` (a :meth:`worker_cpu`)."""
        return [round(process_cpu_s(pid) - cpu, 2) for pid, cpu in before.items()]

    def first_worker(self) -> int:
        """The pid of uvicorn's first worker process (the one of a one-worker API), or uvicorn's own
        when it serves in process: whose CPU is the API's."""
        return (_children(self.process.pid) or [self.process.pid])[0]

    def stop(self) -> None:
        self.drain.stop()
        _terminate(self.process)
        self.log.close()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


class ReceiptDrain:
    """What a deployment runs beside the API to empty the injection-receipt outbox
    (``service/recall/receipts.py``): Celery beat, whose ``audit.drain_receipts`` tick comes every
    second, and one Celery worker on the cheap queue, both from the variant's tree. Without them
    the outbox fills (100,000 receipts by default, a few runs) and from then on every recall
    writes its receipt straight to the audit index, the designed fallback: the figures of a
    deployment whose drainer is down (+2.5 ms at p50 at 1M, measured 2026-12-01). The heavy queue
    (compaction, retention) is left unconsumed, so no sweep over the corpus runs during a phase;
    its ticks expire. Their CPU is counted as ``drain``."""

    def __init__(
        self, variant: Variant, env: dict[str, str], redis_url: str, namespace: str, log: IO[bytes], schedule: Path
    ):
        self.redis = redis.Redis.from_url(redis_url)
        self.key = redis_keys.receipts_outbox(namespace)
        schedule.unlink(missing_ok=True)
        worker = celery_worker_args(namespace, name="bench-drain", loglevel="WARNING", queues=("cheap",))
        beat = celery_beat_args(schedule, loglevel="WARNING")
        self.processes = [
            subprocess.Popen([str(variant.python()), "-m", *args], cwd=variant.source, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
            for args in (worker, beat)
        ]  # fmt: skip

    def pending(self) -> int:
        return int(self.redis.xlen(self.key))

    def wait_empty(self, timeout_s: float = 900.0, below: int = 1000) -> float:
        """Wait until an earlier run's backlog is drained (a full outbox would make every recall
        write its receipt synchronously); returns the seconds it took."""
        t0 = time.monotonic()
        while self.pending() >= below:
            if time.monotonic() - t0 > timeout_s:
                left = self.pending()
                raise RuntimeError(f"the receipt outbox {self.key} still holds {left} after {timeout_s:.0f} s")
            if any(p.poll() is not None for p in self.processes):
                raise RuntimeError("the receipt drain (Celery worker or beat) exited; see the API log")
            time.sleep(1)
        return round(time.monotonic() - t0, 1)

    def pids(self) -> list[int]:
        return [pid for p in self.processes for pid in (p.pid, *_children(p.pid))]

    @contextlib.contextmanager
    def paused(self, pause: bool = True) -> Iterator[None]:
        """With ``pause``, the worker and beat stopped (``SIGSTOP``) for the block and continued
        after it: receipts wait in the outbox meanwhile (it holds 100,000), and are drained once the
        block is over. A diagnostic (``--paced-drain paused``): what the drain's ticks cost a pass."""
        stopped = self.pids() if pause else []
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        for process in self.processes:
            _terminate(process)
        self.redis.close()


class BurstWatch:
    """``--paced-thread-bursts``: the thread sampler around the paced pass, and the node's thread
    names read before and after it (``benchmarks/thread_bursts.py``). Does nothing without a path."""

    def __init__(self, path: Path | None, components: dict[str, list[int]], node_pids: list[int]):
        self.path = path
        self.components = components
        self.node_pids = node_pids
        self.jvm_names: dict[int, str] = {}
        self._sampling = contextlib.ExitStack()

    def _read_node_names(self) -> None:
        for pid in self.node_pids:
            self.jvm_names.update(thread_bursts.jvm_thread_names(pid))

    def __enter__(self) -> BurstWatch:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._read_node_names()
            self._sampling.enter_context(thread_bursts.sampling(self.components, self.path))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            self._sampling.close()
            self._read_node_names()

    def summarise_into(self, paced_result: dict[str, Any]) -> None:
        if self.path is None or paced_result.get("first_due_utc") is None:
            return
        try:
            ticks, names = thread_bursts.read_samples(self.path)
        except (OSError, ValueError) as exc:  # the sampler died: the pass's own figures stand
            paced_result["thread_bursts"] = {"error": f"no samples: {exc}"}
            return
        first_due = datetime.fromisoformat(paced_result["first_due_utc"]).timestamp()
        paced_result["thread_bursts"] = thread_bursts.summarise(
            ticks, names, paced_result["timeline"], first_due, jvm_names={"opensearch": self.jvm_names}
        )


def ask_aof_rewrite(rds: redis.Redis[bytes]) -> str:
    """``BGREWRITEAOF``: Redis's answer (``True``), or why it refused (one still under way)."""
    try:
        return str(rds.bgrewriteaof())
    except redis.RedisError as exc:
        return f"refused: {exc}"


class AofRewrite:
    """A diagnostic (``--paced-aof-rewrite-at-s``): Redis asked to rewrite its append-only file
    (``BGREWRITEAOF``, what it does by itself each time the file doubled) ``at_s`` seconds into the
    block, from a timer thread; :meth:`outcome` says when it was asked and what Redis answered
    (a rewrite already under way refuses a second one)."""

    def __init__(self, rds: redis.Redis[bytes], at_s: float | None):
        self.redis, self.at_s = rds, at_s
        self.timer: threading.Timer | None = None
        self.asked_utc: str | None = None
        self.answer: str | None = None

    def __enter__(self) -> AofRewrite:
        if self.at_s is not None:
            self.timer = threading.Timer(self.at_s, self._ask)
            self.timer.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer.join()

    def _ask(self) -> None:
        self.asked_utc = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.answer = ask_aof_rewrite(self.redis)

    def outcome(self) -> dict[str, Any] | None:
        if self.at_s is None:
            return None
        return {"at_s": self.at_s, "asked_utc": self.asked_utc, "answer": self.answer}


class Callers:
    """One SDK client per query's user (their own API key, as the service sees real clients), all
    on one shared connection pool; retries off, so every 429/503 is counted, not waited out. The
    answer is read as decoded JSON (``recall_json``), not into the SDK's models: every variant's
    answer is read alike (the code before issue 16 answers in the injection shape of before
    2026-11-30) and the client spends no CPU validating it.

    The pool is ``http`` (one ``httpx.Client`` shared by every user's SDK client) or ``transport``
    (shared by the ``httpx.Client`` each user's SDK client creates: over the SDK's keep-alive
    transport the SDK then calls the transport directly, as an application that hands the SDK
    that transport does)."""

    def __init__(self, url: str, http: httpx.Client | None = None, *, transport: httpx.BaseTransport | None = None):
        if (http is None) == (transport is None):
            raise ValueError("one of http and transport")
        self.url, self.http, self.transport = url, http, transport
        self.clients: dict[tuple[str, str], Tenure] = {}

    def recall(self, q: Query) -> None:
        who = (q.principal.tenant_id, q.principal.user_id)
        client = self.clients.get(who)
        if client is None:
            key = key_of(*who)[1]
            client = self.clients[who] = (
                Tenure(self.url, key, http_client=self.http, max_retries=0)
                if self.http is not None
                else Tenure(self.url, key, timeout=TIMEOUT_S, transport=self.transport, max_retries=0)
            )
        client.recall_json(q.message, scopes=q.scopes)


class AsyncCallers:
    """:class:`Callers` for the asyncio runs."""

    def __init__(
        self, url: str, http: httpx.AsyncClient | None = None, *, transport: httpx.AsyncBaseTransport | None = None
    ):
        if (http is None) == (transport is None):
            raise ValueError("one of http and transport")
        self.url, self.http, self.transport = url, http, transport
        self.clients: dict[tuple[str, str], AsyncTenure] = {}

    async def recall(self, q: Query) -> None:
        who = (q.principal.tenant_id, q.principal.user_id)
        client = self.clients.get(who)
        if client is None:
            key = key_of(*who)[1]
            client = self.clients[who] = (
                AsyncTenure(self.url, key, http_client=self.http, max_retries=0)
                if self.http is not None
                else AsyncTenure(self.url, key, timeout=TIMEOUT_S, transport=self.transport, max_retries=0)
            )
        await client.recall_json(q.message, scopes=q.scopes)


@contextlib.asynccontextmanager
async def lanes_to(api: Api, connections: int) -> AsyncIterator[AsyncCallers]:
    """Callers over ``connections`` keep-alive connections to the API, one request on each at a
    time (loadtest's :class:`~loadtest.http.LaneTransport`: one httpx pool of that many
    connections would scan them all per request and cost the client more CPU than the server)."""
    async with make_client(TIMEOUT_S, connections) as http:
        yield AsyncCallers(api.url, http)


@contextlib.asynccontextmanager
async def keepalive_to(api: Api, connections: int) -> AsyncIterator[AsyncCallers]:
    """Callers over the SDK's lean transport (``tenure_client.keepalive``), at most ``connections``
    sockets, one request on each at a time like :func:`lanes_to`, at about half the client's CPU
    per request (``benchmarks/sdk_transport_ab.py``)."""
    transport = KeepAliveTransport(max_connections=connections)
    async with transport:
        yield AsyncCallers(api.url, transport=transport)


def cause_of(error: TenureError) -> str:
    """Why a recall failed, as the JSON's ``error_causes`` name it: ``HTTP 429`` for an answer,
    httpx's exception name (``ReadTimeout``, ``ConnectError``, ...) when none came."""
    if isinstance(error, ConnectionFailed) and error.__cause__ is not None:
        return type(error.__cause__).__name__
    return f"HTTP {error.status}" if error.status else error.code


class _Sequence:
    """The bookkeeping of a sequential pass: the deadline, the timed recalls, the errors."""

    def __init__(self, warmup: int, max_s: float | None):
        self.warmup = warmup
        self.deadline = time.monotonic() + max_s if max_s else None
        self.timings: list[float] = []
        self.errors = 0
        self.sent = 0

    def over(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def done(self, i: int, t0: float, failed: bool) -> None:
        self.sent += 1
        if failed:
            self.errors += 1
        elif i >= self.warmup:
            self.timings.append((time.perf_counter() - t0) * 1000)

    def figures(self, total: int) -> tuple[dict[str, Any], int]:
        capped = self.sent < total
        return {
            **latency_block(self.timings),
            "errors": self.errors,
            "sent": self.sent,
            "stopped_at_max_s": capped,
        }, self.sent


def sequential(
    api: Api,
    queries: list[Query],
    warmup: int,
    max_s: float | None,
    transport: httpx.BaseTransport | None = None,
) -> tuple[dict[str, Any], int]:
    """One keep-alive client (the synchronous SDK, over ``transport``: httpx's own by default,
    through one shared ``httpx.Client``; the SDK's ``KeepAliveSyncTransport``, which the SDK calls
    directly), one recall after the other; the first ``warmup`` are not timed. ``max_s``: stop sending after
    that many seconds (a variant at seconds per recall would otherwise hold the run for an hour);
    the result says how many were sent. Returns the figures and the number of recalls sent."""
    run = _Sequence(warmup, max_s)
    with contextlib.ExitStack() as stack:
        if isinstance(transport, KeepAliveSyncTransport):
            callers = Callers(api.url, transport=stack.enter_context(transport))
        else:
            http = stack.enter_context(httpx.Client(base_url=api.url, timeout=TIMEOUT_S, transport=transport))
            callers = Callers(api.url, http)
        for i, q in enumerate(queries):
            if run.over():
                break
            t0, failed = time.perf_counter(), False
            try:
                callers.recall(q)
            except TenureError:
                failed = True
            run.done(i, t0, failed)
    return run.figures(len(queries))


async def sequential_lean(
    api: Api, queries: list[Query], warmup: int, max_s: float | None
) -> tuple[dict[str, Any], int]:
    """:func:`sequential` over the async SDK and its lean transport (``--seq-client keepalive``)."""
    run = _Sequence(warmup, max_s)
    async with keepalive_to(api, 1) as callers:
        for i, q in enumerate(queries):
            if run.over():
                break
            t0, failed = time.perf_counter(), False
            try:
                await callers.recall(q)
            except TenureError:
                failed = True
            run.done(i, t0, failed)
    return run.figures(len(queries))


def sequential_by(client: str) -> Callable[[Api, list[Query], int, float | None], tuple[dict[str, Any], int]]:
    """The sequential pass of ``--seq-client``."""
    if client == "sync":
        return sequential
    if client == "sync-keepalive":
        return lambda api, queries, warmup, max_s: sequential(api, queries, warmup, max_s, KeepAliveSyncTransport())
    return lambda api, queries, warmup, max_s: asyncio.run(sequential_lean(api, queries, warmup, max_s))


def drain(api: Api, probe: Query) -> float:
    """Wait until the server has worked off what a paced run left queued (requests the client gave
    up on are still served), so the next phase starts on an idle server: one recall, answered
    after the backlog. Returns the seconds it took."""
    t0 = time.perf_counter()
    with httpx.Client(base_url=api.url, timeout=300) as http:
        try:
            Callers(api.url, http).recall(probe)
        except ConnectionFailed:
            raise
        except TenureError:
            pass  # answered, if with an error: the backlog is gone
    return round(time.perf_counter() - t0, 2)


async def post(callers: AsyncCallers, q: Query) -> str | None:
    """One recall; None when it answered 200, else why not (``HTTP 429``, ``ReadTimeout``, ...)."""
    try:
        await callers.recall(q)
    except TenureError as exc:
        return cause_of(exc)
    return None


Connect = Callable[[Api, int], contextlib.AbstractAsyncContextManager[AsyncCallers]]

# How the paced and ceiling passes reach the API (``--load-client``); the sequential pass has its
# own choice (``--seq-client``, :func:`sequential_by`).
CONNECTS: dict[str, Connect] = {"lanes": lanes_to, "keepalive": keepalive_to}


async def paced(
    api: Api, queries: list[Query], rate: float, seconds: float, grace_s: float, *, connect: Connect | None = None
) -> dict[str, Any]:
    """Open loop: request k is due at start + k/rate whatever the answers do; its latency counts
    from that due time, so a stalled server shows as queueing instead of a slower sender. A
    request still unanswered ``grace_s`` after the last one was due counts as an error
    (``unanswered``), so an overloaded variant cannot stretch the run without bound. A request
    due while ``MAX_IN_FLIGHT`` are still unanswered is not sent and counts as an error (``shed``):
    queued inside httpx's pool instead, thousands of waiting requests cost the client more CPU than
    the server (its queue is scanned per request), and the client, not the server, became the
    bottleneck. The requests in flight go over one connection each (:func:`lanes_to` unless
    ``connect`` says otherwise; the command line's default is :func:`keepalive_to`), for the
    same reason (``connect``: another way to reach the API, ``benchmarks/paced_client_ab.py``)."""
    total = int(rate * seconds)
    tally = Tally()
    clock_at = (time.time(), time.perf_counter())  # to give the first due time as a wall-clock time
    async with (connect or lanes_to)(api, MAX_IN_FLIGHT) as callers:
        unanswered, wall = await open_loop(
            rate, total, seconds + grace_s, lambda k, due: tally.send(callers, queries[k % len(queries)], due)
        )
    if unanswered:
        tally.causes["unanswered"] = len(unanswered)
    first_due = first_due_utc(tally.answered, clock_at)
    return paced_figures(tally.answered, tally.kinds, tally.causes, total, wall, first_due)


def paced_figures(
    answered: list[tuple[float, float]],
    kinds: list[str],
    causes: dict[str, int],
    total: int,
    wall_s: float,
    first_due: str | None,
) -> dict[str, Any]:
    """A paced pass's figures from its answers ((due time s, latency ms), in the order they came,
    and their message kinds), its failures by cause, the requests due and its wall time."""
    by_kind = latencies_by_kind(kinds, answered)
    return {
        **latency_block([latency_ms for _, latency_ms in answered]),
        "errors": sum(causes.values()),
        "error_causes": causes,
        "sent": total,
        "achieved_per_s": round(len(answered) / wall_s, 1),
        "timeline": timeline(answered),
        "by_kind": {kind: latency_block(times) for kind, times in sorted(by_kind.items())},
        "p99_by_tenth_of_second": by_phase(answered),
        # when the timeline's second 0 began, to line it up with other logs (a JVM's GC log)
        "first_due_utc": first_due,
    }


def first_due_utc(answered: list[tuple[float, float]], clock_at: tuple[float, float]) -> str | None:
    if not answered:
        return None
    wall, perf = clock_at
    first = wall + (min(due for due, _ in answered) - perf)
    return datetime.fromtimestamp(first, UTC).isoformat(timespec="milliseconds")


def timeline(answered: list[tuple[float, float]], window_s: float = 1.0) -> list[list[float]]:
    """The paced pass second by second from the first due time, by due time: ``[second,
    answered, p50, p99, max]`` of the answers whose requests were due in it. A p99 missed in a
    few seconds only (a burst: a collection, a compilation, a merge) reads differently from one
    missed in every second (no headroom)."""
    if not answered:
        return []
    first = min(due for due, _ in answered)
    by_window: dict[int, list[float]] = {}
    for due, latency_ms in answered:
        by_window.setdefault(int((due - first) / window_s), []).append(latency_ms)
    rows: list[list[float]] = []
    for window in sorted(by_window):
        block = latency_block(by_window[window])
        rows.append([window * window_s, block["n"], block["p50_ms"], block["p99_ms"], block["max_ms"]])
    return rows


def by_phase(answered: list[tuple[float, float]], period_s: float = 1.0, bins: int = 10) -> list[float]:
    """The paced pass's p99 (ms) by where in each ``period_s`` its requests were due, in ``bins``
    slices: a stall that comes once a period (a drain tick, a refresh, a paced collection) shows
    as one or two slices far above the others, where the timeline spreads it over every second.
    Found so: the audit index's once-a-second refresh (docs/benchmarks.md, 2026-12-06 08:20)."""
    if not answered:
        return []
    first = min(due for due, _ in answered)
    by_bin: dict[int, list[float]] = {}
    for due, latency_ms in answered:
        by_bin.setdefault(int(((due - first) % period_s) / period_s * bins), []).append(latency_ms)
    return [latency_block(by_bin.get(b, [])).get("p99_ms", 0.0) for b in range(bins)]


def latencies_by_kind(kinds: list[str], answered: list[tuple[float, float]]) -> dict[str, list[float]]:
    """The answers' latencies (ms) by message kind (``kinds[i]`` is ``answered[i]``'s)."""
    out: dict[str, list[float]] = {}
    for kind, (_, latency_ms) in zip(kinds, answered, strict=True):
        out.setdefault(kind, []).append(latency_ms)
    return out


@dataclass
class Tally:
    """What the paced requests to one API got: each answer's latency from its due time, and why
    the others failed. At most ``MAX_IN_FLIGHT`` in flight; a request due beyond is ``shed``."""

    answered: list[tuple[float, float]] = field(default_factory=list)  # (due time, latency ms)
    kinds: list[str] = field(default_factory=list)  # each answer's message kind (alias-hit, miss, long)
    causes: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0

    @property
    def timings(self) -> list[float]:
        """The answers' latencies (ms), in the order they came."""
        return [latency_ms for _, latency_ms in self.answered]

    def fail(self, cause: str) -> None:
        self.causes[cause] = self.causes.get(cause, 0) + 1

    def by_kind(self) -> dict[str, list[float]]:
        """The answers' latencies (ms) by message kind."""
        return latencies_by_kind(self.kinds, self.answered)

    async def send(self, callers: AsyncCallers, q: Query, due: float) -> None:
        if self.in_flight >= MAX_IN_FLIGHT:
            self.fail("shed")
            return
        self.in_flight += 1
        try:
            cause = await post(callers, q)
        finally:
            self.in_flight -= 1
        if cause is None:
            self.answered.append((due, (time.perf_counter() - due) * 1000))
            self.kinds.append(q.kind)
        else:
            self.fail(cause)


async def open_loop(
    rate: float, total: int, deadline_s: float, request: Callable[[int, float], Awaitable[None]]
) -> tuple[list[int], float]:
    """Open loop: ``request(k, due)`` at its due time, start + k/rate, whatever the answers do. After
    ``deadline_s`` the requests still running are cancelled. Returns their indices and the wall
    time from the start."""
    start = time.perf_counter() + 0.2

    async def one(k: int) -> None:
        due = start + k / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await request(k, due)

    tasks = [asyncio.ensure_future(one(k)) for k in range(total)]
    _, pending = await asyncio.wait(tasks, timeout=0.2 + deadline_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return [k for k, task in enumerate(tasks) if task in pending], time.perf_counter() - start


async def prime(api: Api, spec: Spec, connections: int) -> dict[str, Any]:
    """Build every tenant's cached vocabulary in every API process before measuring: one short
    recall per (tenant, connection), the calls spread over ``connections`` keep-alive connections,
    again over fresh ones until every worker took part (the kernel hands each connection to one
    worker, not always to both: :func:`until_every_worker`). What a steady state looks like:
    tenants that have not written since their last recall. A build's own cost is measured apart
    (docs/benchmarks.md, build per tenant)."""
    tenants = [f"t{t:04d}" for t in range(spec.tenants)]
    t0 = time.perf_counter()

    causes: dict[str, int] = {}

    def calls_of(lane: int) -> Iterator[Query]:
        for tenant in tenants[lane:] + tenants[:lane]:
            yield Query("prime", Principal(tenant_id=tenant, user_id="u0"), ["domain:code"], "hello there")

    rounds, cpu_s = await until_every_worker(api, lambda: over_lanes(api, connections, calls_of, causes))
    return {
        "recalls": len(tenants) * connections * rounds,
        "rounds": rounds,
        "seconds": round(time.perf_counter() - t0, 1),
        "errors": causes,
        "worker_cpu_s": cpu_s,
    }


async def over_lanes(
    api: Api, lanes: int, calls_of: Callable[[int], Iterable[Query]], causes: dict[str, int]
) -> dict[str, int]:
    """Send ``calls_of(lane)`` on each of ``lanes`` keep-alive connections at once, one call after
    the other on each; every failure counted in ``causes`` by its cause (returned)."""
    async with lanes_to(api, lanes) as callers:

        async def lane(number: int) -> None:
            for q in calls_of(number):
                cause = await post(callers, q)
                if cause is not None:
                    causes[cause] = causes.get(cause, 0) + 1

        await asyncio.gather(*(lane(n) for n in range(lanes)))
    return causes


# Connections of the warm-up. The kernel hands each new connection to whichever API worker
# accepts it first, and that can be the same worker every time: one sequential connection warmed
# one worker only, and even eight at once can all land on one (2026-12-05); the other then met
# the paced pass cold. So the priming and the warm-up are repeated over fresh connections until
# every worker took a share of them.
WARM_LANES = 8
WARM_ROUNDS = 4
WARM_SHARE = 0.25  # of the busiest worker's CPU


async def until_every_worker(
    api: Api, send_round: Callable[[], Awaitable[object]], rounds: int = WARM_ROUNDS
) -> tuple[int, list[float]]:
    """Run ``send_round`` (which opens connections of its own) until every API worker has done
    at least ``WARM_SHARE`` of the busiest one's work, at most ``rounds`` times. Returns the
    rounds run and each of uvicorn's children's CPU seconds over them."""
    before = api.worker_cpu()
    done, cpu_s = 0, []
    while done < rounds:
        await send_round()
        done += 1
        cpu_s = api.worker_cpu_since(before)
        if every_worker_took_part(cpu_s, api.workers):
            break
    return done, cpu_s


async def warm(api: Api, queries: list[Query], lanes: int) -> dict[str, Any]:
    """Send ``queries`` over ``lanes`` connections at once (query k on lane k mod ``lanes``), so
    the caches of every API worker (credentials, filter tiers, decoded beliefs, the in-process
    analysis's compiled code) hold what the traffic needs before anything is measured, over fresh
    connections until every worker took part (:func:`until_every_worker`). Returns the errors,
    the rounds and each worker's CPU seconds."""
    causes: dict[str, int] = {}
    rounds, cpu_s = await until_every_worker(api, lambda: over_lanes(api, lanes, lambda n: queries[n::lanes], causes))
    return {"recalls": len(queries) * rounds, "rounds": rounds, "errors": causes, "worker_cpu_s": cpu_s}


def every_worker_took_part(cpu_s: list[float], workers: int) -> bool:
    """Whether the ``workers`` busiest of uvicorn's children (its workers; the others, such as
    multiprocessing's resource tracker, stay idle) each used at least ``WARM_SHARE`` of the
    busiest one's CPU."""
    busiest = sorted(cpu_s, reverse=True)[:workers]
    return len(busiest) == workers and all(c >= WARM_SHARE * busiest[0] for c in busiest)


async def ceiling(
    api: Api, queries: list[Query], clients: int, seconds: float, *, connect: Connect | None = None
) -> dict[str, Any]:
    timings: list[float] = []
    causes: dict[str, int] = {}
    async with (connect or lanes_to)(api, clients) as callers:  # one connection per closed-loop client
        stop = time.perf_counter() + seconds

        async def client(c: int) -> None:
            k = c
            while time.perf_counter() < stop:
                q = queries[k % len(queries)]
                k += clients
                t0 = time.perf_counter()
                cause = await post(callers, q)
                if cause is None:
                    timings.append((time.perf_counter() - t0) * 1000)
                else:
                    causes[cause] = causes.get(cause, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - t0
    return {
        **latency_block(timings),
        "errors": sum(causes.values()),
        "error_causes": causes,
        "recalls_per_s": round(len(timings) / wall, 1),
    }


GO = "go"  # --seq-client / --load-client: the compiled client, benchmarks/pacer.py


class GoPasses:
    """The passes sent by the compiled client (``benchmarks/pacer.py``): the requests of each pass
    it sends (``calls``: ``sequential``, ``paced``, ``ceiling``) written before anything is timed,
    each pass one run of the pacer. Each pass returns its figures in the shape of the Python
    clients' and the pacer's own CPU seconds, which the meter cannot see (another process, gone
    when the pass ends): :func:`charged` adds them to the client."""

    def __init__(self, api: Api, calls: dict[str, list[Query]], state_dir: Path):
        self.binary = pacer.build(state_dir / "bin")
        scratch = state_dir / "plans"

        def key_for(q: Query) -> str:
            return key_of(q.principal.tenant_id, q.principal.user_id)[1]

        self.plans = {name: pacer.Plan.write(api.url, queries, key_for, scratch) for name, queries in calls.items()}

    def sequential(self, max_s: float | None) -> tuple[dict[str, Any], int, float]:
        plan = self.plans["sequential"]
        out = pacer.run(self.binary, plan, "sequential", timeout_s=TIMEOUT_S, max_s=max_s or 0.0)
        sent = len(out.answered) + sum(out.causes.values())
        figures = {
            **latency_block([ms for _, ms, _ in out.answered]),
            "errors": sum(out.causes.values()),
            "sent": sent,
            "stopped_at_max_s": sent < len(plan.kinds),
        }
        return figures, sent, out.cpu_s

    def paced(self, rate: float, seconds: float, grace_s: float) -> tuple[dict[str, Any], float]:
        out = pacer.run(
            self.binary, self.plans["paced"], "paced", timeout_s=TIMEOUT_S,
            rate=rate, seconds=seconds, grace_s=grace_s, max_in_flight=MAX_IN_FLIGHT,
        )  # fmt: skip
        answered = [(due_s, ms) for due_s, ms, _ in out.answered]
        # due times are offsets from the pass's start, whose wall-clock time the pacer gives
        first_due = first_due_utc(answered, (out.start_unix_s, 0.0))
        figures = paced_figures(
            answered, [kind for _, _, kind in out.answered], out.causes, int(rate * seconds), out.wall_s, first_due
        )
        return {**figures, "connects": out.connects}, out.cpu_s

    def ceiling(self, clients: int, seconds: float) -> tuple[dict[str, Any], float]:
        plan = self.plans["ceiling"]
        out = pacer.run(self.binary, plan, "ceiling", timeout_s=TIMEOUT_S, connections=clients, seconds=seconds)
        figures = {
            **latency_block([ms for _, ms, _ in out.answered]),
            "errors": sum(out.causes.values()),
            "error_causes": out.causes,
            "recalls_per_s": round(len(out.answered) / out.wall_s, 1),
            "connects": out.connects,
        }
        return figures, out.cpu_s

    def close(self) -> None:
        for plan in self.plans.values():
            plan.remove()


def charged(used: dict[str, Any], pacer_cpu_s: float) -> dict[str, Any]:
    """A ``CpuMeter`` reading with the pacer's CPU moved from "other processes" to the client."""
    if pacer_cpu_s:
        used["cpu_s"]["loadgen"] = round(used["cpu_s"]["loadgen"] + pacer_cpu_s, 2)
        used["other_processes_cpu_s"] = round(used["other_processes_cpu_s"] - pacer_cpu_s, 2)
    return used


def cpu_per_recall(used: dict[str, Any], recalls: int) -> dict[str, float]:
    """CPU ms per recall by component, from a ``CpuMeter`` reading over ``recalls`` calls."""
    cpu = {name: round(seconds * 1000 / recalls, 2) for name, seconds in used["cpu_s"].items()}
    cpu["client"] = cpu.pop("loadgen")
    cpu["other processes"] = round(used["other_processes_cpu_s"] * 1000 / recalls, 2)
    return cpu


def machine_use(used: dict[str, Any], calls: int) -> dict[str, Any]:
    """A pass's CPU per recall by component and how busy the whole machine was (of all its
    cores, every process counted: at 300/s paced this says how much headroom was left), and how
    much of it the hypervisor stole (counted in busy: a run with steal ran on a slower machine)."""
    busy = used["machine_busy_cpu_s"] / max(used["machine_total_cpu_s"], 1e-9)
    return {
        "cpu_ms_per_recall": cpu_per_recall(used, max(calls, 1)),
        "machine_busy": round(busy, 3),
        "machine_steal": steal_share(used),
    }


def steal_share(used: dict[str, Any]) -> float:
    """The share of the machine's CPU time the hypervisor gave to other guests during a pass."""
    stolen_s = float(used.get("machine_stolen_cpu_s", 0.0))
    return round(stolen_s / max(float(used["machine_total_cpu_s"]), 1e-9), 3)


@dataclass(frozen=True)
class Phases:
    """The calls of each phase of a run, disjoint slices of one traffic sequence: no phase sends a
    call an earlier phase sent (the recall caches make a repeated message nearly free, so reused
    calls would measure the caches, not recall). The ceiling's slice is reused in turn only if a
    run outlasts it (``ceiling`` says how many it sent)."""

    warmup: list[Query]
    timed: list[Query]
    paced: list[Query]
    ceiling: list[Query]

    @classmethod
    def split(cls, calls: list[Query], args: argparse.Namespace) -> Phases:
        paced_end = args.warmup + args.queries + paced_calls(args)
        return cls(
            calls[: args.warmup],
            calls[args.warmup : args.warmup + args.queries],
            calls[args.warmup + args.queries : paced_end],
            calls[paced_end:],
        )


def paced_calls(args: argparse.Namespace) -> int:
    return int(args.rate * args.paced_s) + 1


def traffic(args: argparse.Namespace, shape: str, loaded: int, spec: Spec) -> list[Query]:
    """The calls of a run: ``random`` (every call from a random user with a random scope list) or
    ``sessions`` (working sessions of one user and one scope list, interleaved: ``draw_sessions``);
    enough for every phase (:class:`Phases`)."""
    n = args.warmup + args.queries + paced_calls(args) + args.ceiling_calls
    if shape == "sessions":
        return draw_sessions(
            n, loaded, spec, NOW, seed=args.seed, length=args.session_length, active=args.active_sessions
        )
    return draw_queries(n, loaded, spec, NOW, seed=args.seed)


def measure_variant(
    variant: Variant, args: argparse.Namespace, urls: tuple[str, str], pids: dict[str, list[int]], loaded: int
) -> list[dict[str, Any]]:
    """One API process tree for the variant; each traffic shape measured in turn on it (after the
    priming, if asked): one result per shape."""
    spec = Spec(tenants=args.tenants, users_per_tenant=args.users_per_tenant)
    namespace = namespace_of(loaded)
    log = args.state_dir / f"api-{variant.name}.log"
    api = Api(variant, urls[0], urls[1], namespace, args.api_workers, log)
    try:
        primed = asyncio.run(prime(api, spec, args.prime_connections)) if args.prime_connections else None
        results = []
        for shape in args.traffic.split(","):
            queries = traffic(args, shape, loaded, spec)
            with client_heap(frozen=args.client_gc == "frozen"):
                result = measure_traffic(api, args, queries, pids)
            results.append({"variant": variant.name, "traffic": shape, "primed": primed, "source": str(variant.source),
                            "python": str(variant.python()), "namespace": namespace, "env": variant.env,
                            **result})  # fmt: skip
        return results
    finally:
        api.stop()


@contextlib.contextmanager
def client_heap(*, frozen: bool) -> Iterator[None]:
    """The load generator's own heap (its queries, principals, keys) frozen while it measures:
    its generation-2 collections then walk only what it allocates since. Unfrozen, one took
    65-82 ms about every 10 s of a paced run; the sends it held back reached the API as a burst
    and counted as the API's queueing (docs/benchmarks.md, 2026-12-03)."""
    if not frozen:
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class Passes:
    """The three timed passes over the clients the command line chose (``--seq-client``,
    ``--load-client``); each returns its figures, the sequential one also how many it sent, and
    the CPU seconds of a client process the meter cannot see (the pacer's; 0 for the Python
    clients, which run in this process)."""

    sequential: Callable[[], tuple[dict[str, Any], int, float]]
    paced: Callable[[], tuple[dict[str, Any], float]]
    ceiling: Callable[[], tuple[dict[str, Any], float]]
    close: Callable[[], None]


def passes_for(api: Api, phases: Phases, args: argparse.Namespace) -> Passes:
    by_go: dict[str, list[Query]] = {"sequential": phases.timed} if args.seq_client == GO else {}
    if args.load_client == GO:
        by_go.update(paced=phases.paced, ceiling=phases.ceiling)
    go = GoPasses(api, by_go, args.state_dir) if by_go else None

    def sequential_in_python() -> tuple[dict[str, Any], int, float]:
        figures, sent = sequential_by(args.seq_client)(api, phases.timed, 0, args.seq_max_s)
        return figures, sent, 0.0

    def paced_in_python() -> tuple[dict[str, Any], float]:
        connect = CONNECTS[args.load_client]
        return asyncio.run(paced(api, phases.paced, args.rate, args.paced_s, args.paced_grace_s, connect=connect)), 0.0

    def ceiling_in_python() -> tuple[dict[str, Any], float]:
        connect = CONNECTS[args.load_client]
        return asyncio.run(ceiling(api, phases.ceiling, args.clients, args.ceiling_s, connect=connect)), 0.0

    if go is None:
        return Passes(sequential_in_python, paced_in_python, ceiling_in_python, lambda: None)
    loaded_by_go = args.load_client == GO
    return Passes(
        (lambda: go.sequential(args.seq_max_s)) if args.seq_client == GO else sequential_in_python,
        (lambda: go.paced(args.rate, args.paced_s, args.paced_grace_s)) if loaded_by_go else paced_in_python,
        (lambda: go.ceiling(args.clients, args.ceiling_s)) if loaded_by_go else ceiling_in_python,
        go.close,
    )


def measure_traffic(
    api: Api, args: argparse.Namespace, queries: list[Query], pids: dict[str, list[int]]
) -> dict[str, Any]:
    phases = Phases.split(queries, args)
    backlog = {"pending": api.drain.pending(), "drained_in_s": api.drain.wait_empty()}
    warmed = asyncio.run(warm(api, phases.warmup, WARM_LANES))
    passes = passes_for(api, phases, args)
    try:
        return measure_passes(api, args, phases, passes, pids, {"warmup": warmed, "backlog": backlog})
    finally:
        passes.close()


def measure_passes(
    api: Api,
    args: argparse.Namespace,
    phases: Phases,
    passes: Passes,
    pids: dict[str, list[int]],
    before: dict[str, Any],
) -> dict[str, Any]:
    """:func:`measure_traffic`'s timed passes: sequential, paced, ceiling, each with its CPU."""

    def stack() -> dict[str, list[int]]:
        return {**pids, "api": api.pids(), "drain": api.drain.pids()}

    def components() -> dict[str, list[int]]:  # run_queue's: the stack and this load client
        return {**stack(), "client": [os.getpid()]}

    meter = CpuMeter(stack)  # the load client's own CPU is the meter's "loadgen"
    load_before = loadavg()
    meter.begin()
    seq, sent, pacer_cpu = passes.sequential()
    used = charged(meter.finish(), pacer_cpu)
    cpu = cpu_per_recall(used, max(sent, 1))
    seq["machine_steal"] = steal_share(used)
    receipts: dict[str, Any] = {"backlog_before": before["backlog"]}
    receipts["pending_after"] = {"sequential": api.drain.pending()}
    result: dict[str, Any] = {
        "warmup": before["warmup"],
        "sequential": seq,
        "cpu_ms_per_recall": cpu,
        "loadavg_before": load_before,
        "clients": {"sequential": args.seq_client, "paced and ceiling": args.load_client},
    }
    result["receipt_outbox"] = receipts
    meter.begin()
    workers = api.worker_cpu()
    queued = run_queue.reading(components())
    rewrite = AofRewrite(api.drain.redis, args.paced_aof_rewrite_at_s)
    bursts = BurstWatch(args.paced_thread_bursts, components(), pids.get("opensearch", []))
    with api.drain.paused(args.paced_drain == "paused"), rewrite, bursts:
        result["paced"], pacer_cpu = passes.paced()
    bursts.summarise_into(result["paced"])
    result["paced"]["drain"] = args.paced_drain
    result["paced"]["aof_rewrite"] = rewrite.outcome()
    # the run queue's "client" is this process: the pacer's own wait for a core is not in it
    result["paced"]["run_queue"] = run_queue.per_call(queued, run_queue.reading(components()), result["paced"]["sent"])
    result["paced"].update(machine_use(charged(meter.finish(), pacer_cpu), result["paced"]["sent"]))
    # how the load client's connections fell on the workers (the kernel's choice, per connection)
    result["paced"]["worker_cpu_s"] = api.worker_cpu_since(workers)
    if args.paced_drain == "paused":  # the receipts it held back, drained before the next pass
        result["paced"]["drain_caught_up_s"] = api.drain.wait_empty(below=500)
    result["paced"]["drain_s"] = drain(api, phases.paced[0])
    receipts["pending_after"]["paced"] = api.drain.pending()
    meter.begin()
    result["ceiling"], pacer_cpu = passes.ceiling()
    used = charged(meter.finish(), pacer_cpu)
    receipts["pending_after"]["ceiling"] = api.drain.pending()
    # every receipt in the audit index before the API stops: the run leaves an empty outbox
    receipts["drained_at_end_s"] = api.drain.wait_empty(timeout_s=300, below=1)
    calls = result["ceiling"]["n"] + result["ceiling"]["errors"]
    result["ceiling"].update(machine_use(used, calls))
    result["loadavg_after"] = loadavg()
    return result


def print_rows(size: int, rows: list[dict[str, Any]]) -> None:
    print(f"\n{size:,} beliefs")
    print("| variant | seq n | seq p50 | seq p99 | paced p50 / p99 (errors), machine busy (steal)", end=" ")
    print("| ceiling /s | CPU ms/recall OS / API / drain / Redis / client |")
    for r in rows:
        s, p, c, cpu = r["sequential"], r["paced"], r["ceiling"], r["cpu_ms_per_recall"]
        print(
            f"| {r['variant']} ({r['traffic']}) | {s['n']} | {s.get('p50_ms')} | {s.get('p99_ms')} "
            f"| {p.get('p50_ms')} / {p.get('p99_ms')} ({p['errors']}), {p.get('machine_busy')}{stolen(s, p)} "
            f"| {c['recalls_per_s']} | {cpu.get('opensearch')} / {cpu.get('api')} / {cpu.get('drain')} / "
            f"{cpu.get('redis')} / {cpu.get('client')} |",
            flush=True,
        )
    for r in rows:
        if "run_queue" in r["paced"]:
            print(f"{r['variant']}: {run_queue_line(r['paced']['run_queue'])}", flush=True)
        if "seconds" in r["paced"].get("thread_bursts", {}):
            for line in thread_bursts.worst_lines(r["paced"]["thread_bursts"]):
                print(f"{r['variant']}: paced {line}", flush=True)


def stolen(sequential: dict[str, Any], paced: dict[str, Any]) -> str:
    """The hypervisor's steal in the sequential and paced passes, when there was any."""
    shares = (sequential.get("machine_steal", 0.0), paced.get("machine_steal", 0.0))
    return f" (steal {shares[0]} / {shares[1]})" if any(shares) else ""


def run_queue_line(rows: dict[str, dict[str, float]]) -> str:
    """The paced pass's wait for a CPU per recall, by component (``benchmarks/run_queue.py``)."""
    parts = ", ".join(
        f"{name} {row['wait_ms']} ms over {row['slices']} slices"
        for name, row in sorted(rows.items(), key=lambda item: -item[1]["wait_ms"])
        if name != "total" and row["slices"] > 0.05
    )
    total = rows["total"]
    return f"paced, waiting for a CPU per recall: {total['wait_ms']} ms over {total['slices']} slices ({parts})"


def running_node_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments of a script that runs source trees (``--variant``) against a node already
    serving the loaded corpus (``--load-only``): ``sequential_ab``, ``recall_cost_split``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--variant", action="append", required=True, help="name=path[:VAR=value,...]")
    parser.add_argument("--size", type=int, default=1_000_000, help="the loaded corpus (its namespace)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="corpus sizes, in the order to measure")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--users-per-tenant", type=int, default=5)
    parser.add_argument("--variant", action="append", default=[], help="name=path[:VAR=value,...] (repeatable)")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/tenure-fastpath"))  # noqa: S108
    parser.add_argument("--fresh", action="store_true", help="wipe the state dir first")
    parser.add_argument("--opensearch-url", help="use a running node (its data is then the state)")
    parser.add_argument("--redis-url", help="use a running Redis")
    parser.add_argument("--opensearch-pid", type=int, help="with --opensearch-url: its JVM, for the CPU split")
    parser.add_argument("--redis-pid", type=int, help="with --redis-url: its process, for the CPU split")
    parser.add_argument("--heap", default="2g")
    parser.add_argument("--api-workers", type=int, default=1)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--seq-max-s", type=float, help="stop each sequential pass after this many seconds")
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--paced-s", type=float, default=20.0)
    parser.add_argument("--paced-grace-s", type=float, default=30.0, help="then unanswered paced requests fail")
    parser.add_argument("--paced-drain", choices=("running", "paused"), default="running",
                        help="paused: the receipt drain stopped during the paced pass (a diagnostic)")  # fmt: skip
    parser.add_argument("--paced-aof-rewrite-at-s", type=float, default=None,
                        help="BGREWRITEAOF this far into the paced pass (a diagnostic)")  # fmt: skip
    parser.add_argument("--paced-thread-bursts", type=Path, default=None, metavar="JSONL",
                        help="sample every thread's CPU each 0.1 s of the paced pass into this file and name "
                             "the bursts in its worst seconds (benchmarks/thread_bursts.py; a diagnostic)")  # fmt: skip
    parser.add_argument("--client-gc", choices=("frozen", "default"), default="frozen",
                        help="the load generator's heap while measuring (client_heap)")  # fmt: skip
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seq-client", choices=("sync", "sync-keepalive", "keepalive", GO), default="sync",
                        help="the sequential pass's client: the SDK, sync (httpx's transport), sync over "
                             "KeepAliveSyncTransport, or async over KeepAliveTransport; go: the compiled "
                             "client (benchmarks/pacer.py)")  # fmt: skip
    parser.add_argument("--load-client", choices=(*CONNECTS, GO), default="keepalive",
                        help="how the paced and ceiling passes reach the API (lanes: before 2026-12-03; "
                             "go: the compiled client, benchmarks/pacer.py)")  # fmt: skip
    parser.add_argument("--ceiling-s", type=float, default=20.0)
    parser.add_argument(
        "--ceiling-calls", type=int, default=20_000, help="calls drawn for the ceiling (reused if it outlasts them)"
    )
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--traffic", default="random",
        help="random (each call from a random user and scope list), sessions (interleaved working sessions), "
        "or both comma-separated: measured in turn on the same API processes",
    )  # fmt: skip
    parser.add_argument(
        "--prime-connections", type=int, default=0,
        help="before the warm-up, one recall per tenant on each of this many connections (0: no priming)",
    )  # fmt: skip
    parser.add_argument("--session-length", type=int, default=10, help="sessions: calls per session")
    parser.add_argument("--active-sessions", type=int, default=64, help="sessions: sessions running at once")
    parser.add_argument("--load-only", action="store_true", help="build the corpus and accounts, measure nothing")
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    variants = [Variant.parse(v) for v in args.variant] or [Variant("after", REPO)]
    sizes = [int(s) for s in args.sizes.split(",")]
    spec = Spec(tenants=args.tenants, users_per_tenant=args.users_per_tenant)
    owned: list[Service] = []
    try:
        if args.opensearch_url:
            os_url = args.opensearch_url
        else:
            home = args.state_dir / "opensearch"
            owned.append(start_opensearch(home, heap=args.heap, timeout_s=900, fresh=args.fresh or not home.exists()))
            os_url = owned[-1].url
        if args.redis_url:
            redis_url = args.redis_url
        else:
            owned.append(start_redis(args.state_dir / "redis"))
            redis_url = owned[-1].url
        client = build_client(Settings(opensearch_url=os_url, opensearch_timeout_s=600))
        data: dict[str, Any] = {
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "uptime_loadavg": loadavg(),
            "args": {k: str(v) for k, v in vars(args).items()},
            # the machine's speed before the first pass and after the last (benchmarks/machine_speed.py)
            "machine_speed": {} if args.load_only else {"before": speed_check()},
            "stages": [],
        }
        out = args.out or RESULTS / f"fastpath-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
        data["loads"] = {}
        for size in sizes:
            state = ensure_state(client, args.state_dir, spec, size)
            data["loads"][namespace_of(size)] = state
            if args.load_only:
                continue
            pids: dict[str, list[int]] = {}
            if args.opensearch_url:
                pids["opensearch"] = [args.opensearch_pid] if args.opensearch_pid else []
            else:
                pids["opensearch"] = [owned[0].process.pid]
            if args.redis_url:
                pids["redis"] = [args.redis_pid] if args.redis_pid else []
            else:
                pids["redis"] = [owned[-1].process.pid]
            stage: dict[str, Any] = {"beliefs": size, "segments": segments(client, namespace_of(size)), "variants": []}
            for variant in variants:
                print(f"[{size:,}] {variant.name} ...", flush=True)
                stage["variants"] += measure_variant(variant, args, (os_url, redis_url), pids, size)
            print_rows(size, stage["variants"])
            data["stages"].append(stage)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=2))
        if not args.load_only:
            data["machine_speed"]["after"] = speed_check()
            out.write_text(json.dumps(data, indent=2))
            print(f"\n{speed_line(data['machine_speed'])}")
            print(f"results: {out}")
        client.close()
    finally:
        for service in reversed(owned):
            service.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
