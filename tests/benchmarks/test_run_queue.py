"""``benchmarks/run_queue.py``: the per-thread scheduler counters summed per component (a /proc-shaped
tree for the arithmetic, the real /proc for what the kernel gives)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.run_queue import SchedCounts, between, parse_schedstat, per_call, process_threads, reading


def _task(proc: Path, pid: int, tid: int, text: str) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "schedstat").write_text(text)


def test_a_reading_keeps_every_thread_of_every_process_of_a_component(tmp_path: Path) -> None:
    _task(tmp_path, 10, 10, "1000000 500000 4\n")
    _task(tmp_path, 10, 11, "3000000 1500000 6\n")
    _task(tmp_path, 20, 20, "2000000 0 1\n")
    _task(tmp_path, 30, 30, "7 7 7\n")
    got = reading({"api": [10, 20], "gone": [99]}, tmp_path)
    assert got == {
        "api": {
            (10, 10): SchedCounts(1_000_000, 500_000, 4),
            (10, 11): SchedCounts(3_000_000, 1_500_000, 6),
            (20, 20): SchedCounts(2_000_000, 0, 1),
        },
        "gone": {},
    }


def test_a_thread_that_exited_or_reads_garbled_is_skipped(tmp_path: Path) -> None:
    _task(tmp_path, 10, 10, "1000 2000 3\n")
    (tmp_path / "10" / "task" / "11").mkdir()  # listed, then gone before its file was read
    _task(tmp_path, 10, 12, "not numbers\n")
    assert process_threads(10, tmp_path) == {(10, 10): SchedCounts(1000, 2000, 3)}


def test_per_call_compares_thread_by_thread_and_totals_the_components() -> None:
    before = {
        "api": {(1, 1): SchedCounts(1_000_000, 1_000_000, 10), (1, 2): SchedCounts(9_000_000, 9_000_000, 90)},
        "node": {},
    }
    after = {
        # thread 2 exited in between: its history must not be subtracted from thread 1's work;
        # thread 3 was born in between: all of it counts
        "api": {(1, 1): SchedCounts(4_000_000, 2_000_000, 20), (1, 3): SchedCounts(1_000_000, 1_000_000, 10)},
        "node": {(2, 2): SchedCounts(2_000_000, 4_000_000, 20)},
        "new": {(3, 3): SchedCounts(1, 1, 1)},
    }
    rows = per_call(before, after, 2)
    assert rows["api"] == {"run_ms": 2.0, "wait_ms": 1.0, "slices": 10.0, "wait_us_per_slice": 100.0}
    assert rows["node"] == {"run_ms": 1.0, "wait_ms": 2.0, "slices": 10.0, "wait_us_per_slice": 200.0}
    assert rows["total"]["slices"] == 20.5 and rows["total"]["wait_ms"] == 3.0
    assert per_call({}, {"idle": {}}, 0)["idle"]["wait_us_per_slice"] == 0.0


def test_a_thread_id_reused_in_between_counts_as_a_new_thread() -> None:
    before = {"api": {(1, 7): SchedCounts(50_000_000, 50_000_000, 500)}}
    after = {"api": {(1, 7): SchedCounts(1_000_000, 1_000_000, 5)}}  # lower: not the same thread
    assert between(before["api"], after["api"]) == SchedCounts(1_000_000, 1_000_000, 5)


def test_parse_reads_the_three_counters() -> None:
    assert parse_schedstat("12 34 56\n") == SchedCounts(12, 34, 56)
    with pytest.raises(ValueError, match="not enough values"):
        parse_schedstat("12 34")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_the_kernel_counts_a_busy_process_running_and_a_sleeping_one_not() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    try:
        time.sleep(0.1)
        start = reading({"busy": [busy.pid], "idle": [idle.pid], "self": [os.getpid()]})
        time.sleep(0.3)
        end = reading({"busy": [busy.pid], "idle": [idle.pid], "self": [os.getpid()]})
    finally:
        busy.wait(5)
        idle.wait(5)
    used = {name: between(start[name], end[name]) for name in end}
    assert used["busy"].run_ns > 100_000_000  # at least a third of the 0.3 s on a CPU
    assert used["idle"].run_ns < 20_000_000 and used["idle"].slices <= 2
    assert used["self"].slices >= 1  # this thread slept and was woken


def test_fastpath_bench_prints_the_largest_waits_first_and_leaves_out_idle_components() -> None:
    from benchmarks.fastpath_bench import run_queue_line

    rows = per_call(
        {},
        {
            "api": {(1, 1): SchedCounts(0, 2_000_000, 8)},
            "opensearch": {(2, 2): SchedCounts(0, 4_000_000, 20)},
            "idle": {(3, 3): SchedCounts(0, 0, 0)},
        },
        2,
    )
    assert run_queue_line(rows) == (
        "paced, waiting for a CPU per recall: 3.0 ms over 14.0 slices "
        "(opensearch 2.0 ms over 10.0 slices, api 1.0 ms over 4.0 slices)"
    )
