"""What ran in each tenth of a second of a paced pass, by thread group: the bursts behind its worst seconds.

A paced pass's p99 is set by a few bad seconds. On two cores at ~70 % busy, a thread outside the
request path that takes a core for a few tens of milliseconds (the node's JIT compiler, a refresh
or a merge of the audit index, the receipt drain's bulk) leaves one core for every recall in
flight, and the answers of that moment queue. ``run_queue`` says how long a recall waited for a
CPU on average; this says who held the CPU when the waits were long.

A sampler process (``python -m benchmarks.thread_bursts``, started and stopped around the pass by
``fastpath_bench --paced-thread-bursts``) reads every thread's time on a CPU
(``/proc/<pid>/task/<tid>/schedstat``) of the given components every ``--interval-s`` (0.1 s) and
writes the difference per thread as one JSON line per tick; when stopped (SIGTERM) it writes the
threads' names (``comm``). The JVM's names are truncated there ("opensearch[node"), so the bench
reads the node's own names with ``jcmd <pid> Thread.print`` before and after the pass (a thread
born and gone in between, a merge thread say, keeps its truncated name).

:func:`summarise` groups the threads (the node's pools by name, ``search``, ``write``,
``refresh``, ``C2 CompilerThread``…; a Python process's threads by ``comm``), lines the ticks up
with the pass's per-second timeline, and names for each second the *bursts*: ticks in which a
group used at least ``min_ms`` of CPU and at least three times its median tick. A group on the
request path (the API's event loop, the node's search pool) runs every tick, so only a real
excess shows; a group that is idle most ticks (the compiler, a refresh) shows whenever it runs.

The sampler costs ~2-3 % of one core (reading ~400 small files ten times a second); it is off
unless asked for. Linux only. This is a benchmark tool, not a test (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from benchmarks import run_queue

PROC = Path("/proc")
MIN_BURST_MS = 15.0
BURST_OVER_MEDIAN = 3.0
WORST_SECONDS = 5

# a JVM thread's line in ``jcmd Thread.print``: its name in quotes, its native id as nid=0x…
_JCMD_THREAD = re.compile(r'^"(?P<name>[^"]*)".*\bnid=(?P<nid>0x[0-9a-fA-F]+)')


def group_of(name: str) -> str:
    """A thread's group: its name without the node's name, pool counters and thread numbers
    (``opensearch[node-1][search][T#3]`` -> ``search``, ``GC Thread#1`` -> ``GC Thread``)."""
    group = re.sub(r"^opensearch\[[^\]]*\]", "", name)
    group = re.sub(r"\[T#\d+\]", "", group)
    group = re.sub(r"#\d+", "", group)
    group = re.sub(r"^\[(.*)\]$", r"\1", group.strip())
    return group.strip() or name


def jvm_thread_names(pid: int, proc: Path = PROC) -> dict[int, str]:
    """The JVM ``pid``'s thread names by native thread id, from its own JDK's ``jcmd`` (empty when
    the process is not a JVM or ``jcmd`` fails). Only a ``java`` launcher is asked: ``jcmd`` beside
    another executable (Debian's ``/usr/bin`` holds both ``python3.11`` and ``jcmd``) would attach to
    a process that embeds a JVM (an API process with its analysis JVM), which crashed it."""
    try:
        exe = Path(os.readlink(proc / str(pid) / "exe"))
        if exe.name != "java":
            return {}
        jcmd = exe.with_name("jcmd")
        dump = subprocess.run(
            [str(jcmd), str(pid), "Thread.print"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names: dict[int, str] = {}
    for line in dump.splitlines():
        found = _JCMD_THREAD.match(line)
        if found:
            names[int(found["nid"], 16)] = found["name"]
    return names


def _comm(proc: Path, pid: int, tid: int) -> str:
    try:
        return (proc / str(pid) / "task" / str(tid) / "comm").read_text().strip()
    except OSError:
        return "?"


class Sampler:
    """Every tick, each thread's CPU since the previous tick, per component (module docstring)."""

    def __init__(self, components: Mapping[str, Iterable[int]], out: TextIO, proc: Path = PROC):
        self.components = {name: list(pids) for name, pids in components.items()}
        self.out = out
        self.proc = proc
        self.names: dict[str, str] = {}  # "component/pid/tid" -> comm
        self._last: dict[str, int] = {}

    def tick(self) -> None:
        now = time.time()
        current: dict[str, int] = {}
        for component, pids in self.components.items():
            for pid in pids:
                for (_, tid), counts in run_queue.process_threads(pid, self.proc).items():
                    key = f"{component}/{pid}/{tid}"
                    current[key] = counts.run_ns
                    if key not in self.names:
                        self.names[key] = _comm(self.proc, pid, tid)
        if self._last:
            ran = {key: ns - self._last.get(key, ns) for key, ns in current.items()}
            self.out.write(json.dumps({"t": round(now, 4), "ns": {k: v for k, v in ran.items() if v > 0}}) + "\n")
        self._last = current

    def finish(self) -> None:
        self.out.write(json.dumps({"names": self.names}) + "\n")
        self.out.flush()


def sample(components: Mapping[str, Iterable[int]], out: TextIO, interval_s: float, proc: Path = PROC) -> None:
    """Tick until SIGTERM (or SIGINT), then write the names."""
    sampler = Sampler(components, out, proc)
    stop = False

    def stopping(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    next_at = time.monotonic()
    while not stop:
        sampler.tick()
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.monotonic()))
    sampler.finish()


@contextmanager
def sampling(components: Mapping[str, Iterable[int]], out: Path, interval_s: float = 0.1) -> Iterator[None]:
    """Run the sampler in its own process while the block runs (its own process, so its reads
    never hold the load client's GIL)."""
    args = [sys.executable, "-m", "benchmarks.thread_bursts", "--out", str(out), "--interval-s", str(interval_s)]
    for name, pids in components.items():
        if pids:
            args += ["--component", f"{name}={','.join(str(p) for p in pids)}"]
    sampler = subprocess.Popen(args, cwd=Path(__file__).resolve().parent.parent)
    try:
        time.sleep(2 * interval_s)  # its first reading is a base, not a tick
        yield
    finally:
        sampler.send_signal(signal.SIGTERM)
        sampler.wait(timeout=30)


def read_samples(path: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The ticks and the thread names a sampler wrote."""
    ticks: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "names" in row:
            names = row["names"]
        else:
            ticks.append(row)
    return ticks, names


def _label(key: str, names: Mapping[str, str], jvm_names: Mapping[str, Mapping[int, str]]) -> str:
    component, _, tid = key.split("/")
    name = jvm_names.get(component, {}).get(int(tid)) or names.get(key, "?")
    return f"{component}: {group_of(name)}"


def _processes(ticks: list[dict[str, Any]], least_share: float = 0.05) -> dict[str, list[str]]:
    """Each component's processes (pids as the sampler wrote them) that did at least
    ``least_share`` of its work over ``ticks`` (not uvicorn's supervisor, say), by pid."""
    used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for tick in ticks:
        for key, ns in tick["ns"].items():
            component, pid, _ = key.split("/")
            used[component][pid] += ns
    return {
        component: sorted((pid for pid, ns in by_pid.items() if ns >= least_share * sum(by_pid.values())), key=int)
        for component, by_pid in used.items()
    }


def _split(ticks: list[dict[str, Any]], component: str, pids: list[str]) -> list[float]:
    """Each process's share of ``component``'s CPU over ``ticks``."""
    used = dict.fromkeys(pids, 0.0)
    for tick in ticks:
        for key, ns in tick["ns"].items():
            owner, pid, _ = key.split("/")
            if owner == component and pid in used:
                used[pid] += ns
    total = sum(used.values()) or 1.0
    return [round(used[pid] / total, 2) for pid in pids]


def summarise(
    ticks: list[dict[str, Any]],
    names: Mapping[str, str],
    timeline: list[list[float]],
    first_due_s: float,
    *,
    jvm_names: Mapping[str, Mapping[int, str]] | None = None,
    min_ms: float = MIN_BURST_MS,
) -> dict[str, Any]:
    """Per group its CPU per second over the pass; per second of ``timeline`` (``[second, n, p50,
    p99, max]`` rows, seconds from ``first_due_s``, an epoch) the bursts in it (module docstring)."""
    jvm = jvm_names or {}
    # each tick of the pass: its offset into the pass, its per-thread figures, its per-group ms
    rows: list[tuple[float, dict[str, Any], dict[str, float]]] = []
    for tick in ticks:
        offset = tick["t"] - first_due_s
        if not 0 <= offset < len(timeline):
            continue
        groups: dict[str, float] = defaultdict(float)
        for key, ns in tick["ns"].items():
            groups[_label(key, names, jvm)] += ns / 1e6
        rows.append((offset, tick, groups))
    # components of several processes (the API's workers): how each second's CPU fell on them
    shared = {c: pids for c, pids in _processes([tick for _, tick, _ in rows]).items() if len(pids) > 1}
    every = sorted({group for _, _, groups in rows for group in groups})
    median = {g: statistics.median(groups.get(g, 0.0) for _, _, groups in rows) for g in every} if rows else {}
    seconds = len(timeline) or 1
    totals = {g: round(sum(groups.get(g, 0.0) for _, _, groups in rows) / seconds, 1) for g in every}
    per_second: list[dict[str, Any]] = []
    for row in timeline:
        second = int(row[0])
        in_second = [r for r in rows if int(r[0]) == second]
        bursts = [
            [round(offset, 1), group, round(ms, 1)]
            for offset, _, groups in in_second
            for group, ms in sorted(groups.items())
            if ms >= min_ms and ms >= BURST_OVER_MEDIAN * median[group]
        ]
        split = {c: _split([tick for _, tick, _ in in_second], c, pids) for c, pids in shared.items()}
        per_second.append({"second": second, "p99_ms": row[3], "bursts": bursts, "split": split})
    return {
        "ticks": len(rows),
        "ms_per_s_by_group": dict(sorted(totals.items(), key=lambda kv: -kv[1])),
        "seconds": per_second,
    }


def worst_lines(summary: dict[str, Any], count: int = WORST_SECONDS) -> list[str]:
    """The worst seconds by p99, each with its bursts, as printable lines."""
    worst = sorted(summary["seconds"], key=lambda s: -(s["p99_ms"] or 0.0))[:count]
    lines = []
    for s in sorted(worst, key=lambda s: s["second"]):
        bursts = "; ".join(f"{group} {ms} ms at {at} s" for at, group, ms in s["bursts"]) or "no burst"
        split = "".join(f"; {c} split {' / '.join(str(x) for x in shares)}" for c, shares in s.get("split", {}).items())
        lines.append(f"second {s['second']} (p99 {s['p99_ms']} ms): {bursts}{split}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--component", action="append", default=[], help="name=pid[,pid...]")
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    components: dict[str, list[int]] = {}
    for spec in args.component:
        name, _, pids = spec.partition("=")
        components[name] = [int(p) for p in pids.split(",") if p]
    with args.out.open("w") as out:
        sample(components, out, args.interval_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
