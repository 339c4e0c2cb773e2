"""benchmarks/node_settings_ab.py against the suite's real node: the settings are applied in the B
blocks only and reset to the node's defaults afterwards, also when a request fails."""

from __future__ import annotations

import argparse
import os

import pytest
from opensearchpy import OpenSearch

from benchmarks.node_settings_ab import measure, replayable, setting
from benchmarks.recall_floor import Sent
from benchmarks.relevant_query_cost import Node

NAME = "search.request_stats_enabled"


class _Watching(Node):
    """A Node that notes the setting's transient value at each request."""

    def __init__(self, url: str, client: OpenSearch, fail_after: int | None = None):
        super().__init__(url, os.getpid())  # this process's CPU stands in for the node's
        self.client, self.fail_after = client, fail_after
        self.seen: list[object] = []

    def send(self, method: str, path: str, body: bytes | None, content_type: str) -> tuple[float, object]:
        if path == "/_cluster/settings":  # the benchmark's own puts
            return super().send(method, path, body, content_type)
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise RuntimeError("the node answered 500")
        self.seen.append(self.client.cluster.get_settings()["transient"].get("search", {}).get("request_stats_enabled"))
        return super().send(method, path, body, content_type)


def _transient(client: OpenSearch) -> object:
    return client.cluster.get_settings(flat_settings=True)["transient"].get(NAME)


def test_b_blocks_run_with_the_setting_and_the_defaults_come_back(opensearch_url: str, os_client: OpenSearch) -> None:
    node = _Watching(opensearch_url, os_client)
    figures = measure(node, [("GET", "/", None, "")], {NAME: "false"}, rounds=2)
    # two warm-up passes, then per round one A and one B request; B alone sees the setting
    assert node.seen == [None, None, None, "false", "false", None]  # round 2 runs B first
    assert _transient(os_client) is None
    assert len(figures["A"]["node_cpu_ms_by_round"]) == 2 == len(figures["B"]["node_cpu_ms_by_round"])
    assert 0 <= figures["b_cheaper_rounds"] <= 2 and figures["requests"] == 1


def test_a_failed_block_still_resets_the_setting(opensearch_url: str, os_client: OpenSearch) -> None:
    node = _Watching(opensearch_url, os_client, fail_after=3)  # fails inside the first round's B block
    with pytest.raises(RuntimeError):
        measure(node, [("GET", "/", None, "")], {NAME: "false"}, rounds=2)
    assert _transient(os_client) is None


def test_settings_and_requests_are_read_as_given() -> None:
    assert setting(" a.b = false ") == ("a.b", "false")
    for bad in ("a.b", "=x", "a.b="):
        with pytest.raises(argparse.ArgumentTypeError):
            setting(bad)
    sent = [Sent("POST", "/_msearch", b"{}\n{}\n"), Sent("POST", "/i/_search", b"{}"), Sent("GET", "/", None)]
    assert replayable(sent) == [
        ("POST", "/_msearch", b"{}\n{}\n", "application/x-ndjson"),
        ("POST", "/i/_search", b"{}", "application/json"),
        ("GET", "/", None, ""),
    ]
