"""How long each process's threads waited for a CPU, from the kernel's per-thread scheduler counters.

On a 2-core machine running the load client, the API workers, OpenSearch and Redis together, a
recall's latency under load is its CPU time plus the time each thread of its path spent runnable
but not running: woken (an answer arrived) while both cores were busy with someone else. The CPU
split (``loadtest``'s ``CpuMeter``) says how much work a recall costs; this says how much of its
latency is the wait for a core, and over how many scheduling slices it is spread.

``/proc/<pid>/task/<tid>/schedstat`` holds three counters per thread since it started: ns on a
CPU, ns waiting on a run queue, and how many times it was put on a CPU (slices). A reading keeps
them per thread, and two readings are compared thread by thread: a thread alive in both counts
its difference, a thread born in between counts everything it did (all of it in between), and a
thread that exited in between takes what it did in between with it (an undercount: the JVM's
pools keep their threads, the API's worker threads exit when idle). Subtracting per-component
sums instead would also remove an exited thread's whole history from the difference, which made
the slices swing 1-8 per recall between otherwise alike runs. Linux only; a process that is gone reads as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class SchedCounts:
    """One thread's counters, or a sum of them: ns running, ns runnable but waiting for a CPU, slices."""

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


# One reading of one component: the counters of each of its threads, by (pid, tid).
Threads = dict[tuple[int, int], SchedCounts]


def process_threads(pid: int, proc: Path = PROC) -> Threads:
    """The counters of each thread of ``pid`` alive now (nothing for a process that is gone)."""
    out: Threads = {}
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out[(pid, int(task.name))] = parse_schedstat((task / "schedstat").read_text())
        except (OSError, ValueError):
            continue  # the thread exited between the listing and the read
    return out


def reading(components: Mapping[str, Iterable[int]], proc: Path = PROC) -> dict[str, Threads]:
    """Each component's threads and their counters."""
    out: dict[str, Threads] = {}
    for name, pids in components.items():
        threads: Threads = {}
        for pid in pids:
            threads.update(process_threads(pid, proc))
        out[name] = threads
    return out


def between(before: Threads, after: Threads) -> SchedCounts:
    """What a component's threads did between two readings, thread by thread (module docstring)."""
    total = SchedCounts()
    for thread, end in after.items():
        start = before.get(thread, SchedCounts())
        if end.run_ns < start.run_ns or end.slices < start.slices:
            start = SchedCounts()  # counters never go down: the id was reused by a thread born in between
        total += end - start
    return total


def per_call(before: Mapping[str, Threads], after: Mapping[str, Threads], calls: int) -> dict[str, dict[str, float]]:
    """Between two readings, per call and component: ms running, ms waiting for a CPU, slices, and
    the mean wait of a slice in µs; plus ``total`` over the components."""
    calls = max(calls, 1)
    rows: dict[str, dict[str, float]] = {}
    total = SchedCounts()
    for name, end in after.items():
        used = between(before.get(name, {}), end)
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
