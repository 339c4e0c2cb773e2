"""What the paced pass's p99 follows: its machine's busy share, and the split over the API workers,
over the ``fastpath_bench`` results already written (nothing is run).

Each paced pass of a result file is one row: the size, the machine's busy share during the pass
(both cores' non-idle time over the pass, from ``/proc/stat``: ``machine_busy``), its p99 and errors,
and the busiest API worker's share of the workers' CPU (``worker_cpu_s``; 0.5 is an even split over
two). The rows are grouped by size and busy share, then by that split, each group with how many of
its passes met the issue's paced target (p99 ≤ 20 ms, zero errors)::

    .venv/bin/python -m benchmarks.paced_tail benchmarks/results/fastpath-*20261207-*.json --since 2026-12-07T09:31
"""

from __future__ import annotations

import argparse
import json
import statistics
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

TARGET_P99_MS = 20.0
BUSY_EDGES = (0.6, 0.7, 0.75, 0.8)
SPLIT_EDGES = (0.6, 0.7)


@dataclass(frozen=True)
class PacedPass:
    source: str
    variant: str
    beliefs: int
    busy: float
    p99_ms: float
    errors: int
    busiest_worker_share: float | None  # None with fewer than two workers that took part

    @property
    def met(self) -> bool:
        return self.p99_ms <= TARGET_P99_MS and self.errors == 0


def busiest_share(worker_cpu_s: Iterable[float], floor_s: float = 0.5) -> float | None:
    """The busiest worker's share of the CPU of the workers that took part (more than ``floor_s``;
    uvicorn's supervisor and multiprocessing's helpers take none)."""
    took_part = [cpu for cpu in worker_cpu_s if cpu > floor_s]
    if len(took_part) < 2:
        return None
    return max(took_part) / sum(took_part)


def passes_of(result: dict[str, Any], source: str) -> Iterator[PacedPass]:
    """Every paced pass of one ``fastpath_bench`` result that recorded the machine's busy share."""
    for stage in result.get("stages", []):
        for variant in stage["variants"]:
            paced = variant.get("paced") or {}
            if "p99_ms" not in paced or paced.get("machine_busy") is None:
                continue
            yield PacedPass(
                source=source,
                variant=variant["variant"],
                beliefs=stage["beliefs"],
                busy=paced["machine_busy"],
                p99_ms=paced["p99_ms"],
                errors=paced["errors"],
                busiest_worker_share=busiest_share(paced.get("worker_cpu_s") or []),
            )


def band_labels(edges: tuple[float, ...]) -> list[str]:
    """The bands ``edges`` make, in order: ``< a``, ``a–b``, …, ``≥ z``."""
    return [f"< {edges[0]}", *(f"{low}–{high}" for low, high in pairwise(edges)), f"≥ {edges[-1]}"]


def band_of(value: float, edges: tuple[float, ...]) -> str:
    """The band of ``edges`` that holds ``value`` (each band holds its lower edge)."""
    return band_labels(edges)[bisect_right(edges, value)]


def summary(passes: list[PacedPass], key: str) -> dict[str, Any]:
    p99s = [p.p99_ms for p in passes]
    return {
        "band": key,
        "passes": len(passes),
        "p99_median_ms": round(statistics.median(p99s), 2),
        "p99_min_ms": min(p99s),
        "p99_max_ms": max(p99s),
        "met": sum(p.met for p in passes),
    }


def grouped(passes: list[PacedPass]) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Per size: the passes by busy share and by the busiest worker's share, each band summarised."""
    out: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for beliefs in sorted({p.beliefs for p in passes}):
        of_size = [p for p in passes if p.beliefs == beliefs]
        by_busy = _bands(of_size, lambda p: band_of(p.busy, BUSY_EDGES), BUSY_EDGES)
        split = [p for p in of_size if p.busiest_worker_share is not None]
        by_split = _bands(split, lambda p: band_of(p.busiest_worker_share or 0.0, SPLIT_EDGES), SPLIT_EDGES)
        out[beliefs] = {"by_machine_busy": by_busy, "by_busiest_worker_share": by_split}
    return out


def _bands(passes: list[PacedPass], band: Callable[[PacedPass], str], edges: tuple[float, ...]) -> list[dict[str, Any]]:
    groups: dict[str, list[PacedPass]] = {}
    for p in passes:
        groups.setdefault(band(p), []).append(p)
    return [summary(groups[key], key) for key in band_labels(edges) if key in groups]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="fastpath_bench result files")
    parser.add_argument("--since", default="", help="only results started at or after this ISO time")
    args = parser.parse_args()
    passes: list[PacedPass] = []
    for path in args.results:
        result = json.loads(path.read_text())
        if str(result.get("started", "")) >= args.since:
            passes.extend(passes_of(result, path.name))
    for beliefs, groups in grouped(passes).items():
        print(f"\n{beliefs:,} beliefs")
        for name, rows in groups.items():
            print(f"  {name}: band | passes | p99 median (min–max) ms | met p99 ≤ {TARGET_P99_MS:g} ms, 0 errors")
            for row in rows:
                print(
                    f"    {row['band']} | {row['passes']} | {row['p99_median_ms']} "
                    f"({row['p99_min_ms']}–{row['p99_max_ms']}) | {row['met']}"
                )


if __name__ == "__main__":
    main()
