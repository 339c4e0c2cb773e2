"""Run ``docker-compose.yml`` for real through Podman, then prove it kept its promises.

``scripts/compose-check.sh`` (and so CI) runs ``python -m deploy.compose_check``:

1. images: a Debian bookworm root made by debootstrap, and on it the local stand-ins for the
   official images (``deploy/compose-local/``) plus ``deploy/Dockerfile`` itself. Every image is
   tagged with a hash of its inputs and reused while they do not change;
2. ``docker-compose up -d`` of the real file plus ``deploy/compose-local/docker-compose.local.yml``
   (Compose 1.29 from Debian talking to ``podman system service``: unlike podman-compose on
   Podman 4.3 it waits for ``service_healthy`` and checks ``service_completed_successfully``'s
   exit code); Podman runs health checks through systemd timers, and there is no systemd here, so
   :class:`HealthChecks` runs each container's own check at its own interval instead;
3. Caddy's root certificate copied out of the ``tls`` container (README's operator step) and
   ``/readyz`` over HTTPS with it; ``tenure bootstrap`` in the api container, then a tenant, a
   member, one belief and a recall through the host's ``tenure`` CLI, over TLS; that recall's
   message must have been analysed in the API process (the image's JVM and OpenSearch's jars);
4. the ``load`` profile through the TLS proxy for ``--load-seconds``; its report must say that no
   acknowledged write or turn was lost;
5. ``down`` (containers gone, named volumes kept) and ``up -d`` again: the document counts, the
   operator and member keys, the belief's recall, a Redis key and the TLS root must all have
   survived;
6. ``down -v``: containers, volumes and the Podman service go; images stay as the cache.

Prints one JSON report (``--out`` writes it too); exits 1 when any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from deploy.devstack import free_port

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "deploy" / "compose-local"
# The TLS proxy: the Caddy release deploy/caddy/release/go.mod pins, built by scripts/build-caddy.sh.
CADDY_RELEASE = REPO / "deploy" / "caddy" / "release"
CADDY_BINARY = Path("/usr/local/bin/caddy")
OVERRIDE = LOCAL / "docker-compose.local.yml"
CONTAINERS_CONF = LOCAL / "containers.conf"
HOST_CAS = Path("/usr/local/share/ca-certificates")
# Everything the stand-in images need from Debian, installed once by debootstrap (one download;
# debootstrap does not resolve virtual packages, hence python3-distutils for python3.11-venv).
BASE_PACKAGES = (
    "python3.11",
    "python3.11-venv",
    "python3-distutils",
    "python3-pip-whl",
    "python3-setuptools-whl",
    "redis-server",
    "openjdk-17-jre-headless",
    "curl",
    "ca-certificates",
    "caddy",
    "wget",
)
# What deploy/Dockerfile copies into the service image (its cache key).
SERVICE_INPUTS = ("pyproject.toml", "README.md", "service", "workers", "evals", "index_templates", "clients/python")
SERVICE_INPUTS_LATE = (
    "loadtest",
    "deploy/Dockerfile",
    "deploy/requirements.lock",
    # the query analysis stage: OpenSearch's jars and the classes that drive them
    "deploy/opensearch/pom.xml",
    "deploy/opensearch/build.sh",
    "deploy/opensearch/DevOpenSearch.java",
    "deploy/opensearch/TenureAnalysisPlugin.java",
    "deploy/opensearch/QueryAnalysis.java",
)
CORE_HEALTHY = ("opensearch", "redis", "api", "worker", "beat", "tls")
CADDYFILE = REPO / "deploy" / "caddy" / "Caddyfile"
# Where Caddy keeps its own CA's root (the official image's XDG_DATA_HOME is /data, the caddy-data
# volume): README "Deploy with docker compose" has operators copy it out the same way.
CADDY_ROOT = "/data/caddy/pki/authorities/local/root.crt"


def say(text: str) -> None:
    sys.stdout.write(f"[compose-check {time.strftime('%H:%M:%S')}] {text}\n")
    sys.stdout.flush()


def run(args: Sequence[str], env: dict[str, str] | None = None, check: bool = True, **kw: Any) -> str:
    done: subprocess.CompletedProcess[str] = subprocess.run(
        list(args), env=env, capture_output=True, text=True, check=False, **kw
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:6])} ... exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def content_hash(paths: Iterable[Path], *extra: str) -> str:
    """sha256 over the files under ``paths`` (names and bytes, caches skipped) and ``extra``."""
    digest = hashlib.sha256()
    for value in extra:
        digest.update(value.encode() + b"\0")
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc" or ".egg-info" in str(path):
                continue
            name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            digest.update(str(name).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------ images


@dataclass
class Images:
    base: str = ""
    python: str = ""
    service: str = ""
    opensearch: str = ""
    redis: str = ""
    caddy: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    cached: dict[str, bool] = field(default_factory=dict)


class Podman:
    """Podman with this project's containers.conf (runc, no default ulimits); nothing in /etc."""

    def __init__(self, state: Path) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
        self.socket = state / "podman.sock"
        self.service: subprocess.Popen[bytes] | None = None
        self.log = state / "podman-service.log"

    def __call__(self, *args: str, check: bool = True) -> str:
        return run(["podman", *args], env=self.env, check=check)

    def exists(self, image: str) -> bool:
        return subprocess.run(["podman", "image", "exists", image], env=self.env, check=False).returncode == 0

    def build(self, tag: str, dockerfile: Path, context: Path, **build_args: str) -> None:
        args = ["build", "--network", "host", "-t", tag, "-f", str(dockerfile)]
        for name, value in build_args.items():
            args += ["--build-arg", f"{name}={value}"]
        self(*args, str(context))

    def start_service(self) -> None:
        """The Docker-compatible API Compose talks to, on a socket of this run only."""
        with self.log.open("wb") as log:
            self.service = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if time.monotonic() > deadline or self.service.poll() is not None:
                raise RuntimeError(f"podman system service did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def stop_service(self) -> None:
        if self.service and self.service.poll() is None:
            os.killpg(self.service.pid, signal.SIGTERM)
            try:
                self.service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.service.pid, signal.SIGKILL)
                self.service.wait(timeout=30)


def ensure_image(podman: Podman, images: Images, name: str, tag: str, make: Any) -> str:
    """Build ``tag`` with ``make()`` unless an image of the same inputs exists already."""
    started = time.monotonic()
    images.cached[name] = podman.exists(tag)
    if not images.cached[name]:
        say(f"building {tag} ...")
        make()
    images.seconds[name] = round(time.monotonic() - started, 1)
    return tag


def debootstrap_base(podman: Podman, tag: str, state: Path) -> None:
    rootfs = state / "rootfs"
    run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", str(rootfs),
         "http://deb.debian.org/debian"]
    )  # fmt: skip
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:  # noqa: S607
        subprocess.run(
            ["podman", "import", "-", tag], stdin=tar.stdout, env=podman.env, check=True, capture_output=True
        )
    shutil.rmtree(rootfs, ignore_errors=True)


def build_images(podman: Podman, state: Path) -> Images:
    images = Images()
    base_tag = "localhost/tenure-local-debian:" + content_hash([], "bookworm", *BASE_PACKAGES)
    images.base = ensure_image(podman, images, "debian", base_tag, lambda: debootstrap_base(podman, base_tag, state))

    # pip in the image must trust what the host trusts: certificate authorities added locally
    # (a TLS-inspecting egress proxy's, on CI) go into the image's store, none elsewhere
    cas = sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []
    python_tag = "localhost/tenure-local-python:" + content_hash([LOCAL / "python.Dockerfile", *cas], base_tag)

    def build_python() -> None:
        context = state / "python-context"
        (context / "ca-certificates").mkdir(parents=True)
        for ca in cas:
            shutil.copy(ca, context / "ca-certificates" / ca.name)
        podman.build(python_tag, LOCAL / "python.Dockerfile", context, BASE_IMAGE=base_tag)

    images.python = ensure_image(podman, images, "python", python_tag, build_python)

    inputs = [REPO / p for p in (*SERVICE_INPUTS, *SERVICE_INPUTS_LATE)]
    service_tag = "localhost/tenure-local-service:" + content_hash(inputs, python_tag)
    images.service = ensure_image(
        podman, images, "service", service_tag,
        lambda: podman.build(service_tag, REPO / "deploy" / "Dockerfile", REPO, PYTHON_IMAGE=python_tag),
    )  # fmt: skip

    os_dir = REPO / "deploy" / "opensearch"
    os_inputs = [LOCAL / "opensearch.Dockerfile", LOCAL / "opensearch-entrypoint.sh", os_dir / ".built"]
    os_tag = "localhost/tenure-local-opensearch:" + content_hash(os_inputs, base_tag)
    images.opensearch = ensure_image(
        podman, images, "opensearch", os_tag,
        lambda: podman.build(os_tag, LOCAL / "opensearch.Dockerfile", REPO / "deploy", BASE_IMAGE=base_tag),
    )  # fmt: skip

    redis_tag = "localhost/tenure-local-redis:" + content_hash(
        [LOCAL / "redis.Dockerfile", LOCAL / "redis-entrypoint.sh"], base_tag
    )
    images.redis = ensure_image(
        podman, images, "redis", redis_tag,
        lambda: podman.build(redis_tag, LOCAL / "redis.Dockerfile", LOCAL, BASE_IMAGE=base_tag),
    )  # fmt: skip

    caddy_tag = "localhost/tenure-local-caddy:" + content_hash([LOCAL / "caddy.Dockerfile", CADDY_RELEASE], base_tag)

    def build_caddy() -> None:
        context = state / "caddy-context"
        context.mkdir(parents=True)
        shutil.copy(pinned_caddy(), context / "caddy")
        podman.build(caddy_tag, LOCAL / "caddy.Dockerfile", context, BASE_IMAGE=base_tag)

    images.caddy = ensure_image(podman, images, "caddy", caddy_tag, build_caddy)
    return images


# ------------------------------------------------------------------------------ health checks


class HealthChecks:
    """Runs every project container's own health check (``podman healthcheck run``) at the
    interval the compose file gave it: what Podman's systemd timers would do where systemd runs.
    ``podman healthcheck run`` itself honours start_period, retries and timeout."""

    def __init__(self, podman: Podman, project: str) -> None:
        self.podman = podman
        self.project = project
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="healthchecks", daemon=True)
        self.due: dict[str, float] = {}

    def __enter__(self) -> HealthChecks:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

    def _running(self) -> list[tuple[str, float]]:
        out = self.podman(
            "ps", "--filter", f"label=com.docker.compose.project={self.project}", "--format", "json", check=False
        )
        found = []
        for container in json.loads(out or "[]"):
            cid = container["Id"]
            inspected = json.loads(self.podman("inspect", cid, check=False) or "[]")
            check = inspected[0].get("Config", {}).get("Healthcheck") if inspected else None
            if check and check.get("Test") and check["Test"][0] != "NONE":
                found.append((cid, max(float(check.get("Interval") or 30e9) / 1e9, 1.0)))
        return found

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            now = time.monotonic()
            for cid, interval in self._running():
                if self.due.get(cid, 0.0) <= now:
                    self.due[cid] = now + interval
                    self.podman("healthcheck", "run", cid, check=False)


# ------------------------------------------------------------------------------------ compose


def for_compose_v1(path: Path) -> dict[str, Any]:
    """The real file as Compose 1.29 on host networking can run it, nothing else changed:
    - without the top-level ``name:`` (newer than 1.29, the only key it rejects); the same project
      name is given with ``-p``;
    - without published ``ports:``: on host networking a service listens on the host's loopback
      itself, publishing means nothing, and docker-py refuses the combination before asking Podman.
    Anchors and merge keys are resolved by the YAML load; ``${VAR}`` stays for Compose."""
    spec: dict[str, Any] = yaml.safe_load(path.read_text())
    spec.pop("name", None)
    for service in spec["services"].values():
        service.pop("ports", None)
    return spec


class Compose:
    """``docker-compose`` (1.29, Debian) on the real file + the local override, one project."""

    def __init__(self, podman: Podman, project: str, state: Path, env: dict[str, str]) -> None:
        self.project = project
        self.file = state / "docker-compose.yml"
        self.file.write_text(yaml.safe_dump(for_compose_v1(REPO / "docker-compose.yml"), sort_keys=False))
        self.env = {**podman.env, **env, "DOCKER_HOST": f"unix://{podman.socket}", "COMPOSE_HTTP_TIMEOUT": "600"}
        self.podman = podman

    def __call__(self, *args: str, check: bool = True, timeout: float | None = None) -> str:
        cmd = ["docker-compose", "-p", self.project, "--project-directory", str(REPO), "-f", str(self.file)]
        cmd += ["-f", str(OVERRIDE), *args]
        return run(cmd, env=self.env, check=check, timeout=timeout)

    def container(self, service: str) -> str:
        return self("ps", "-q", service).strip().splitlines()[0]

    def health(self, service: str) -> str:
        out = self.podman("inspect", self.container(service), "--format", "{{.State.Health.Status}}", check=False)
        return out.strip()

    def wait_healthy(self, services: Sequence[str], timeout_s: float) -> float:
        started = time.monotonic()
        while True:
            states = {s: self.health(s) for s in services}
            if all(v == "healthy" for v in states.values()):
                return round(time.monotonic() - started, 1)
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"not healthy after {timeout_s:.0f} s: {states}")
            time.sleep(2)


def cli(env: dict[str, str], *args: str) -> Any:
    out = run([str(REPO / ".venv" / "bin" / "tenure"), "--json", *args], env=env)
    return json.loads(out)


@dataclass
class Marker:
    operator_key: str
    member_key: str
    belief_id: str


def cli_env(public_url: str, tls_root: Path, key: str) -> dict[str, str]:
    """The host's ``tenure`` CLI as a client of the public endpoint (httpx reads SSL_CERT_FILE)."""
    return {**os.environ, "TENURE_CLI_URL": public_url, "TENURE_CLI_KEY": key, "SSL_CERT_FILE": str(tls_root)}


def write_marker(compose: Compose, public_url: str, tls_root: Path) -> Marker:
    boot = json.loads(compose("exec", "-T", "api", "tenure", "--json", "bootstrap"))
    env = cli_env(public_url, tls_root, boot["key"])
    cli(env, "create-tenant", "acme")
    cli(env, "create-user", "acme", "alice", "--project", "payments")
    member = cli(env, "issue-key", "acme", "alice")["key"]
    env["TENURE_CLI_KEY"] = member
    added = cli(
        env, "add", "session_store", "--type", "decision", "--scope", "project:payments",
        "--alias", "sticky sessions", "--content", "Sessions live in Redis.",
        "--why", "Never add sticky sessions: any instance must serve any request.",
    )  # fmt: skip
    return Marker(boot["key"], member, str(added.get("id") or added.get("belief", {}).get("id")))


def marker_recalled(public_url: str, tls_root: Path, marker: Marker) -> bool:
    env = cli_env(public_url, tls_root, marker.member_key)
    result = cli(env, "recall", "--scope", "project:payments", "can we just use sticky sessions?")
    return "Never add sticky sessions" in json.dumps(result)


def store_counts(opensearch_url: str, compose: Compose) -> dict[str, int]:
    """Every document each family holds, refreshed first: the audit index refreshes only every
    30 s (its template), so a plain count would miss the receipts drained last."""
    counts = {}
    for family in ("beliefs", "accounts", "audit", "turns"):
        httpx.post(f"{opensearch_url}/tenure-{family}/_refresh", timeout=60)
        response = httpx.get(f"{opensearch_url}/tenure-{family}/_count", timeout=30)
        counts[family] = int(response.json().get("count", -1)) if response.status_code == 200 else -1
    port = compose.env["REDIS_PORT"]
    counts["redis_keys"] = int(compose("exec", "-T", "redis", "redis-cli", "-p", port, "dbsize").strip())
    return counts


def query_analysis_counts(api_url: str) -> dict[str, float]:
    """``tenure_recall_query_analysis_total`` of the API container (its workers' samples merged),
    by where a recall's message was analysed: ``process`` (the image's JVM running OpenSearch's
    analysis code, once checked against the node) or ``node`` (an ``_mtermvectors`` round trip)."""
    counts: dict[str, float] = {}
    for line in httpx.get(f"{api_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("tenure_recall_query_analysis_total{"):
            labels, _, value = line.rpartition(" ")
            counts[labels.split('where="', 1)[1].split('"', 1)[0]] = float(value)
    return counts


def redis_marker(compose: Compose, value: str | None = None) -> str:
    port = compose.env["REDIS_PORT"]
    if value is not None:
        compose("exec", "-T", "redis", "redis-cli", "-p", port, "set", "compose-check:marker", value)
    return compose("exec", "-T", "redis", "redis-cli", "-p", port, "get", "compose-check:marker").strip()


def run_load(compose: Compose, timeout_s: float) -> dict[str, Any]:
    """The load profile's two services, once everything they depend on is healthy (checked by
    ``up -d`` and :meth:`Compose.wait_healthy`). ``--no-deps``: without it Compose starts the
    finished one-shot ``templates`` container again, and Podman 4.3 re-mounts a restarted
    container's tmpfs without its ``mode=1777`` (root-owned 0755), so the non-root image cannot
    write its metrics files there and exits 1. Docker mounts a fresh tmpfs with its options."""
    compose("--profile", "load", "up", "-d", "--no-deps", "llm", "load", timeout=timeout_s)
    container = compose("--profile", "load", "ps", "-q", "load").strip()
    code = int(compose.podman("wait", container).strip() or "1")
    logs = compose.podman("logs", container, check=False)
    result = json.loads(
        compose("--profile", "load", "run", "--rm", "--no-deps", "--entrypoint", "cat", "load", "/results/load.json")
    )
    report, verification = result["report"], result["verification"]
    loaded = {"exit_code": code, "log_tail": logs[-1500:], "report": report, "verification": verification}
    if code:
        loaded["server_log_errors"] = server_log_errors(compose)
    return loaded


SERVER_ERROR_LINES_KEPT = 20
# the API's error lines (service/telemetry/logs.py) and uvicorn's supervisor replacing a worker it
# found hung or dead ("Child process [...] died")
API_ERROR_MARKERS = ('"level": "ERROR"', "Traceback", "Child process")


def is_proxy_error(line: str) -> bool:
    """A Caddy log line about a fault: its own errors and warnings (``aborting with incomplete
    response``, an unreachable upstream), and access entries of 5xx answers. Caddy logs every 4xx
    access at level error too; a run's 429s are expected and would crowd the faults out."""
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    if not isinstance(entry, dict) or entry.get("level") not in ("error", "warn"):
        return False
    if str(entry.get("logger", "")).startswith("http.log.access"):
        return int(entry.get("status") or 0) >= 500
    return True


def is_api_error(line: str) -> bool:
    return any(marker in line for marker in API_ERROR_MARKERS)


def server_log_errors(compose: Compose) -> dict[str, list[str]]:
    """The last fault lines of the proxy's and the API's logs, kept by a failed load run so that a
    one-off transport error can be explained (both write them to stderr, which ``podman logs``
    keeps apart from stdout: read together here)."""
    kept: dict[str, list[str]] = {}
    for service, is_error in (("tls", is_proxy_error), ("api", is_api_error)):
        log = subprocess.run(
            ["podman", "logs", compose.container(service)], env=compose.podman.env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
        ).stdout  # fmt: skip
        errors = [line for line in log.splitlines() if is_error(line)]
        kept[service] = [line[:2000] for line in errors[-SERVER_ERROR_LINES_KEPT:]]
    return kept


# ----------------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class LoadSize:
    """The load profile's fleet and run time (the override's LOAD_* knobs; defaults: the real file's)."""

    seconds: int = 45
    tenants: int = 8
    users_per_tenant: int = 4
    concurrency: int = 32
    seed_beliefs: int = 20

    def environment(self) -> dict[str, str]:
        return {
            "LOAD_DURATION": str(self.seconds),
            "LOAD_TENANTS": str(self.tenants),
            "LOAD_USERS_PER_TENANT": str(self.users_per_tenant),
            "LOAD_CONCURRENCY": str(self.concurrency),
            "LOAD_SEED_BELIEFS": str(self.seed_beliefs),
        }


PORT_NAMES = (
    "OPENSEARCH_PORT", "OPENSEARCH_TRANSPORT_PORT", "REDIS_PORT", "API_PORT", "LLM_PORT",
    "HTTPS_PORT", "HTTP_PORT", "CADDY_ADMIN_PORT", "WORKER_METRICS_PORT",
)  # fmt: skip


def environment(load: LoadSize) -> dict[str, str]:
    ports = {name: str(free_port()) for name in PORT_NAMES}
    return {
        **ports,
        "TENURE_AUTH_API_KEY_PEPPER": uuid.uuid4().hex,
        "TENURE_OPENSEARCH_URL": f"http://127.0.0.1:{ports['OPENSEARCH_PORT']}",
        "TENURE_REDIS_URL": f"redis://127.0.0.1:{ports['REDIS_PORT']}/0",
        "TENURE_LOOP_UPSTREAM_BASE_URL": f"http://127.0.0.1:{ports['LLM_PORT']}/v1",
        # the file's knobs, sized for a 2-core CI box shared with the test suite
        "OPENSEARCH_HEAP": "512m",
        "OPENSEARCH_MEM_LIMIT": "1500m",
        "API_WORKERS": "2",
        "WORKER_CONCURRENCY": "2",
        **load.environment(),
        "HOST_MEMLOCK_LIMIT": str(host_limit(resource.RLIMIT_MEMLOCK, -1)),
        "HOST_NOFILE_LIMIT": str(host_limit(resource.RLIMIT_NOFILE, 65536)),
    }


def host_limit(kind: int, wanted: int) -> int:
    """What the real file asks for (``wanted``, -1: unlimited), capped at this process's hard limit."""
    hard = resource.getrlimit(kind)[1]
    if hard == resource.RLIM_INFINITY:
        return wanted
    return hard if wanted == -1 else min(hard, wanted)


def caddy_release() -> str:
    """The Caddy release deploy/caddy/release/go.mod pins (``v2.11.9``); docker-compose.yml's ``tls``
    image is the same one."""
    found = re.search(
        r"^require github\.com/caddyserver/caddy/v2 (v\S+)$", (CADDY_RELEASE / "go.mod").read_text(), re.M
    )
    if found is None:
        raise RuntimeError(f"{CADDY_RELEASE / 'go.mod'} names no Caddy release")
    return found.group(1)


def pinned_caddy() -> Path:
    """scripts/build-caddy.sh's binary, checked to be the pinned release (a Caddy of another
    version, Debian's 2.6.2 for one, reads the Caddyfile differently)."""
    release = caddy_release()
    if CADDY_BINARY.is_file():
        version = subprocess.run([CADDY_BINARY, "version"], capture_output=True, text=True, check=True).stdout
        if version.split(" ", 1)[0] == release:
            return CADDY_BINARY
    raise RuntimeError(f"{CADDY_BINARY} is not Caddy {release}: run scripts/build-caddy.sh (scripts/setup.sh does)")


def local_caddyfile(env: dict[str, str]) -> str:
    """deploy/caddy/Caddyfile as the host-networked run needs it: the admin endpoint, the HTTP and
    HTTPS listeners on free loopback ports (every container shares the host's network) and the API
    at its loopback port instead of ``api:8000``. Each swap must match exactly once, so a change to
    the real file that this does not know about fails the check instead of being papered over."""
    text = CADDYFILE.read_text()
    swaps = {
        "\tadmin 127.0.0.1:2019\n": (
            f"\tadmin 127.0.0.1:{env['CADDY_ADMIN_PORT']}\n\tdefault_bind 127.0.0.1\n"
            f"\thttp_port {env['HTTP_PORT']}\n\thttps_port {env['HTTPS_PORT']}\n"
        ),
        "reverse_proxy api:8000 {": f"reverse_proxy 127.0.0.1:{env['API_PORT']} {{",
    }
    for old, new in swaps.items():
        if text.count(old) != 1:
            raise RuntimeError(f"deploy/caddy/Caddyfile changed: {old.strip()!r} is not there exactly once")
        text = text.replace(old, new)
    return text


def fetch_tls_root(compose: Compose, into: Path) -> Path:
    """The documented operator step (`docker compose cp tls:<root.crt> .`): Compose 1.29 has no
    ``cp``, Podman's is the same copy. Readable by the load container's non-root user."""
    compose.podman("cp", f"{compose.container('tls')}:{CADDY_ROOT}", str(into))
    into.chmod(0o644)
    return into


def readyz_over_tls(public_url: str, root: Path) -> int:
    """What README's `curl --cacert tenure-root.crt https://localhost/readyz` checks."""
    trust = ssl.create_default_context(cafile=str(root))
    return httpx.get(f"{public_url}/readyz", verify=trust, timeout=15).status_code


def show_logs(podman: Podman, project: str, lines: int = 40) -> None:
    """The last lines of every container of the project: what a failed check is read from."""
    label = f"label=com.docker.compose.project={project}"
    for name in podman("ps", "-a", "--filter", label, "--format", "{{.Names}}", check=False).split():
        done = subprocess.run(
            ["podman", "logs", "--tail", str(lines), name], env=podman.env, capture_output=True, text=True, check=False
        )
        say(f"--- {name} (last {lines} lines)\n{done.stdout}{done.stderr}")


@contextlib.contextmanager
def stack(podman: Podman, compose: Compose) -> Iterator[None]:
    try:
        with HealthChecks(podman, compose.project):
            yield
    except BaseException:
        show_logs(podman, compose.project)
        raise
    finally:
        say("tearing down (containers, volumes) ...")
        compose("--profile", "load", "down", "-v", "--remove-orphans", "-t", "20", check=False, timeout=300)
        leftover = podman("ps", "-aq", "--filter", f"label=com.docker.compose.project={compose.project}", check=False)
        for cid in leftover.split():
            podman("rm", "-f", "-t", "0", cid, check=False)
        for volume in podman(
            "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={compose.project}", check=False
        ).split():
            podman("volume", "rm", "-f", volume, check=False)


def check(load: LoadSize, state: Path) -> dict[str, Any]:
    started = time.monotonic()
    podman = Podman(state)
    result: dict[str, Any] = {"ok": False, "load_size": asdict(load), "podman": podman("--version").strip()}
    images = build_images(podman, state)
    result["images"] = {
        "tags": {k: getattr(images, k) for k in ("base", "python", "service", "opensearch", "redis", "caddy")},
        "seconds": images.seconds,
        "cached": images.cached,
    }
    env = environment(load)
    caddyfile = state / "Caddyfile"
    caddyfile.write_text(local_caddyfile(env))
    tls_root = state / "tenure-root.crt"
    tls_root.touch()  # mounted into the load container; filled from the tls container once it runs
    env.update(
        TENURE_LOCAL_SERVICE_IMAGE=images.service,
        TENURE_LOCAL_OPENSEARCH_IMAGE=images.opensearch,
        TENURE_LOCAL_REDIS_IMAGE=images.redis,
        TENURE_LOCAL_CADDY_IMAGE=images.caddy,
        TENURE_LOCAL_CADDYFILE=str(caddyfile),
        TENURE_LOCAL_TLS_ROOT=str(tls_root),
    )
    # every client call goes through the TLS proxy, as a client of the deployment would
    public_url = f"https://localhost:{env['HTTPS_PORT']}"
    project = f"tenurecheck{uuid.uuid4().hex[:6]}"
    podman.start_service()
    try:
        compose = Compose(podman, project, state, env)
        with stack(podman, compose):
            t0 = time.monotonic()
            say(f"up -d (project {project}) ...")
            compose("up", "-d", "--no-build", timeout=900)
            result["up_to_healthy_s"] = round(time.monotonic() - t0 + compose.wait_healthy(CORE_HEALTHY, 600), 1)
            fetch_tls_root(compose, tls_root)
            result["readyz_over_tls"] = readyz_over_tls(public_url, tls_root)
            say(f"healthy after {result['up_to_healthy_s']} s; bootstrap, tenant, member, belief over TLS ...")
            marker = write_marker(compose, public_url, tls_root)
            result["marker_recalled_before"] = marker_recalled(public_url, tls_root, marker)
            # the deployed image analyses a recall's message in the API process (no round trip)
            result["query_analysis"] = query_analysis_counts(f"http://127.0.0.1:{env['API_PORT']}")
            say("recall messages analysed: " + json.dumps(result["query_analysis"]))
            redis_marker(compose, project)
            say(f"load profile through the TLS proxy for {load.seconds} s ...")
            t_load = time.monotonic()
            result["load"] = summarize_load(run_load(compose, timeout_s=load.seconds + 900))
            result["load"]["wall_s"] = round(time.monotonic() - t_load, 1)
            before = store_counts(env["TENURE_OPENSEARCH_URL"], compose)
            say(f"load done ({result['load']['wall_s']} s, ok={result['load']['ok']}); down (volumes kept), up ...")
            compose("--profile", "load", "down", "-t", "30", timeout=600)
            t1 = time.monotonic()
            compose("up", "-d", "--no-build", timeout=900)
            result["restart_to_healthy_s"] = round(time.monotonic() - t1 + compose.wait_healthy(CORE_HEALTHY, 600), 1)
            after = store_counts(env["TENURE_OPENSEARCH_URL"], compose)
            result["survived"] = {
                "counts_before": before,
                "counts_after": after,
                "beliefs_audit_accounts_turns_equal": all(
                    before[k] == after[k] for k in ("beliefs", "accounts", "audit", "turns")
                ),
                # the same root still verifies the proxy: Caddy's CA survived on caddy-data
                "readyz_over_tls_same_root": readyz_over_tls(public_url, tls_root) == 200,
                "marker_recalled_after": marker_recalled(public_url, tls_root, marker),
                "redis_marker": redis_marker(compose) == project,
            }
            say("survived: " + json.dumps(result["survived"]))
        result["ok"] = bool(
            result["readyz_over_tls"] == 200
            and result["marker_recalled_before"]
            and result["query_analysis"].get("process", 0) > 0
            and result["load"]["ok"]
            and all(v for k, v in result["survived"].items() if k not in ("counts_before", "counts_after"))
        )
    finally:
        podman.stop_service()
    result["total_s"] = round(time.monotonic() - started, 1)
    return result


# what the check keeps of the load report: 429s are counted apart from the errors (not a failure)
LOAD_FIGURES = (
    "elapsed_s", "total_requests", "total_errors", "total_rate_limited", "throughput_ok_s", "isolation_leaks",
    "transport_errors",
)  # fmt: skip


def summarize_load(load: dict[str, Any]) -> dict[str, Any]:
    report, verification = load["report"], load["verification"]
    return {
        "exit_code": load["exit_code"],
        "ok": load["exit_code"] == 0 and bool(verification.get("ok")),
        "report": {k: report.get(k) for k in LOAD_FIGURES},
        "verification": verification,
        "log_tail": load["log_tail"] if load["exit_code"] else "",
        "server_log_errors": load.get("server_log_errors", {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.compose_check", description=__doc__.splitlines()[0])
    default = LoadSize()
    parser.add_argument("--load-seconds", type=int, default=int(os.environ.get("TENURE_COMPOSE_LOAD_S", "45")))
    parser.add_argument("--tenants", type=int, default=default.tenants)
    parser.add_argument("--users-per-tenant", type=int, default=default.users_per_tenant)
    parser.add_argument("--concurrency", type=int, default=default.concurrency)
    parser.add_argument("--seed-beliefs", type=int, default=default.seed_beliefs, help="per user")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    load = LoadSize(args.load_seconds, args.tenants, args.users_per_tenant, args.concurrency, args.seed_beliefs)
    state = Path(tempfile.mkdtemp(prefix="tenure-compose-check-"))
    try:
        result = check(load, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
