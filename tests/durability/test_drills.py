"""The fault drill code, tested: its judgement on made-up timelines, and one short real drill.

The real drill is the Redis one (the quickest to restart): a LocalStack with its own redis-server
(the OpenSearch node is the test session's; the namespace is dropped afterwards), load for a few
seconds, SIGKILL of redis-server, restart on the same AOF, recovery, verification. Its own pass
criteria must hold, and the drill must actually have bitten: writes refused with 503 during the
outage, turns answered meanwhile extracted afterwards by the sweep.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loadtest.drill_analysis import Criteria, InFlight, Recovery, Window
from loadtest.drills import PLANS, run_drill
from loadtest.report import Sample

FAULT, READY = 10.0, 20.0


def sample(t: float, op: str, outcome: str, latency_ms: float = 20.0) -> Sample:
    return Sample(t, op, outcome, latency_ms, outcome.startswith("2"))


def healthy_drill() -> list[Sample]:
    """Recalls every second: 200 before the fault, 503 (fast) while down, 200 again after."""
    return [
        sample(float(t), "recall", "200" if t < FAULT or t >= READY + 1 else "503", 5.0 if t >= FAULT else 20.0)
        for t in range(0, 30)
    ]


def judged(samples: list[Sample], allowed: frozenset[str] = frozenset({"503"})) -> list[str]:
    criteria = Criteria(allowed, fail_fast_ms=2000.0, recovery_budget_s=5.0)
    recoveries = [Recovery.of(op, samples, READY) for op in sorted({s.op for s in samples})]
    criteria.judge_timeline(samples, FAULT, recoveries)
    return criteria.failures


def test_a_clean_outage_passes() -> None:
    samples = healthy_drill()
    assert judged(samples) == []
    [recovery] = [Recovery.of("recall", samples, READY)]
    assert (recovery.first_success_s, recovery.sustained_s) == (1.0, 1.0)
    window = Window.of(samples, FAULT, READY)
    assert window.outcomes == {"recall": {"503": 10}}
    assert window.failed_latency_ms.max == 5.0


def test_each_broken_criterion_is_reported() -> None:
    base = healthy_drill()
    assert judged([*base, sample(12.0, "write", "500")])[0].startswith("server errors other than 503")
    assert any("hung" in f for f in judged([*base, sample(12.0, "write", "timeout", 10_000.0)]))
    assert any("took longer" in f for f in judged([*base, sample(12.0, "write", "503", 4000.0)]))
    assert any("failures other than" in f for f in judged([*base, sample(12.0, "write", "connect")]))
    assert any("before the fault" in f for f in judged([*base, sample(2.0, "write", "503")]))
    # still failing at the end: never served steadily again
    assert any("not served steadily" in f for f in judged([*base, sample(29.5, "recall", "503")]))
    # served again, but only after the budget
    late = [s for s in base if s.t_s < READY] + [sample(float(t), "recall", "200") for t in range(27, 30)]
    assert any("not served steadily" in f for f in judged(late))


def test_in_flight_requests_are_those_crossing_the_fault() -> None:
    samples = [sample(9.0, "write", "201", 2000.0), sample(9.5, "recall", "other", 600.0), sample(8.0, "recall", "200")]
    assert InFlight.of(samples, FAULT) == InFlight(2, {"201": 1, "other": 1})


def plan_fail_fast_ms() -> float:
    """Half the client's timeout: a hung request still fails the test."""
    return PLANS["redis"].request_timeout_s * 1000 / 2


def test_redis_drill_end_to_end(opensearch_url: str, tmp_path: Path) -> None:
    plan = replace(
        PLANS["redis"],
        warm_s=4.0,
        outage_s=5.0,
        recovery_s=8.0,
        concurrency=6,
        users_per_tenant=1,
        seed_beliefs_per_user=3,
        mix={"recall": 50, "write": 30, "turn": 20},
        drain_timeout_s=60.0,
        # The suite shares the machine with everything else CI runs: a refused request must still
        # come back well before the client's timeout (not hang), but how fast is the drill script's
        # criterion on a quiet machine (docs/fault-drills.md), not the suite's: speed is measured,
        # not asserted in tests. The suite once failed on one 503 that took 2.2 s at load 25.
        fail_fast_ms=plan_fail_fast_ms(),
    )
    result = run_drill(plan, tmp_path / "stack", opensearch_url=opensearch_url)

    assert result["passed"], result["criteria"]["failures"]
    outage = result["outage"]["outcomes"]
    # the fault bit: writes were refused (cleanly) while redis-server was down ...
    assert outage["write"].get("503", 0) > 0, outage
    assert result["probe"]["responses_503"] > 0
    assert result["probe"]["retry_after_values"] == ["5"]
    # ... and the service came back by itself
    for op, recovery in result["recovery_s"].items():
        assert recovery["sustained_s"] is not None and recovery["sustained_s"] <= plan.recovery_budget_s, op
    verification = result["verification"]
    assert verification["acknowledged_writes"] > 0 and verification["lost_writes"] == []
    assert verification["acknowledged_turns"] > 0
    assert verification["extractions_found"] == verification["acknowledged_turns"]
    assert verification["extractions_applied_twice"] == 0
