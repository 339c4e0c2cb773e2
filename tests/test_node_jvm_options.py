"""The OpenSearch nodes' JVM options have one definition (deploy/opensearch-image/jvm.options.d/):
the compose image copies it, the dev, test and benchmark nodes read it, and the node the tests run
against really runs with it (its JIT compiler threads at nice 19, read from /proc)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from opensearchpy import OpenSearch

from deploy import devstack

DOCKERFILE = devstack.REPO / "deploy" / "opensearch-image" / "Dockerfile"


def test_the_options_files_are_read_like_a_jvm_options_d(tmp_path: Path) -> None:
    (tmp_path / "b.options").write_text("# why\n\n  -XX:B=2  \n", encoding="utf-8")
    (tmp_path / "a.options").write_text("-XX:A=1\n   # indented comment\n-XX:C=3\n", encoding="utf-8")
    (tmp_path / "ignored.txt").write_text("-XX:Nope\n", encoding="utf-8")
    assert devstack.node_jvm_options(tmp_path) == ["-XX:A=1", "-XX:C=3", "-XX:B=2"]


def test_young_survivors_are_promoted_after_one_collection_on_every_node_of_ours() -> None:
    options = devstack.node_jvm_options()
    assert "-XX:MaxTenuringThreshold=1" in options
    # the dev, test and benchmark nodes (devstack and deploy/cluster.py start with JVM_FLAGS)
    assert all(option in devstack.JVM_FLAGS for option in options)


def test_the_compose_image_copies_the_options_into_the_nodes_jvm_options_d() -> None:
    copies = [line.split() for line in DOCKERFILE.read_text(encoding="utf-8").splitlines() if line.startswith("COPY ")]
    assert ["COPY", "jvm.options.d/", "/usr/share/opensearch/config/jvm.options.d/"] in copies


@pytest.fixture
def own_nodes(os_client: OpenSearch) -> list[dict[str, Any]]:
    """The nodes under test as ``_nodes/jvm,process`` describes them, when this suite started them."""
    if os.environ.get("TENURE_TEST_OPENSEARCH_URL"):
        pytest.skip("an external node was given: its JVM options are its operator's")
    return list(os_client.nodes.info(metric="jvm,process")["nodes"].values())


def test_the_node_under_test_runs_with_them(own_nodes: list[dict[str, Any]]) -> None:
    for node in own_nodes:
        arguments = node["jvm"]["input_arguments"]
        assert all(option in arguments for option in devstack.node_jvm_options()), arguments


def _threads_by_name_and_nice(pid: int) -> list[tuple[str, int]]:
    """Each live thread of a process: its name and its nice value (field 19 of its ``stat``,
    counted after the ``(comm)`` that may hold spaces). A thread that ends while it is read is left out."""
    threads = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text(encoding="utf-8").strip()
            fields = (task / "stat").read_text(encoding="utf-8").rpartition(")")[2].split()
        except OSError:
            continue
        threads.append((name, int(fields[16])))
    return threads


def test_the_node_under_test_compiles_at_the_lowest_cpu_priority(own_nodes: list[dict[str, Any]]) -> None:
    assert "-XX:CompilerThreadPriority=19" in devstack.node_jvm_options()
    threads = _threads_by_name_and_nice(own_nodes[0]["process"]["id"])
    compilers = {nice for name, nice in threads if "CompilerThre" in name}
    assert compilers == {19}, threads
    # and nothing of the node runs above the rest of the machine (the priorities mapped to 0)
    assert min(nice for _, nice in threads) >= 0
