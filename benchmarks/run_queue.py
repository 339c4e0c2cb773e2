"""How long each process's threads waited for a CPU, from the kernel's per-thread scheduler counters.

On a 2-core machine running the load client, the API workers, OpenSearch and Redis together, a
recall's latency under load is its CPU time plus the time each thread of its path spent runnable
but not running: woken (an answer arrived) while both cores were busy with someone else. The CPU
split (``loadtest``'s ``CpuMeter``) says how much work a recall costs; this says how much of its
latency is the wait for a core, and over how many scheduling slices it is spread.

``/proc/<pid>/task/<tid>/schedstat`` holds three counters per thread since it started: ns on a
CPU, ns waiting on a run queue, and how many times it was put on a CPU (slices). A reading sums
them over the threads alive at that moment; a thread that exits between two readings takes its
counts with it (the JVM's and the API's pools keep their threads, so the loss is small and only
ever an undercount). Linux only; a process that is gone reads as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass(frozen=True)
class SchedCounts:
    """Summed over threads: ns running, ns runnable but waiting for a CPU, slices."""

    run_ns: int = 0
    wait_ns: int = 0
    slices: int = 0

    def __add__(self, other: SchedCounts) -> SchedCounts:
        return SchedCounts(self.run_ns + other.run_ns, self.wait_ns + other.wait_ns, self.slices + other.slices)

    def __sub__(self, other: SchedCounts) -> SchedCounts:
        return SchedCounts(self.run_ns - other.run_ns, self.wait_ns - other.wait_ns, self.slices - other.slices)


def parse_schedstat(text: str) -> SchedCounts:
    """One ``schedstat`` file: ``"<run ns> <wait ns> <slices>"``."""
    run_ns, wait_ns, slices = (int(field) for field in text.split()[:3])
    return SchedCounts(run_ns, wait_ns, slices)


def process_counts(pid: int, proc: Path = PROC) -> SchedCounts:
    """The sum over the threads of ``pid`` alive now (nothing for a process that is gone)."""
    total = SchedCounts()
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return total
    for task in tasks:
        try:
            total += parse_schedstat((task / "schedstat").read_text())
        except (OSError, ValueError):
            continue  # the thread exited between the listing and the read
    return total


def reading(components: Mapping[str, Iterable[int]], proc: Path = PROC) -> dict[str, SchedCounts]:
    """Each component's counts, summed over its processes' threads."""
    out: dict[str, SchedCounts] = {}
    for name, pids in components.items():
        total = SchedCounts()
        for pid in pids:
            total += process_counts(pid, proc)
        out[name] = total
    return out


def per_call(before: Mapping[str, SchedCounts], after: Mapping[str, SchedCounts], calls: int) -> dict[str, Any]:
    """Between two readings, per call and component: ms running, ms waiting for a CPU, slices, and
    the mean wait of a slice in µs; plus ``total`` over the components."""
    calls = max(calls, 1)
    rows: dict[str, Any] = {}
    total = SchedCounts()
    for name, end in after.items():
        used = end - before.get(name, SchedCounts())
        total += used
        rows[name] = _row(used, calls)
    rows["total"] = _row(total, calls)
    return rows


def _row(used: SchedCounts, calls: int) -> dict[str, float]:
    return {
        "run_ms": round(used.run_ns / 1e6 / calls, 3),
        "wait_ms": round(used.wait_ns / 1e6 / calls, 3),
        "slices": round(used.slices / calls, 2),
        "wait_us_per_slice": round(used.wait_ns / 1e3 / used.slices, 1) if used.slices > 0 else 0.0,
    }
