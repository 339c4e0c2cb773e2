"""``bench_stack``: the node and Redis the HTTP benchmarks run against, kept up between runs.

Its point is the kept corpus: a node brought down and up again on the same state dir must answer
with the data it had (1M beliefs take ~10 minutes to build), Redis must start empty, and ``up``
on a running stack must hand back the same processes rather than start a second pair."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from opensearchpy import OpenSearch

from benchmarks.bench_stack import down, read_env, up
from deploy.devstack import process_alive

HEAP = "512m"


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "stack"
    down(tmp_path / "stack")


@pytest.mark.timeout(300)
def test_the_node_keeps_its_data_and_redis_starts_empty(state_dir: Path) -> None:
    env = up(state_dir, heap=HEAP, gc_log=state_dir.parent / "gc.log", keep_redis=False)
    assert read_env(state_dir) == env
    assert set(env) == {"OS", "REDIS", "OS_PID", "REDIS_PID"}
    node = OpenSearch(env["OS"])
    node.indices.create("kept-corpus", body={"settings": {"number_of_shards": 1}})
    node.index("kept-corpus", {"belief": "kept"}, id="1", refresh=True)
    redis.Redis.from_url(env["REDIS"]).set("counter", 7)

    assert up(state_dir, heap=HEAP, gc_log=None, keep_redis=False) == env  # running: the same pair
    assert (state_dir.parent / "gc.log").stat().st_size > 0

    down(state_dir)
    assert not process_alive(env["OS_PID"])
    assert not process_alive(env["REDIS_PID"])
    assert read_env(state_dir) == {}

    again = up(state_dir, heap=HEAP, gc_log=None, keep_redis=False)
    assert again["OS_PID"] != env["OS_PID"]
    assert OpenSearch(again["OS"]).get("kept-corpus", "1")["_source"] == {"belief": "kept"}
    assert redis.Redis.from_url(again["REDIS"]).get("counter") is None


def test_down_never_stops_a_process_it_did_not_start(tmp_path: Path) -> None:
    """After a reboot the pids in ``stack.env`` may name other processes: ``down`` leaves them be."""
    stranger = subprocess.Popen(["sleep", "60"], cwd=tmp_path)  # noqa: S607 - coreutils
    try:
        state_dir = tmp_path / "stack"
        state_dir.mkdir()
        (state_dir / "stack.env").write_text(
            f"OS=http://127.0.0.1:9\nREDIS=redis://127.0.0.1:9/0\nOS_PID={stranger.pid}\nREDIS_PID={stranger.pid}\n"
        )
        down(state_dir)
        assert stranger.poll() is None
        assert read_env(state_dir) == {}
    finally:
        stranger.kill()
        stranger.wait()
