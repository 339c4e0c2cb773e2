"""A real N-node OpenSearch cluster on one machine: the Maven-built node of ``deploy/opensearch/``
in separate JVMs, HTTP and transport on loopback.

Every node is cluster-manager-eligible and holds data (OpenSearch's default roles); they find each
other through ``discovery.seed_hosts`` (every node's transport port) and bootstrap the first
election from ``cluster.initial_cluster_manager_nodes``. With three nodes any one may be lost: the
other two still form a quorum of the voting configuration, and every shard whose index has a
replica (the beliefs index: ``auto_expand_replicas: 0-1``, so 1 replica as soon as a second node
exists) still has a copy.

    python -m deploy.cluster up --nodes 3 --heap 512m   # state in .cluster/, prints the URLs
    python -m deploy.cluster status | down

``TENURE_OPENSEARCH_URL`` takes all the nodes' URLs, comma-separated (``Cluster.url``): the
client spreads requests over them and retries a request on another node when one is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.devstack import JAVA, JVM_FLAGS, OS_DIR, REPO, build_opensearch, free_port, stop_pid

STATE_DIR = REPO / ".cluster"


@dataclass
class ClusterNode:
    name: str
    home: Path
    http_port: int
    transport_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


@dataclass
class Cluster:
    root: Path
    size: int = 3
    heap: str = "512m"
    name: str = "tenure-cluster"
    nodes: list[ClusterNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [
                ClusterNode(f"node-{i}", self.root / f"node-{i}", free_port(), free_port())
                for i in range(1, self.size + 1)
            ]

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """Every node, comma-separated: what TENURE_OPENSEARCH_URL takes for a cluster."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    def live_url(self) -> str:
        return next(n.url for n in self.nodes if n.alive())

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 300.0) -> Cluster:
        build_opensearch()
        if self.root.exists():
            shutil.rmtree(self.root)
        for node in self.nodes:
            self._configure(node)
        try:
            for node in self.nodes:
                self._launch(node, fresh=True)
            self.wait_for(status="green", nodes=self.size, timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _configure(self, node: ClusterNode) -> None:
        seeds = ", ".join(f'"127.0.0.1:{n.transport_port}"' for n in self.nodes)
        managers = ", ".join(n.name for n in self.nodes)
        (node.home / "config").mkdir(parents=True)
        (node.home / "tmp").mkdir()
        (node.home / "config" / "opensearch.yml").write_text(
            "\n".join(
                [
                    f"cluster.name: {self.name}",
                    f"node.name: {node.name}",
                    "network.host: 127.0.0.1",
                    f"http.port: {node.http_port}",
                    f"transport.port: {node.transport_port}",
                    f"discovery.seed_hosts: [{seeds}]",
                    f"cluster.initial_cluster_manager_nodes: [{managers}]",
                    "cluster.routing.allocation.disk.threshold_enabled: false",
                    "action.auto_create_index: false",
                    "cluster.max_shards_per_node: 5000",
                    "",
                ]
            )
        )
        shutil.copy(OS_DIR / "log4j2.properties", node.home / "config" / "log4j2.properties")

    def _launch(self, node: ClusterNode, *, fresh: bool) -> None:
        log = open(node.home / "server.log", "wb" if fresh else "ab")  # noqa: SIM115 - handed to the child
        cmd = [
            JAVA, f"-Xms{self.heap}", f"-Xmx{self.heap}", f"-Djava.io.tmpdir={node.home / 'tmp'}", *JVM_FLAGS,
            "-cp", f"{OS_DIR / 'classes'}:{OS_DIR / 'lib'}/*", "DevOpenSearch", str(node.home),
        ]  # fmt: skip
        node.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal one node's JVM and reap it (SIGKILL: no shutdown, like a lost machine)."""
        node = self.node(name)
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, sig)
            node.process.wait(timeout=60)

    def start_node(self, name: str, timeout_s: float = 600.0) -> None:
        """Start a node again on its ports and data directory; returns once it has joined."""
        node = self.node(name)
        self._launch(node, fresh=False)
        deadline = time.monotonic() + timeout_s
        while name not in self.node_names():
            if not node.alive():
                raise RuntimeError(f"{name} exited; see {node.home / 'server.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not rejoin within {timeout_s:.0f}s")
            time.sleep(0.5)

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                stop_pid(node.process.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.process.wait(timeout=30)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state

    def _ask(self, path: str, timeout: float = 5.0) -> Any:
        """Ask the live nodes in turn; the first answer wins."""
        last: Exception | None = None
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                return _get_json(f"{node.url}{path}", timeout)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = exc
        raise RuntimeError(f"no node answered {path}: {last}")

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        return dict(self._ask("/_cluster/health", timeout))

    def node_names(self) -> list[str]:
        try:
            return sorted(str(n["name"]) for n in self._ask("/_cat/nodes?format=json&h=name"))
        except RuntimeError:
            return []

    def cluster_manager(self) -> str:
        """The elected cluster manager's node name."""
        return str(self._ask("/_cat/cluster_manager?format=json")[0]["node"])

    def wait_until_removed(self, name: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
        """After ``name`` was lost: the elected cluster manager and the cluster's health once the
        survivors have removed it from the cluster state.

        Right after a SIGKILL the survivors still list the dead node (and, if it was the cluster
        manager, still name it as such) until their fault detection notices (a few seconds); a
        status read then says green with every node present, which is not the state of a cluster
        that lost one. So: a manager that is not ``name``, ``name`` absent from its node list, and
        the health read after that."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError, KeyError, IndexError):
                manager = self.cluster_manager()
                names = {str(n["name"]) for n in self._ask("/_cat/nodes?format=json&h=name")}
                if manager != name and name not in names:
                    return manager, self.health()
            time.sleep(0.1)
        raise RuntimeError(f"{name} still in the cluster (or no cluster manager) after {timeout_s:.0f}s")

    def wait_for(self, *, status: str, nodes: int, timeout_s: float) -> float:
        """Seconds until the cluster reports ``status`` (or better) with ``nodes`` nodes."""
        order = {"red": 0, "yellow": 1, "green": 2}
        started = time.monotonic()
        while True:
            with contextlib.suppress(RuntimeError):
                health = self.health()
                if order[health["status"]] >= order[status] and int(health["number_of_nodes"]) >= nodes:
                    return round(time.monotonic() - started, 2)
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"cluster not {status} with {nodes} nodes within {timeout_s:.0f}s")
            time.sleep(0.25)


# ------------------------------------------------------------------------------------------ CLI


def _save(cluster: Cluster) -> None:
    STATE_DIR.mkdir(exist_ok=True)
    state = {
        "url": cluster.url,
        "nodes": [{"name": n.name, "pid": n.process.pid if n.process else None, "url": n.url} for n in cluster.nodes],
    }
    (STATE_DIR / "state.json").write_text(json.dumps(state, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--heap", default="512m")
    args = parser.parse_args(argv)
    state_file = STATE_DIR / "state.json"
    if args.command == "up":
        cluster = Cluster(STATE_DIR / "data", size=args.nodes, heap=args.heap).start()
        _save(cluster)
        print(json.dumps({"url": cluster.url, "health": cluster.health()["status"]}, indent=2))
    elif args.command == "down":
        if state_file.exists():
            for node in json.loads(state_file.read_text())["nodes"]:
                if node["pid"]:
                    stop_pid(int(node["pid"]))
            state_file.unlink()
    elif state_file.exists():
        print(state_file.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
