"""The paced pass's breakdowns: p99 by where in the second a request was due, latencies by kind."""

from __future__ import annotations

from benchmarks.fastpath_bench import Tally, by_phase


def _paced(seconds: int, rate: int, slow_from: float, slow_to: float) -> list[tuple[float, float]]:
    """(due, latency ms) of a paced pass whose requests due in [slow_from, slow_to) of every second
    waited 50 ms, the others 5 ms."""
    start = 1000.25  # perf_counter's origin is arbitrary: phases count from the first due time
    answered = []
    for k in range(seconds * rate):
        offset = k / rate
        slow = slow_from <= offset % 1.0 < slow_to
        answered.append((start + offset, 50.0 if slow else 5.0))
    return answered


def test_a_once_a_second_stall_stands_out_in_its_tenth() -> None:
    p99 = by_phase(_paced(seconds=20, rate=300, slow_from=0.6, slow_to=0.64))
    assert len(p99) == 10
    assert p99[6] == 50.0
    assert [v for i, v in enumerate(p99) if i != 6] == [5.0] * 9


def test_the_period_is_a_parameter() -> None:
    """A stall once every 2 s (at 0.3 s of each 2-s period) is in the second of ten 0.2-s slices."""
    answered = [(due, 50.0 if 0.3 <= (due - 1000.25) % 2.0 < 0.34 else 5.0) for due, _ in _paced(20, 300, 0, 0)]
    p99 = by_phase(answered, period_s=2.0)
    assert p99[1] == 50.0
    assert [v for i, v in enumerate(p99) if i != 1] == [5.0] * 9


def test_no_answers_no_phases() -> None:
    assert by_phase([]) == []


def test_latencies_by_kind() -> None:
    tally = Tally(answered=[(0.0, 3.0), (0.1, 9.0), (0.2, 4.0)], kinds=["miss", "long", "miss"])
    assert tally.by_kind() == {"miss": [3.0, 4.0], "long": [9.0]}
