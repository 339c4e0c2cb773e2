"""A short real load run against the whole local topology, and the verifier catching real faults.

The stack (scripted upstream, uvicorn, a Celery worker) runs as processes against the test
session's OpenSearch and Redis, in a namespace of its own that is dropped afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from deploy.localstack import LocalStack, StackConfig
from loadtest.cleanup import drop_stack_data
from loadtest.generator import Fleet, LoadConfig, provision, run_load, verify
from loadtest.report import OPS, LoadReport
from loadtest.verification import Verification

REDIS_DB = "5"  # not the shared server's db 0
TIMEOUT_S = 60.0  # erasure rewrites audit copies; the shared dev box can be busy


def _redis_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


@dataclass
class Run:
    stack: LocalStack
    config: LoadConfig
    fleet: Fleet
    report: LoadReport
    verification: Verification


@pytest.fixture(scope="module")
def run(opensearch_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = Path(tmp_path_factory.mktemp("loadstack"))
    stack_config = StackConfig(
        root=root,
        opensearch_url=opensearch_url,
        redis_url=_redis_db(redis_url, REDIS_DB),
        api_workers=1,
        worker_concurrency=1,
        with_beat=False,
    )
    stack = LocalStack(stack_config)
    try:
        with stack:
            config = LoadConfig(
                url=stack.api_url,
                operator_key=stack.operator_key(),
                tenants=2,
                users_per_tenant=2,
                concurrency=4,
                duration_s=3.0,
                mix={"recall": 60, "write": 25, "turn": 15},
                seed_beliefs_per_user=3,
                seed=7,
            )

            async def go() -> tuple[Fleet, LoadReport, Verification]:
                fleet = await provision(config)
                report = await run_load(config, fleet)
                return fleet, report, await verify(config, fleet, report, drain_timeout_s=60)

            fleet, report, verification = asyncio.run(go())
            yield Run(stack, config, fleet, report, verification)
    finally:
        # once the processes are gone: a live worker would re-create its queue keys
        drop_stack_data(stack.settings())


def test_report_structure(run: Run) -> None:
    report = run.report
    assert set(report.ops) == set(OPS)
    for op in OPS:
        stats = report.ops[op]
        assert stats.count > 0, f"no {op} requests in the run"
        assert stats.successes == stats.count, stats.errors
        assert stats.throughput_ok_s > 0
        lat = stats.latency_ok_ms
        assert 0 < lat.p50 <= lat.p95 <= lat.p99 <= lat.max
    assert report.total_requests == len(report.timeline) == sum(s.count for s in report.ops.values())
    assert all(0 <= s.t_s <= run.config.duration_s + run.config.request_timeout_s for s in report.timeline)
    assert {s.op for s in report.timeline} == set(OPS)
    assert len(report.acknowledged_writes) == report.ops["write"].successes
    assert len(report.acknowledged_turns) == report.ops["turn"].successes
    assert {w.tenant for w in report.acknowledged_writes} <= set(run.fleet.tenants)
    assert report.recall_expected_hits > 0 and report.recall_missed_hits == []
    assert report.isolation_leaks == []
    data = report.to_json()
    assert len(data["timeline"]) == report.total_requests
    assert data["ops"]["recall"]["latency_ok_ms"]["p99"] == report.ops["recall"].latency_ok_ms.p99


def test_verification_passes(run: Run) -> None:
    v = run.verification
    assert v.ok, v.format_summary()
    seeds = len(run.fleet.users) * run.config.seed_beliefs_per_user
    assert v.acknowledged_writes == seeds + len(run.report.acknowledged_writes)
    assert v.writes_present == v.writes_recallable == v.acknowledged_writes
    assert v.acknowledged_turns == v.extractions_found == len(run.report.acknowledged_turns) > 0
    assert v.foreign_probes > 0 and v.isolation_leaks == []


def test_open_model_keeps_the_rate(run: Run) -> None:
    config = replace(run.config, rate=20.0, duration_s=2.0, mix={"recall": 1})
    report = asyncio.run(run_load(config, run.fleet))
    # Poisson arrivals: 40 expected; a generous band still catches a driver that ignores the rate
    assert 15 <= report.ops["recall"].count <= 75, report.ops["recall"].count
    assert report.total_errors == 0


def test_timed_out_writes_are_unacknowledged_and_counted_when_they_land(run: Run) -> None:
    # A write answers after the next index refresh (wait_for, ~0.5 s on average); a 50 ms client
    # timeout gives up first while the server completes it: unacknowledged but landed.
    config = replace(run.config, request_timeout_s=0.05, duration_s=1.5, concurrency=2, mix={"write": 1})
    report = asyncio.run(run_load(config, run.fleet))
    assert report.unacknowledged_writes, report.format_summary()
    assert report.ops["write"].errors.get("timeout", 0) == len(report.unacknowledged_writes)
    ids = {w.belief_id for w in report.unacknowledged_writes + report.acknowledged_writes}
    assert not ids & {w.belief_id for w in run.report.acknowledged_writes}, "a second run reused ids"
    verification = asyncio.run(verify(run.config, run.fleet, report, drain_timeout_s=10))
    assert verification.unacknowledged_writes == len(report.unacknowledged_writes)
    assert 1 <= verification.unacknowledged_writes_landed <= verification.unacknowledged_writes
    assert verification.ok, verification.format_summary()


def _admin_key(run: Run, tenant: str) -> str:
    """A tenant admin outside the fleet: members cannot erase beliefs."""
    op = {"Authorization": f"Bearer {run.config.operator_key}"}
    base = f"{run.stack.api_url}/v1/admin/tenants/{tenant}/users"
    created = httpx.post(
        base, headers=op, json={"user_id": "eraser", "roles": ["admin"], "projects": ["shared"]}, timeout=TIMEOUT_S
    )
    assert created.status_code == 201, created.text
    issued = httpx.post(f"{base}/eraser/keys", headers=op, json={"name": "eraser"}, timeout=TIMEOUT_S)
    assert issued.status_code == 201, issued.text
    return str(issued.json()["key"])


def test_verification_reports_a_lost_write_and_a_duplicate_extraction(run: Run) -> None:
    victim = run.report.acknowledged_writes[0]
    admin = _admin_key(run, victim.tenant)
    erased = httpx.delete(
        f"{run.stack.api_url}/v1/beliefs/{victim.belief_id}",
        headers={"Authorization": f"Bearer {admin}"},
        timeout=TIMEOUT_S,
    )
    assert erased.status_code == 200, erased.text

    after_erase = asyncio.run(verify(run.config, run.fleet, run.report, drain_timeout_s=10))
    assert [w["belief_id"] for w in after_erase.lost_writes] == [victim.belief_id]
    assert after_erase.duplicate_extractions == [] and not after_erase.ok

    turn = run.report.acknowledged_turns[0]
    owner = run.fleet.user(turn.user)
    twin = httpx.post(
        f"{run.stack.api_url}/v1/beliefs",
        headers={"Authorization": f"Bearer {owner.key}"},
        json={
            "type": "decision",
            "canonical_name": f"load_turn_{turn.token}",
            "content": f"A second copy of turn {turn.token}.",
            "why_it_matters": "It must be reported as a duplicate.",
            "scope": [turn.scope],
        },
        timeout=TIMEOUT_S,
    )
    assert twin.status_code == 201, twin.text

    after_twin = asyncio.run(verify(run.config, run.fleet, run.report, drain_timeout_s=10))
    assert [d["token"] for d in after_twin.duplicate_extractions] == [turn.token]
    assert after_twin.duplicate_extractions[0]["count"] == 2
    assert [w["belief_id"] for w in after_twin.lost_writes] == [victim.belief_id]
    assert after_twin.lost_extractions == [] and after_twin.isolation_leaks == []
