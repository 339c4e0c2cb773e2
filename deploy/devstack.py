"""Start, wait for and stop the local stack: a real OpenSearch node and a real Redis server.

Stdlib only, so it runs before the virtualenv exists. Used three ways:
- ``python deploy/devstack.py up|down|status`` for development (state in ``.devstack/``);
- :func:`start_opensearch` / :func:`start_redis` from the pytest session fixture (fresh dirs,
  free ports, torn down at the end);
- benchmarks and evals, which start their own node the same way.
No mocks, no in-memory fakes: the OpenSearch node is the real server code (see
deploy/opensearch/README.md), Redis is Debian's redis-server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OS_DIR = REPO / "deploy" / "opensearch"
STATE_DIR = REPO / ".devstack"
JAVA = os.environ.get("TENURE_JAVA", "/usr/lib/jvm/java-17-openjdk-amd64/bin/java")
# JVM options every OpenSearch node of ours runs with, the compose image's too (it copies this
# directory into config/jvm.options.d/): one definition for both.
NODE_JVM_OPTIONS_DIR = REPO / "deploy" / "opensearch-image" / "jvm.options.d"


def node_jvm_options(directory: Path = NODE_JVM_OPTIONS_DIR) -> list[str]:
    """The options of ``directory``'s ``*.options`` files, in file-name order, as OpenSearch reads a
    ``jvm.options.d``: one per line, blank lines and ``#`` comments skipped."""
    return [
        line.strip()
        for path in sorted(directory.glob("*.options"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


JVM_FLAGS = [
    "-XX:+UseG1GC",
    "-Xss1m",
    "-Dio.netty.noUnsafe=true",
    "-Dio.netty.noKeySetOptimization=true",
    "-Dio.netty.recycler.maxCapacityPerThread=0",
    "-Dio.netty.allocator.numDirectArenas=0",
    "-Dlog4j.shutdownHookEnabled=false",
    "-Dlog4j2.disable.jmx=true",
    "-Djava.locale.providers=SPI,COMPAT",
    "-Dfile.encoding=UTF-8",
    "-Djava.awt.headless=true",
    "-XX:-OmitStackTraceInFastThrow",
    *node_jvm_options(),
]


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    url: str
    home: Path

    def stop(self, timeout_s: float = 30.0) -> None:
        stop_pid(self.process.pid, timeout_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_pid(pid: int, timeout_s: float = 30.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return
        except (ProcessLookupError, ChildProcessError):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def build_opensearch() -> None:
    subprocess.run(["bash", str(OS_DIR / "build.sh")], check=True)


def _http_ok(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return bool(200 <= resp.status < 300)
    except (urllib.error.URLError, OSError):
        return False


def _put_json(url: str, body: dict[str, object]) -> None:
    req = urllib.request.Request(  # noqa: S310 - loopback only
        url, method="PUT", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
        resp.read()


def start_opensearch(
    home: Path,
    port: int | None = None,
    heap: str = "1g",
    timeout_s: float = 180.0,
    *,
    fresh: bool = True,
    java: str | None = None,
    jvm_flags: list[str] | None = None,
) -> Service:
    """Start one embedded OpenSearch node under ``home``; wait until green-ish. ``fresh`` wipes the
    home first; ``fresh=False`` restarts on the existing data dir (crash tests restart a killed node).
    ``java`` / ``jvm_flags`` replace ``JAVA`` / ``JVM_FLAGS`` (benchmarks/node_jvm_ab.py compares JVMs)."""
    build_opensearch()
    port = port or free_port()
    transport = free_port()
    if fresh and home.exists():
        shutil.rmtree(home)
    (home / "config").mkdir(parents=True, exist_ok=not fresh)
    (home / "tmp").mkdir(exist_ok=not fresh)
    (home / "config" / "opensearch.yml").write_text(
        "\n".join(
            [
                "cluster.name: tenure-dev",
                "node.name: node-1",
                "network.host: 127.0.0.1",
                f"http.port: {port}",
                f"transport.port: {transport}",
                "discovery.type: single-node",
                "cluster.routing.allocation.disk.threshold_enabled: false",
                "action.auto_create_index: false",
                "cluster.max_shards_per_node: 5000",
                "",
            ]
        )
    )
    shutil.copy(OS_DIR / "log4j2.properties", home / "config" / "log4j2.properties")
    log = open(home / "server.log", "wb" if fresh else "ab")  # noqa: SIM115 - handed to the child process
    cmd = [
        java or JAVA,
        f"-Xms{heap}",
        f"-Xmx{heap}",
        f"-Djava.io.tmpdir={home / 'tmp'}",
        *(JVM_FLAGS if jvm_flags is None else jvm_flags),
        "-cp",
        f"{OS_DIR / 'classes'}:{OS_DIR / 'lib'}/*",
        "DevOpenSearch",
        str(home),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while not _http_ok(f"{url}/_cluster/health?wait_for_status=yellow&timeout=5s", timeout=10):
        if proc.poll() is not None:
            raise RuntimeError(f"OpenSearch exited early (code {proc.returncode}); see {home / 'server.log'}")
        if time.time() > deadline:
            stop_pid(proc.pid)
            raise RuntimeError(f"OpenSearch did not answer within {timeout_s:.0f}s; see {home / 'server.log'}")
        time.sleep(1)
    # a single node can never allocate replicas; this setting is ignored in opensearch.yml on 2.19
    _put_json(f"{url}/_cluster/settings", {"persistent": {"cluster.default_number_of_replicas": 0}})
    return Service("opensearch", proc, url, home)


def redis_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if not found:
        raise RuntimeError("redis-server is not installed; run scripts/setup.sh (apt-get install redis-server)")
    return found


def start_redis(home: Path, port: int | None = None, timeout_s: float = 30.0, *, fresh: bool = True) -> Service:
    """A real redis-server with an append-only file, so an acknowledged enqueue survives a crash.
    ``fresh=False`` restarts on the existing dir, replaying its append-only file."""
    port = port or free_port()
    if fresh and home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=not fresh)
    log = open(home / "server.log", "wb" if fresh else "ab")  # noqa: SIM115
    cmd = [
        redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(home),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        # the AOF rewrite's RDB preamble is mostly zlib-compressed vocabularies: LZF on them only
        # burns CPU (service/redis_advice.py); and a rewrite once the file has grown by four times
        # its base instead of once makes a quarter as many (docs/operations.md; the compose file's
        # Redis has the same settings)
        "--rdbcompression",
        "no",
        "--auto-aof-rewrite-percentage",
        "400",
        "--maxmemory-policy",
        "noeviction",
        "--save",
        "",
        "--protected-mode",
        "yes",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited early; see {home / 'server.log'}")
        if time.time() > deadline:
            stop_pid(proc.pid)
            raise RuntimeError("redis-server did not answer")
        time.sleep(0.2)
    return Service("redis", proc, f"redis://127.0.0.1:{port}/0", home)


# ------------------------------------------------------------------------------------------ CLI


def _state() -> dict[str, dict[str, object]]:
    path = STATE_DIR / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _save(state: dict[str, dict[str, object]]) -> None:
    STATE_DIR.mkdir(exist_ok=True)
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2))


def process_alive(pid: object) -> bool:
    try:
        os.kill(int(str(pid)), 0)
        return True
    except (ProcessLookupError, ValueError):
        return False


def up(os_port: int, redis_port: int, heap: str) -> dict[str, dict[str, object]]:
    state = {k: v for k, v in _state().items() if process_alive(v.get("pid"))}
    if "opensearch" not in state:
        svc = start_opensearch(STATE_DIR / "opensearch", os_port, heap=heap)
        state["opensearch"] = {"pid": svc.process.pid, "url": svc.url}
    if "redis" not in state:
        svc = start_redis(STATE_DIR / "redis", redis_port)
        state["redis"] = {"pid": svc.process.pid, "url": svc.url}
    _save(state)
    return state


def down() -> None:
    for info in _state().values():
        stop_pid(int(str(info["pid"])))
    _save({})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "build"])
    parser.add_argument("--opensearch-port", type=int, default=int(os.environ.get("TENURE_OPENSEARCH_PORT", "9200")))
    parser.add_argument("--redis-port", type=int, default=int(os.environ.get("TENURE_REDIS_PORT", "6379")))
    parser.add_argument("--heap", default=os.environ.get("TENURE_OPENSEARCH_HEAP", "1g"))
    args = parser.parse_args(argv)
    if args.command == "build":
        build_opensearch()
    elif args.command == "up":
        print(json.dumps(up(args.opensearch_port, args.redis_port, args.heap), indent=2))
    elif args.command == "down":
        down()
    else:
        state = _state()
        print(json.dumps({k: {**v, "alive": process_alive(v.get("pid"))} for k, v in state.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
