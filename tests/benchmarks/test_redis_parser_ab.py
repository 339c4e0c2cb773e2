"""benchmarks/redis_parser_ab.py against the suite's real Redis; and the service's Redis clients
parse with hiredis (the ``redis[hiredis]`` dependency the benchmark justifies)."""

from __future__ import annotations

import uvloop
from redis.utils import HIREDIS_AVAILABLE

from benchmarks.redis_parser_ab import measure


def test_the_installed_redis_client_parses_with_hiredis() -> None:
    assert HIREDIS_AVAILABLE


def test_both_parsers_are_timed_round_by_round(redis_url: str) -> None:
    figures = uvloop.run(measure(redis_url, rounds=2, calls=20))
    assert set(figures["cpu_us_per_pipeline"]) == {"python", "hiredis"}
    assert all(len(v) == 2 and min(v) > 0 for v in figures["by_round"].values())
    assert 0 <= figures["hiredis_cheaper_rounds"] <= 2 and figures["rounds"] == 2
