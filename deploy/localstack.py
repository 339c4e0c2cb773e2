"""The deployment's whole topology as local processes, each one killable and restartable.

The same parts as ``docker-compose.yml`` — OpenSearch, Redis (AOF), the scripted upstream LLM, the
API (uvicorn with N workers), a Celery worker and Celery beat — started on free loopback ports under
one state directory. The load test, the fault drills and the HTTP benchmarks drive it; a component
can be SIGKILLed and started again on the same port and data directory, which is what a container
restart does.

    with LocalStack(StackConfig(root=Path("/tmp/stack"))) as stack:
        key = stack.operator_key()
        stack.kill("opensearch"); stack.start_component("opensearch")

Every process runs in its own process group, so a kill takes a prefork worker with its pool
children and a uvicorn supervisor with its workers, like a lost container.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import redis
from pydantic import SecretStr

from deploy.cluster import Cluster
from deploy.devstack import Service, free_port, start_opensearch, start_redis
from service.api.http_protocol import uvicorn_http_option
from service.config import ApiSettings, AuthSettings, CelerySettings, MemoryLoopSettings, Settings
from workers.liveness import stale

log = logging.getLogger("tenure.localstack")

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("opensearch", "redis", "llm", "api", "worker", "beat")
PYTHON_COMPONENTS = ("llm", "api", "worker", "beat")


@dataclass
class StackConfig:
    root: Path
    # reuse running servers instead of starting (and owning) them; drills need owned ones
    opensearch_url: str | None = None
    redis_url: str | None = None
    opensearch_heap: str = "2g"
    api_workers: int = 2
    worker_concurrency: int = 2
    with_llm: bool = True
    with_worker: bool = True
    with_beat: bool = True
    namespace: str = field(default_factory=lambda: f"stack-{uuid.uuid4().hex[:8]}")
    pepper: str = "localstack-pepper"
    # the scripted upstream's arguments after ``--port``; "load" answers every turn with a sidecar
    llm_args: tuple[str, ...] = ("--mode", "load")
    # extra TENURE_* variables for the API, worker and beat processes
    env: dict[str, str] = field(default_factory=dict)
    # > 1: an OpenSearch cluster of that many nodes (deploy/cluster.py) instead of one node; its
    # nodes are components named node-1, node-2, ...
    opensearch_nodes: int = 1
    # > 1: more API servers (uvicorn supervisors with api_workers each) named api, api-2, ...
    api_processes: int = 1
    # two Celery workers, worker-heavy and worker-cheap, one per queue, instead of one on both
    split_worker_queues: bool = False
    # like a container's restart policy plus its health check: a worker that exited, or whose
    # consumer heartbeat (workers/liveness.py) is older than worker_stale_after_s, is SIGKILLed and
    # started again; a worker stopped on purpose (``kill``) is left down until ``start_component``
    supervise_workers: bool = True
    worker_stale_after_s: float = 30.0
    worker_heartbeat_interval_s: float = 2.0


def celery_worker_args(
    queue_prefix: str,
    *,
    concurrency: int = 1,
    name: str = "tenure",
    loglevel: str = "INFO",
    queues: tuple[str, ...] = ("heavy", "cheap"),
) -> list[str]:
    """``python -m`` arguments of a Celery worker on a deployment's queues (both by default), as
    the stack, the tests and the benchmarks run it (prefork, no gossip/mingle/heartbeat chatter)."""
    return [
        "celery", "-A", "workers.celery_app", "worker", "-Q", ",".join(f"{queue_prefix}.{q}" for q in queues),
        "--pool=prefork", f"--concurrency={concurrency}", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-l", loglevel, "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h",
    ]  # fmt: skip


def celery_beat_args(schedule: Path, *, loglevel: str = "INFO") -> list[str]:
    """``python -m`` arguments of Celery beat keeping its schedule (and liveness file) at
    ``schedule``, as the stack, the tests and the benchmarks run it."""
    return ["celery", "-A", "workers.celery_app", "beat", "-s", str(schedule), "-l", loglevel]


def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy (returned); AssertionError on timeout, so a
    test that waits in vain fails like any other assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout:.0f}s")


class _Process:
    """One Python component in its own process group, appending to its log."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path):
        self.name = name
        self.log_path = log_path
        self.started = time.monotonic()
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


class LocalStack:
    def __init__(self, config: StackConfig):
        self.config = config
        self.root = config.root
        self.logs = self.root / "logs"
        self.ports = {name: free_port() for name in ("llm", *self.api_names)}
        self.cluster: Cluster | None = None
        self._servers: dict[str, Service] = {}
        self._procs: dict[str, _Process] = {}
        self._server_ports: dict[str, int] = {}
        self.opensearch_url = config.opensearch_url or ""
        self.redis_url = config.redis_url or ""
        self._operator_key: str | None = None
        # the worker supervisor: one lock orders its restarts with the caller's kills and starts
        self._lock = threading.RLock()
        self._held_down: set[str] = set()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        # (monotonic time, worker, why) of every restart the supervisor made
        self.supervisor_restarts: list[tuple[float, str, str]] = []

    # ------------------------------------------------------------------ addresses and settings

    @property
    def api_names(self) -> list[str]:
        return ["api", *(f"api-{i}" for i in range(2, self.config.api_processes + 1))]

    @property
    def worker_names(self) -> list[str]:
        if not self.config.with_worker:
            return []
        return ["worker-heavy", "worker-cheap"] if self.config.split_worker_queues else ["worker"]

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def api_urls(self) -> list[str]:
        """Every API server's URL (a load balancer's upstreams)."""
        return [f"http://127.0.0.1:{self.ports[name]}" for name in self.api_names]

    @property
    def llm_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['llm']}/v1"

    @property
    def owned(self) -> tuple[str, ...]:
        """The components this stack started and may kill."""
        nodes = [n.name for n in self.cluster.nodes] if self.cluster else []
        return (*self._servers, *nodes, *self._procs)

    def settings(self) -> Settings:
        """The settings every process of the stack runs with (also for in-process store access)."""
        ns = self.config.namespace
        return Settings(
            opensearch_url=self.opensearch_url,
            redis_url=self.redis_url,
            opensearch_namespace=ns,
            auth=AuthSettings(api_key_pepper=SecretStr(self.config.pepper)),
            api=ApiSettings(
                rate_limit_per_s=100_000,
                rate_limit_burst=1_000_000,
                tenant_rate_limit_per_s=1_000_000,
                tenant_rate_limit_burst=10_000_000,
            ),
            loop=MemoryLoopSettings(upstream_base_url=self.llm_url, upstream_api_key=SecretStr("sk-scripted")),
            celery=CelerySettings(queue_prefix=ns),
        )

    def process_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        env.update(
            TENURE_OPENSEARCH_URL=self.opensearch_url,
            TENURE_OPENSEARCH_NAMESPACE=self.config.namespace,
            TENURE_REDIS_URL=self.redis_url,
            TENURE_CELERY_QUEUE_PREFIX=self.config.namespace,
            TENURE_AUTH_API_KEY_PEPPER=self.config.pepper,
            # operators measure the service, not the per-credential limiter (20/s by default)
            TENURE_API_RATE_LIMIT_PER_S="100000",
            TENURE_API_RATE_LIMIT_BURST="1000000",
            TENURE_API_TENANT_RATE_LIMIT_PER_S="1000000",
            TENURE_API_TENANT_RATE_LIMIT_BURST="10000000",
            TENURE_LOOP_UPSTREAM_BASE_URL=self.llm_url,
            TENURE_LOOP_UPSTREAM_API_KEY="sk-scripted",
            PYTHONPATH=str(REPO),
        )
        env.update(self.config.env)
        return env

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LocalStack:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            if not self.config.opensearch_url and self.config.opensearch_nodes > 1:
                self.cluster = Cluster(self.root / "cluster", self.config.opensearch_nodes, self.config.opensearch_heap)
                self.cluster.start()
                self.opensearch_url = self.cluster.url
            elif not self.config.opensearch_url:
                self._start_server("opensearch", fresh=True)
            if not self.config.redis_url:
                self._start_server("redis", fresh=True)
            for name in self._python_components():
                self.start_component(name)
            if self.config.supervise_workers and self.worker_names:
                self._supervisor = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
                self._supervisor.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=150)
        for proc in self._procs.values():
            if proc.alive():
                proc.kill(signal.SIGTERM)
        self._procs.clear()
        for svc in self._servers.values():
            svc.stop()
        self._servers.clear()
        if self.cluster:
            self.cluster.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _python_components(self) -> list[str]:
        llm = ["llm"] if self.config.with_llm else []
        beat = ["beat"] if self.config.with_beat else []
        return [*llm, *self.api_names, *self.worker_names, *beat]

    # ------------------------------------------------------------------ faults

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a component's whole process group and reap it (SIGKILL: no shutdown at all)."""
        if self.cluster and name in self.owned and name.startswith("node-"):
            self.cluster.kill(name, sig)
        elif name in self._servers:
            svc = self._servers[name]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(svc.process.pid, sig)
            svc.process.wait(timeout=60)
        elif name in self._procs:
            with self._lock:
                self._held_down.add(name)  # on purpose: the supervisor leaves it down
                self._procs[name].kill(sig)
        else:
            raise KeyError(f"{name} is not a component this stack owns ({', '.join(self.owned)})")

    def start_component(self, name: str) -> None:
        """(Re)start a component on its port and data directory and wait until it serves."""
        if self.cluster and name.startswith("node-"):
            self.cluster.start_node(name)
        elif name in ("opensearch", "redis"):
            self._start_server(name, fresh=False)
        elif name in self._python_components():
            with self._lock:
                env = self.process_env()
                if name in self.worker_names:
                    heartbeat = self.heartbeat_file(name)
                    heartbeat.unlink(missing_ok=True)  # the last run's file proves nothing
                    env["TENURE_CELERY_WORKER_HEARTBEAT_FILE"] = str(heartbeat)
                    env["TENURE_CELERY_WORKER_HEARTBEAT_INTERVAL_S"] = str(self.config.worker_heartbeat_interval_s)
                self._procs[name] = _Process(name, self._args(name), env, self.logs / f"{name}.log")
                self._wait_ready(name)
                self._held_down.discard(name)
        else:
            raise KeyError(name)

    def restart(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.kill(name, sig)
        self.start_component(name)

    def heartbeat_file(self, name: str) -> Path:
        return self.root / f"{name}.alive"

    def _supervise(self) -> None:
        """Restart a worker that exited or stopped consuming, like compose's restart policy with
        the worker's health check, or Kubernetes' liveness probe."""
        while not self._stopping.wait(1.0):
            for name in self.worker_names:
                with self._lock:
                    if self._stopping.is_set():
                        return
                    problem = self._worker_problem(name)
                    if problem is None:
                        continue
                    log.warning("supervisor: restarting %s: %s", name, problem)
                    self.supervisor_restarts.append((time.monotonic(), name, problem))
                    self._procs[name].kill(signal.SIGKILL)
                    try:
                        self.start_component(name)
                    except (RuntimeError, AssertionError) as exc:  # it will be tried again next round
                        log.warning("supervisor: %s did not come back: %s", name, exc)

    def _worker_problem(self, name: str) -> str | None:
        proc = self._procs.get(name)
        if proc is None or name in self._held_down:
            return None
        if not proc.alive():
            return f"exited with {proc.proc.returncode}"
        if time.monotonic() - proc.started < self.config.worker_stale_after_s:
            return None  # still starting: no heartbeat expected yet
        return stale(self.heartbeat_file(name), self.config.worker_stale_after_s, "its consumer")

    def _start_server(self, name: str, *, fresh: bool) -> None:
        home = self.root / name
        port = self._server_ports.setdefault(name, free_port())
        if name == "opensearch":
            svc = start_opensearch(home, port=port, heap=self.config.opensearch_heap, fresh=fresh)
            self.opensearch_url = svc.url
        else:
            svc = start_redis(home, port=port, fresh=fresh)
            self.redis_url = svc.url
        self._servers[name] = svc

    def _args(self, name: str) -> list[str]:
        ns = self.config.namespace
        if name == "llm":
            return ["loadtest.scripted_llm", "--port", str(self.ports["llm"]), *self.config.llm_args]
        if name in self.api_names:
            return [
                "uvicorn", "service.app:create_app", "--factory", "--host", "127.0.0.1",
                "--port", str(self.ports[name]), "--workers", str(self.config.api_workers),
                "--log-level", "warning", "--no-access-log",
                "--http", uvicorn_http_option(),
            ]  # fmt: skip
        if name == "worker":
            return celery_worker_args(ns, concurrency=self.config.worker_concurrency, name="stack")
        if name in ("worker-heavy", "worker-cheap"):
            queue = name.removeprefix("worker-")
            return celery_worker_args(ns, concurrency=self.config.worker_concurrency, name=name, queues=(queue,))
        return celery_beat_args(self.root / "beat-schedule")

    def _wait_ready(self, name: str) -> None:
        proc = self._procs[name]

        def ready() -> bool:
            if not proc.alive():
                raise RuntimeError(f"{name} exited: {proc.log_tail()}")
            if name in self.api_names:
                return _http_status(f"http://127.0.0.1:{self.ports[name]}/readyz") == 200
            if name == "llm":
                return _http_status(f"{self.llm_url}/models") is not None
            if name.startswith("worker"):
                return "ready." in proc.log_tail(20_000)
            return True

        wait_until(ready, 120, f"{name} ready")

    # ------------------------------------------------------------------ inspection

    def pids(self) -> dict[str, list[int]]:
        """Every live pid of each component: the group leader and its descendants."""
        leaders = {name: svc.process.pid for name, svc in self._servers.items()}
        if self.cluster:
            leaders.update({n.name: n.process.pid for n in self.cluster.nodes if n.process and n.alive()})
        leaders.update({name: p.proc.pid for name, p in self._procs.items() if p.alive()})
        return {name: _process_tree(pid) for name, pid in leaders.items()}

    def rss_bytes(self) -> dict[str, int]:
        return {name: sum(_rss(pid) for pid in pids) for name, pids in self.pids().items()}

    def operator_key(self) -> str:
        """An operator API key, created once directly through the service layer (like ``tenure bootstrap``)."""
        if self._operator_key is None:
            from service.api.state import Services
            from service.storage.client import build_client

            settings = self.settings()
            client = build_client(settings)
            rds: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url)
            try:
                self._operator_key = Services.build(settings, client, rds).provisioning.bootstrap().plaintext
            finally:
                client.close()
                rds.close()
        return self._operator_key


def _http_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def _process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if Path(f"/proc/{pid}").exists():
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
