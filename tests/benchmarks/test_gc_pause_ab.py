"""benchmarks/gc_pause_ab.py and its process monitor: a process started with the monitor on its
path records its collections, stalls and heap; the figures are read back per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.fastpath_bench import Variant
from benchmarks.gc_pause_ab import MONITOR, ask_frozen_counts, frozen_after, monitored, timeline, worker_figures

# A process that keeps ~2M tracked objects and collects them all: one long generation-2
# collection, during which the monitor's own thread cannot run (a stall), then a second for the flush.
LONG_COLLECTION = """
import gc, time
kept = [[i] for i in range(2_000_000)]
gc.collect()
time.sleep(1.5)
"""


def test_a_monitored_process_records_its_long_collection_and_the_stall(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(MONITOR), "TENURE_BENCH_MONITOR_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", LONG_COLLECTION], env=env, check=True, timeout=120)
    [out] = tmp_path.glob("*.jsonl")
    events = [json.loads(line) for line in out.read_text().splitlines()]
    collections = [e for e in events if e[0] == "gc" and e[2] == 2]
    assert collections and max(e[3] for e in collections) > 20  # walking 2M objects takes tens of ms
    assert any(e[0] == "lag" and e[2] > 10 for e in events)
    assert any(e[0] == "heap" and e[2] > 0 for e in events)
    assert not any(e[0] == "frozen" for e in events)  # only when asked: the count walks every frozen object


# Freezes what it keeps, says it is ready, then waits to be asked.
FROZEN_ON_ASK = """
import gc, sys, time
kept = [[i] for i in range(50_000)]
gc.freeze()
print("ready", flush=True)
time.sleep(4)
"""


def test_a_monitored_process_reports_its_frozen_objects_when_asked(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(MONITOR), "TENURE_BENCH_MONITOR_DIR": str(tmp_path)}
    with subprocess.Popen([sys.executable, "-c", FROZEN_ON_ASK], env=env, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the monitor names its file at its first flush, within a second
        asked = time.time()
        ask_frozen_counts(tmp_path)
        assert child.wait(timeout=60) == 0
    [out] = tmp_path.glob("*.jsonl")
    frozen = frozen_after(out, asked)
    assert frozen is not None and frozen >= 50_000
    assert frozen_after(out, time.time()) is None  # nothing reported after the process ended


def test_an_unmonitored_process_writes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(MONITOR)}
    env.pop("TENURE_BENCH_MONITOR_DIR", None)
    subprocess.run([sys.executable, "-c", "import gc; gc.collect()"], env=env, check=True, timeout=60)
    assert list(tmp_path.iterdir()) == []


def test_the_figures_of_one_process() -> None:
    events = [
        ["gc", 10.0, 0, 1.5, 1.4, 0],  # short: not counted as a collection over 2 ms, but its CPU is
        ["gc", 11.0, 2, 150.0, 140.0, 30],
        ["gc", 12.0, 0, 5.0, 4.0, 2],
        ["lag", 11.0, 149.0],
        ["lag", 13.0, 12.0],
        ["heap", 14.0, 204800],
    ]
    figures = worker_figures(events, 5000)
    assert figures["collections_over_2ms"] == 2
    assert figures["longest_collection_cpu_ms"] == 140.0
    assert figures["longest_collection_wall_ms"] == 150.0
    assert figures["collections_cpu_ms"] == 145.4
    assert (figures["stalls_over_30ms"], figures["longest_stall_ms"]) == (1, 149.0)
    assert (figures["frozen_objects"], figures["rss_mb"]) == (5000, 200.0)


def test_only_the_measured_window_is_read(tmp_path: Path) -> None:
    path = tmp_path / "1.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in [["lag", 5.0, 40.0], ["lag", 15.0, 50.0], ["lag", 25.0, 60.0]]))
    assert timeline(path, 10.0, 20.0) == [["lag", 15.0, 50.0]]


def test_the_monitor_goes_first_on_the_variant_s_path_and_keeps_its_variables(tmp_path: Path) -> None:
    variant = monitored(Variant.parse("lazy=.:TENURE_GC_COLLECT_INTERVAL_S=0"), tmp_path)
    assert variant.env["PYTHONPATH"] == f"{MONITOR}:{variant.source}"
    assert variant.env["TENURE_BENCH_MONITOR_DIR"] == str(tmp_path)
    assert variant.env["TENURE_GC_COLLECT_INTERVAL_S"] == "0"
