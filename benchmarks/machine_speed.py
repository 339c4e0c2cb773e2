"""How fast this machine runs Python now: a fixed pure-Python loop, timed on one core.

The VMs these benchmarks run on change speed by tens of percent within minutes and from one
machine to the next (docs/benchmarks.md: the same code and node cost a third more CPU per recall
in a slow spell, and the hypervisor reports little of it as steal). A latency or a CPU per recall
without the machine's speed beside it cannot be compared with another run's. Earlier sections
quoted a hand-run check, ``sum(i*i for i in range(10_000_000))``, 0.43 s in the fastest spells
and 0.85 s in the slowest; :func:`speed_check` runs the same loop at a fifth of its size a few
times and reports it scaled back to the full size. The interpreter matters as much as the
machine: on one machine within a second, pyenv's 3.11.7 (no PGO or LTO; the hand-run checks
before 2026-12-07 most likely ran on it, the first ``python3`` on ``PATH``) took 0.44–0.62 s and
Debian's 3.11.2 (the ``.venv``'s since then) 0.35–0.36 s, so the result names the interpreter.

It times the process's own CPU (``time.process_time``), not the wall: waiting for a core is the
load's doing, a slower core is the machine's, and only the second belongs here. Run it with
nothing else of the benchmark running (``fastpath_bench`` runs it before its first pass and after
its last).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# The hand-run check's loop length, and the share of it each round runs.
FULL_LOOP = 10_000_000
ROUND_LOOP = 2_000_000


def _loop(n: int) -> int:
    return sum(i * i for i in range(n))


def speed_check(rounds: int = 5, n: int = ROUND_LOOP, clock: Callable[[], float] = time.process_time) -> dict[str, Any]:
    """``rounds`` timings of the loop over ``n``, each scaled to :data:`FULL_LOOP`: the fastest
    (the machine's speed with the least interference) and the median, in seconds."""
    if rounds < 1 or n < 1:
        raise ValueError("rounds and n must be positive")
    scale = FULL_LOOP / n
    seconds: list[float] = []
    for _ in range(rounds):
        started = clock()
        _loop(n)
        seconds.append((clock() - started) * scale)
    return {
        "loop_s_min": round(min(seconds), 3),
        "loop_s_median": round(statistics.median(seconds), 3),
        "rounds": rounds,
        "python": f"{platform.python_version()} {sys.executable}",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def speed_line(speed: dict[str, dict[str, Any]]) -> str:
    """The result's ``machine_speed`` as one printed line (``before`` and ``after`` the passes)."""
    parts = [f"{when} {row['loop_s_min']} s (median {row['loop_s_median']})" for when, row in speed.items()]
    return "machine speed, sum(i*i for i in range(10M)) on one core: " + ", ".join(parts)
