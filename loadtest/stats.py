"""Small, dependency-free statistics shared by the load generator and the drills."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (the smallest value with at least q% of the values at or below it).

    Nearest-rank never interpolates, so every reported figure is a latency that was actually
    observed; p100 is the maximum and an empty series is 0 (there is nothing to report).
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(frozen=True)
class LatencySummary:
    n: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> LatencySummary:
        if not values_ms:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return cls(
            n=len(values_ms),
            p50=round(percentile(values_ms, 50), 2),
            p95=round(percentile(values_ms, 95), 2),
            p99=round(percentile(values_ms, 99), 2),
            max=round(max(values_ms), 2),
            mean=round(sum(values_ms) / len(values_ms), 2),
        )

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def latency_block(values_ms: Sequence[float], *, with_mean: bool = False) -> dict[str, float]:
    """The benchmarks' latency figures of one series: ``n``, nearest-rank ``p50_ms``/``p95_ms``/
    ``p99_ms``, the mean if asked, ``max_ms``; just ``{"n": 0}`` for an empty series."""
    if not values_ms:
        return {"n": 0}
    block: dict[str, float] = {"n": len(values_ms)}
    for q in (50, 95, 99):
        block[f"p{q}_ms"] = round(percentile(values_ms, q), 2)
    if with_mean:
        block["mean_ms"] = round(sum(values_ms) / len(values_ms), 2)
    block["max_ms"] = round(max(values_ms), 1)
    return block
