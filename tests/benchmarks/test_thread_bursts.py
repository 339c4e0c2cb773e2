"""``benchmarks/thread_bursts.py``: thread groups, bursts lined up with a paced timeline, and the
sampler against the real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.fastpath_bench import BurstWatch
from benchmarks.thread_bursts import group_of, jvm_thread_names, read_samples, sampling, summarise, worst_lines


def test_a_node_thread_is_grouped_by_its_pool_and_a_numbered_thread_by_its_kind() -> None:
    assert group_of("opensearch[node-1][search][T#3]") == "search"
    assert group_of("opensearch[node-1][transport_worker][T#1]") == "transport_worker"
    assert group_of("GC Thread#1") == "GC Thread"
    assert group_of("C2 CompilerThread0") == "C2 CompilerThread0"
    assert group_of("python") == "python"


def _tick(t: float, ns_by_key: dict[str, float]) -> dict[str, object]:
    return {"t": t, "ns": {key: int(ms * 1e6) for key, ms in ns_by_key.items()}}


def test_a_burst_of_an_idle_group_is_named_in_its_second_and_a_steady_group_is_not() -> None:
    first_due = 1000.0
    ticks = []
    for k in range(30):  # three seconds of 100-ms ticks
        t = first_due + 0.05 + k / 10
        row = {"api/11/11": 40.0, "api/12/12": 20.0, "opensearch/7/70": 30.0}
        if k == 14:  # the compiler, idle otherwise, takes 60 ms in second 1
            row["opensearch/7/71"] = 60.0
        if k == 25:  # the search pool at 40 ms: more than its median, less than three times it
            row["opensearch/7/70"] = 40.0
        ticks.append(_tick(t, row))
    ticks.append(_tick(first_due - 0.5, {"opensearch/7/71": 500.0}))  # before the pass: ignored
    names = {"api/11/11": "python", "api/12/12": "python", "opensearch/7/70": "?", "opensearch/7/71": "?"}
    jvm = {"opensearch": {70: "opensearch[n][search][T#1]", 71: "C2 CompilerThread0"}}
    timeline = [[0.0, 300, 3.0, 15.0, 20.0], [1.0, 300, 3.0, 60.0, 80.0], [2.0, 300, 3.0, 18.0, 25.0]]

    summary = summarise(ticks, names, timeline, first_due, jvm_names=jvm)

    assert summary["ticks"] == 30
    assert [s["bursts"] for s in summary["seconds"]] == [[], [[1.4, "opensearch: C2 CompilerThread0", 60.0]], []]
    assert summary["ms_per_s_by_group"]["opensearch: C2 CompilerThread0"] == 20.0  # 60 ms over 3 s
    # the API's two workers: 40 and 20 ms a tick
    assert all(s["split"] == {"api": [0.67, 0.33]} for s in summary["seconds"])
    lines = worst_lines(summary, count=1)
    assert lines == ["second 1 (p99 60.0 ms): opensearch: C2 CompilerThread0 60.0 ms at 1.4 s; api split 0.67 / 0.33"]


def test_the_sampler_sees_a_busy_process_and_names_its_threads(tmp_path: Path) -> None:
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\n"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    out = tmp_path / "ticks.jsonl"
    try:
        with sampling({"busy": [busy.pid], "me": [os.getpid()]}, out, interval_s=0.05):
            busy.wait(timeout=30)
            time.sleep(0.1)
    finally:
        busy.kill()
    ticks, names = read_samples(out)
    assert len(ticks) >= 10
    busy_ms = sum(ns for tick in ticks for key, ns in tick["ns"].items() if key.startswith("busy/")) / 1e6
    assert busy_ms > 500  # it spun a whole core for most of the second
    assert f"busy/{busy.pid}/{busy.pid}" in names


def test_a_process_that_is_not_a_jvm_has_no_jvm_thread_names() -> None:
    assert jvm_thread_names(os.getpid()) == {}


def _fake_process(tmp_path: Path, exe_name: str) -> tuple[Path, Path]:
    """A /proc with process 42 running ``bin/<exe_name>``, beside a ``bin/jcmd`` that prints one
    thread of a ``Thread.print`` and leaves a mark that it ran; (proc, mark)."""
    bin_dir, mark = tmp_path / "bin", tmp_path / "jcmd-ran"
    bin_dir.mkdir()
    (bin_dir / exe_name).write_text("")
    jcmd = bin_dir / "jcmd"
    jcmd.write_text(f"#!/bin/sh\ntouch {mark}\necho '\"C2 CompilerThread0\" #14 daemon prio=9 nid=0x2a runnable'\n")
    jcmd.chmod(0o755)
    (tmp_path / "proc" / "42").mkdir(parents=True)
    (tmp_path / "proc" / "42" / "exe").symlink_to(bin_dir / exe_name)
    return tmp_path / "proc", mark


def test_a_java_launcher_is_asked_with_the_jcmd_beside_it(tmp_path: Path) -> None:
    proc, mark = _fake_process(tmp_path, "java")
    assert jvm_thread_names(42, proc) == {0x2A: "C2 CompilerThread0"}
    assert mark.exists()


def test_a_process_that_embeds_a_jvm_is_never_attached_to(tmp_path: Path) -> None:
    """Debian's /usr/bin holds python3.11 beside jcmd: attaching to a Python process that runs an
    analysis JVM in process crashed it (the test process itself, under the clean-clone CI)."""
    proc, mark = _fake_process(tmp_path, "python3.11")
    assert jvm_thread_names(42, proc) == {}
    assert not mark.exists()


def test_fastpath_bench_lines_the_samples_up_with_its_paced_pass(tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "ticks.jsonl"  # its folder made on the way in
    with BurstWatch(out, {"client": [os.getpid()]}, node_pids=[]) as watch:
        first_due = datetime.now(UTC)
        end = time.monotonic() + 1.2
        while time.monotonic() < end:
            pass
    paced = {"first_due_utc": first_due.isoformat(), "timeline": [[0.0, 300, 3.0, 12.0, 15.0]]}
    watch.summarise_into(paced)
    summary = paced["thread_bursts"]
    assert isinstance(summary, dict) and summary["ticks"] >= 5
    # this process spun one core for the whole second the timeline covers
    assert max(ms for group, ms in summary["ms_per_s_by_group"].items() if group.startswith("client: ")) > 300

    out.unlink()  # a sampler that left nothing: the pass's figures stand, the reason is kept
    watch.summarise_into(paced)
    assert "no samples" in paced["thread_bursts"]["error"]
    off: dict[str, object] = {"first_due_utc": first_due.isoformat(), "timeline": []}
    BurstWatch(None, {}, node_pids=[]).summarise_into(off)
    assert "thread_bursts" not in off
