"""The paced tail's grouping (benchmarks/paced_tail.py) over result-shaped dicts."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.paced_tail import band_of, busiest_share, grouped, passes_of


def result(*variants: dict[str, Any], beliefs: int = 1_000_000) -> dict[str, Any]:
    return {"stages": [{"beliefs": beliefs, "variants": list(variants)}]}


def paced(
    name: str, busy: float | None, p99: float, errors: int = 0, workers: list[float] | None = None
) -> dict[str, Any]:
    figures = {"p99_ms": p99, "errors": errors, "machine_busy": busy, "worker_cpu_s": workers or []}
    return {"variant": name, "paced": figures}


def test_the_busiest_workers_share_counts_only_workers_that_took_part() -> None:
    assert busiest_share([0.0, 6.0, 2.0]) == pytest.approx(0.75)
    assert busiest_share([0.1, 9.0]) is None  # one worker did the work: no split to speak of
    assert busiest_share([]) is None


def test_bands_are_half_open() -> None:
    edges = (0.6, 0.7)
    assert [band_of(v, edges) for v in (0.59, 0.6, 0.69, 0.7, 0.95)] == [
        "< 0.6",
        "0.6–0.7",
        "0.6–0.7",
        "≥ 0.7",
        "≥ 0.7",
    ]


def test_passes_without_a_busy_share_are_left_out_and_the_target_needs_no_errors() -> None:
    rows = list(
        passes_of(
            result(
                paced("a", 0.55, 18.0, workers=[0.0, 5.0, 5.0]),
                paced("b", 0.58, 19.0, errors=2),
                paced("c", None, 10.0),
                {"variant": "d"},  # no paced pass
            ),
            "file.json",
        )
    )
    assert [(r.variant, r.met, r.busiest_worker_share) for r in rows] == [("a", True, 0.5), ("b", False, None)]


def test_grouped_by_size_busy_share_and_split() -> None:
    passes = [
        *passes_of(result(paced("a", 0.55, 18.0, workers=[5.0, 5.0]), beliefs=100_000), "x"),
        *passes_of(result(paced("b", 0.72, 40.0, workers=[8.0, 2.0]), paced("c", 0.73, 60.0, workers=[5.0, 5.0])), "y"),
    ]
    out = grouped(passes)
    assert list(out) == [100_000, 1_000_000]
    assert out[100_000]["by_machine_busy"] == [
        {"band": "< 0.6", "passes": 1, "p99_median_ms": 18.0, "p99_min_ms": 18.0, "p99_max_ms": 18.0, "met": 1}
    ]
    busy_1m = out[1_000_000]["by_machine_busy"]
    assert [(row["band"], row["passes"], row["p99_median_ms"], row["met"]) for row in busy_1m] == [
        ("0.7–0.75", 2, 50.0, 0)
    ]
    split_1m = out[1_000_000]["by_busiest_worker_share"]
    assert [(row["band"], row["passes"]) for row in split_1m] == [("< 0.6", 1), ("≥ 0.7", 1)]
