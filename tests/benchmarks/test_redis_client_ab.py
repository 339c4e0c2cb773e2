"""benchmarks/redis_client_ab.py against the suite's real Redis: both clients run the service's
rate-limit charge and receipt append, answer alike, and leave nothing behind."""

from __future__ import annotations

import redis
import uvloop

from benchmarks.redis_client_ab import measure


def test_both_clients_are_timed_round_by_round_and_leave_no_keys(redis_url: str) -> None:
    figures = uvloop.run(measure(redis_url, rounds=2, calls=20))
    assert set(figures["cpu_us_per_recall_pair"]) == {"redis-py", "lean"}
    assert all(len(v) == 2 and min(v) > 0 for v in figures["by_round"].values())
    assert 0 <= figures["lean_cheaper_rounds"] <= 2 and figures["calls"] == 20
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter("client-ab-*")) == []
    finally:
        client.close()
