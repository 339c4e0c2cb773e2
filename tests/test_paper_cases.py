"""The paper's 72 evaluation cases through the recall library, judged as the paper judged them.

60 static cases + 12 session turns (with their mid-session mutations) against the 29-belief seed.
Expected: every case passes, mean precision 1.0, drift 0.0 on every session turn.
"""

from __future__ import annotations

import uuid

import pytest

from evals.cases import CaseSet, paper_case_set
from evals.judge import mean
from evals.runner import RunResult, run_case_set
from service.storage.beliefs import BeliefStore
from tests.conftest import SuiteBackend

CASES = paper_case_set()


@pytest.fixture(scope="module")
def paper_run(store: BeliefStore, suite_backend: SuiteBackend) -> RunResult:
    run_id = uuid.uuid4().hex[:8]
    return run_case_set(
        CASES,
        suite_backend(store),
        store,
        static_tenant=f"paper-static-{run_id}",
        session_tenant=f"paper-session-{run_id}",
    )


def test_case_set_is_the_papers() -> None:
    assert isinstance(CASES, CaseSet)
    assert len(CASES.beliefs) == 29
    assert len(CASES.static) == 60
    assert sum(len(s.turns) for s in CASES.sessions) == 12


@pytest.mark.parametrize("case", CASES.static, ids=lambda c: c.case_id)
def test_static_case(paper_run: RunResult, case: object) -> None:
    verdict = next(v for v in paper_run.static if v.case_id == case.case_id)  # type: ignore[attr-defined]
    assert verdict.passed, verdict.failures


@pytest.mark.parametrize("turn_id", [f"{s.case_id}#{t.index}" for s in CASES.sessions for t in s.turns])
def test_session_turn(paper_run: RunResult, turn_id: str) -> None:
    verdict = next(v for _, _, v in paper_run.sessions if v.case_id == turn_id)
    assert verdict.passed, verdict.failures
    assert verdict.drift == 0.0


def test_headline_numbers(paper_run: RunResult) -> None:
    assert paper_run.passed == paper_run.total == 72
    assert mean([v.precision for v in paper_run.verdicts]) == 1.0
    assert paper_run.max_drift == 0.0


def test_relevant_hits_carry_matched_clauses(paper_run: RunResult) -> None:
    verdict = next(v for v in paper_run.static if v.case_id == "alias-ts-resolves")
    clauses = verdict.tiers.clauses["b-ts-pref"]
    assert {"clause": "aliases", "term": "ts", "score": 5.0} in clauses
