"""The benchmarks' speed check: timings scaled to the hand-run check's loop, fastest and median
kept, on the process's own CPU clock."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.machine_speed import FULL_LOOP, ROUND_LOOP, speed_check, speed_line


def fake_clock(durations: list[float]) -> itertools.cycle[float]:
    """A clock whose successive (start, end) readings are ``durations`` apart, round after round."""
    readings: list[float] = []
    now = 0.0
    for d in durations:
        readings += [now, now + d]
        now += d + 1.0
    return itertools.cycle(readings)


def test_rounds_are_scaled_to_the_full_loop_and_summarised() -> None:
    ticks = fake_clock([0.10, 0.12, 0.09])
    speed = speed_check(rounds=3, n=100, clock=lambda: next(ticks))
    scale = FULL_LOOP / 100
    assert speed["loop_s_min"] == pytest.approx(round(0.09 * scale, 3))
    assert speed["loop_s_median"] == pytest.approx(round(0.10 * scale, 3))
    assert speed["rounds"] == 3


def test_the_real_loop_takes_cpu_time() -> None:
    speed = speed_check(rounds=2, n=ROUND_LOOP // 20)
    assert 0 < speed["loop_s_min"] <= speed["loop_s_median"]


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        speed_check(rounds=0)
    with pytest.raises(ValueError, match="must be positive"):
        speed_check(n=0)


def test_the_printed_line_names_both_readings() -> None:
    line = speed_line(
        {
            "before": {"loop_s_min": 0.52, "loop_s_median": 0.55},
            "after": {"loop_s_min": 0.61, "loop_s_median": 0.64},
        }
    )
    assert "before 0.52 s (median 0.55)" in line and "after 0.61 s (median 0.64)" in line
