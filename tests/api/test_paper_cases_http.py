"""The paper's 72 cases through POST /v1/recall with real API keys for test-user, other-user and
brand-new-user: the corpus is imported over HTTP, session mutations go through the belief
endpoints. Expected exactly as through the library: 72/72, precision 1.0, drift 0.0."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from evals.cases import paper_case_set
from evals.http_backend import run_over_http
from evals.judge import mean
from evals.runner import RunResult

CASES = paper_case_set()


@pytest.fixture(scope="module")
def http_run(client: TestClient, operator_key: str) -> RunResult:
    run_id = uuid.uuid4().hex[:8]
    return run_over_http(
        CASES,
        client,
        operator_key,
        static_tenant=f"paper-http-static-{run_id}",
        session_tenant=f"paper-http-session-{run_id}",
    )


@pytest.mark.parametrize("case", CASES.static, ids=lambda c: c.case_id)
def test_static_case_over_http(http_run: RunResult, case: object) -> None:
    verdict = next(v for v in http_run.static if v.case_id == case.case_id)  # type: ignore[attr-defined]
    assert verdict.passed, verdict.failures


@pytest.mark.parametrize("turn_id", [f"{s.case_id}#{t.index}" for s in CASES.sessions for t in s.turns])
def test_session_turn_over_http(http_run: RunResult, turn_id: str) -> None:
    verdict = next(v for _, _, v in http_run.sessions if v.case_id == turn_id)
    assert verdict.passed, verdict.failures
    assert verdict.drift == 0.0


def test_headline_numbers_over_http(http_run: RunResult) -> None:
    assert http_run.passed == http_run.total == 72
    assert mean([v.precision for v in http_run.verdicts]) == 1.0
    assert http_run.max_drift == 0.0
    users = {c.user_id for c in CASES.static} | {s.user_id for s in CASES.sessions}
    assert users <= {"test-user", "other-user", "brand-new-user"}
