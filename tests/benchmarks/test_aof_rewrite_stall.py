"""benchmarks/aof_rewrite_stall.py and fastpath_bench's rewrite diagnostic, on a real redis-server."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from benchmarks.aof_rewrite_stall import ARMS, Rewrites, child_seconds, summary, windows
from benchmarks.fastpath_bench import AofRewrite
from deploy.devstack import Service


def _rewrites_done(rds: redis.Redis[bytes], count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while int(rds.info("persistence")["aof_rewrites"]) < count or rds.info("persistence")["aof_rewrite_in_progress"]:
        assert time.monotonic() < deadline, "Redis did not finish its rewrites"
        time.sleep(0.05)


def test_rewrites_alternate_the_arms_and_the_childrens_times_are_read_from_the_log(own_redis: Service) -> None:
    rds = redis.Redis.from_url(own_redis.url)
    log = Path(own_redis.home) / "server.log"
    try:
        rds.set("payload", b"x" * 100_000)  # something to write
        since = len(log.read_text().splitlines())
        rewrites = Rewrites(rds, 0.3, 4)
        rewrites.start()
        rewrites.join(timeout=30)
        _rewrites_done(rds, 4)
        assert [arm for _, arm, _ in rewrites.asked] == list(ARMS)
        accepted = [a for a in rewrites.asked if a[2] == "True"]
        assert accepted, rewrites.asked  # 0.3 s apart: each rewrite of 100 kB is long done
        times = child_seconds(log, since)
        assert len(times) == len(accepted) and all(0 <= t < 5 for t in times)
        assert rds.config_get("rdbcompression")["rdbcompression"] == ARMS[-1]
    finally:
        rds.close()


def test_windows_split_the_recalls_around_each_rewrite() -> None:
    answered = [(0.5, 5.0), (0.9, 7.0), (1.1, 300.0), (1.5, 200.0), (2.2, 4.0)]
    rows = windows(answered, [(1.0, "yes", "True"), (2.0, "no", "True")], 1.0)
    assert rows[0]["after"]["n"] == 2 and rows[0]["after"]["max_ms"] == 300.0
    assert rows[0]["before"]["n"] == 2 and rows[0]["before"]["max_ms"] == 7.0
    assert rows[1]["after"]["n"] == 1 and rows[1]["before"]["max_ms"] == 300.0
    rows[0]["child_s"], rows[1]["child_s"] = 0.4, 0.1
    rows.append({"arm": "no", "answer": "refused: in progress", "after": {"n": 9}, "before": {}})
    by_arm = summary(rows)
    assert by_arm["yes"]["rewrites"] == 1 and by_arm["yes"]["child_s"] == 0.4
    assert by_arm["no"]["rewrites"] == 1  # the refused one is not counted


def test_fastpath_bench_asks_for_one_rewrite_into_the_pass(own_redis: Service) -> None:
    rds = redis.Redis.from_url(own_redis.url)
    try:
        before = int(rds.info("persistence")["aof_rewrites"])
        with AofRewrite(rds, 0.2) as rewrite:
            time.sleep(0.5)
        _rewrites_done(rds, before + 1)
        outcome = rewrite.outcome()
        assert outcome is not None and outcome["answer"] == "True" and outcome["asked_utc"]
        with AofRewrite(rds, None) as nothing:
            pass
        assert nothing.outcome() is None
    finally:
        rds.close()
