"""benchmarks/node_jvm_ab.py: what each --node runs, and bad --node values refused before any node starts."""

from __future__ import annotations

import argparse
import sys

import pytest

from benchmarks.node_jvm_ab import NodeConfig, parse_args
from deploy import devstack


def test_a_gc_selector_replaces_the_dev_nodes_g1_and_keeps_every_other_flag() -> None:
    config = NodeConfig.parse(f"par={sys.executable}:-XX:+UseParallelGC,-XX:+AlwaysPreTouch")
    flags = config.jvm_flags()
    assert "-XX:+UseG1GC" not in flags
    assert flags[-2:] == ["-XX:+UseParallelGC", "-XX:+AlwaysPreTouch"]
    assert [f for f in devstack.JVM_FLAGS if f != "-XX:+UseG1GC"] == flags[:-2]
    assert config.java == sys.executable


def test_without_a_gc_selector_the_node_keeps_the_dev_flags() -> None:
    config = NodeConfig.parse(f"plain={sys.executable}")
    assert config.jvm_flags() == list(devstack.JVM_FLAGS)
    assert config.extra_flags == ()


@pytest.mark.parametrize("text", ["no-equals", "=/usr/bin/java", "name=", "name=/no/such/java"])
def test_a_malformed_node_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        NodeConfig.parse(text)


def test_two_nodes_of_one_name_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--node", f"a={sys.executable}", "--node", f"a={sys.executable}:-XX:+UseParallelGC"])
    assert "must differ" in capsys.readouterr().err
