"""Benchmark instrumentation, never deployed: put this folder first on ``PYTHONPATH`` of an API
and set ``TENURE_BENCH_MONITOR_DIR``, and every Python process started so (uvicorn and its
workers; not Celery's) appends a timeline to ``<dir>/<pid>.jsonl``:

- ``["gc", start, generation, wall_ms, cpu_ms, collected]`` for every generation-2 collection and
  every other one longer than 2 ms (``cpu_ms`` is the collecting thread's CPU, so a collection
  that was merely descheduled shows as wall >> cpu);
- ``["lag", start, ms]`` when a thread that sleeps 2 ms at a time woke more than 10 ms late: the
  process held the GIL (a collection, a long C call) or had no CPU;
- ``["heap", time, rss_kb]`` once a second;
- ``["frozen", time, objects]`` when the process gets ``SIGUSR1`` (the benchmark asks after its
  measured window). Not once a second: ``gc.get_freeze_count()`` walks the whole permanent
  generation holding the GIL, ~90-140 ms for 380,000 frozen objects here, so a monitor that asked
  every second stalled the process it watched and charged it that CPU, in proportion to how much
  it had frozen (docs/benchmarks.md, 2026-12-03 09:30).

``benchmarks/gc_pause_ab.py`` reads them. Python imports ``sitecustomize`` by itself at start-up."""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

_DIR = os.environ.get("TENURE_BENCH_MONITOR_DIR")
_events: list[list[Any]] = []
_started: dict[str, float] = {}


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started["wall"], _started["cpu"] = time.time(), time.thread_time()
        return
    wall_ms = (time.time() - _started["wall"]) * 1000
    if info["generation"] == 2 or wall_ms > 2:
        cpu_ms = (time.thread_time() - _started["cpu"]) * 1000
        _events.append(["gc", _started["wall"], info["generation"], wall_ms, cpu_ms, info["collected"]])


def _rss_kb() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _watch(out: Path) -> None:
    flushed = time.time()
    while True:
        t0 = time.time()
        time.sleep(0.002)
        late_ms = (time.time() - t0) * 1000 - 2
        if late_ms > 10:
            _events.append(["lag", t0, late_ms])
        if t0 - flushed >= 1:
            flushed = t0
            _events.append(["heap", t0, _rss_kb()])
            taken = _events[:]
            del _events[: len(taken)]
            with out.open("a") as f:
                f.writelines(json.dumps(e) + "\n" for e in taken)


def _on_usr1(*_: object) -> None:
    # on the main thread, between two bytecodes; the watch thread writes it out within a second
    _events.append(["frozen", time.time(), gc.get_freeze_count()])


if _DIR and "celery" not in " ".join(sys.argv):
    gc.callbacks.append(_on_gc)
    signal.signal(signal.SIGUSR1, _on_usr1)
    _out = Path(_DIR) / f"{os.getpid()}.jsonl"
    threading.Thread(target=_watch, args=(_out,), name="bench-monitor", daemon=True).start()
