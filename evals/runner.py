"""Run a case set against a recall backend on a real OpenSearch store.

Static cases run against a freshly loaded corpus for one tenant; sessions run against another
fresh copy (their mid-session mutations must not leak into static cases), in order, applying each
turn's mutations after the turn is judged, as the paper's harness did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from evals.cases import CaseSet
from evals.judge import Tiers, Verdict, judge, mean
from service.beliefs.lifecycle import merge_aliases, mutate
from service.domain.belief import Belief, ChangeLogEntry, utcnow
from service.domain.principal import Principal
from service.recall.context import ContextBuilder, RecallBudget
from service.recall.query import clean_query
from service.storage.beliefs import BeliefStore


class Backend(Protocol):
    name: str

    def recall(self, principal: Principal, scopes: list[str], query: str, budget: RecallBudget | None) -> Tiers: ...


ClauseFactory = Callable[[str], list[dict[str, Any]]]


class ContextBackend:
    """Our recall through ``builder`` (optionally with swapped search clauses).

    Ablations pass ``clauses`` (built from the cleaned query text, replacing the relevance
    clauses) and/or ``min_score`` (overriding the score threshold of every query). When the
    builder's store keeps write versions, each recall reads the tenant's first and passes it on,
    as the API's recall has it from the rate limit's Redis round trip (the caches may then answer);
    that read is in the timed latency, as it is in a request's.
    """

    def __init__(
        self,
        builder: ContextBuilder,
        name: str = "bm25",
        explain: bool = False,
        *,
        clauses: ClauseFactory | None = None,
        min_score: float | None = None,
    ):
        self.builder = builder
        self.name = name
        self.explain = explain
        self.clauses = clauses
        self.min_score = min_score

    def recall(self, principal: Principal, scopes: list[str], query: str, budget: RecallBudget | None) -> Tiers:
        started = time.perf_counter()
        versions = self.builder.store.versions
        write_version = versions.current(principal.tenant_id) if versions is not None else None
        search_clauses = None
        if self.min_score is not None:
            budget = (budget or RecallBudget()).model_copy(update={"min_score": self.min_score})
        if self.clauses is not None:
            limits = (budget or RecallBudget()).resolve(self.builder.defaults)
            search_clauses = self.clauses(clean_query(query, max_chars=limits.max_query_chars).text)
        result = self.builder.build(
            principal,
            scopes,
            query,
            budget,
            explain=self.explain,
            search_clauses=search_clauses,
            write_version=write_version,
        )
        elapsed = (time.perf_counter() - started) * 1000
        return Tiers(
            persona=result.persona,
            pinned=result.pinned_ids,
            relevant=result.relevant_ids,
            questions=result.question_ids,
            scores={e.belief.id: float(e.score or 0.0) for e in result.relevant},
            clauses={
                e.belief.id: [{"clause": c.clause, "term": c.term, "score": c.score} for c in e.clauses]
                for e in result.relevant
            },
            latency_ms=elapsed,
        )


@dataclass
class RunResult:
    case_set: str
    backend: str
    static: list[Verdict] = field(default_factory=list)
    sessions: list[tuple[str, int, Verdict]] = field(default_factory=list)

    @property
    def verdicts(self) -> list[Verdict]:
        return self.static + [v for _, _, v in self.sessions]

    @property
    def passed(self) -> int:
        return sum(v.passed for v in self.verdicts)

    @property
    def total(self) -> int:
        return len(self.verdicts)

    @property
    def mean_precision(self) -> float | None:
        return mean([v.precision for v in self.verdicts])

    @property
    def max_drift(self) -> float:
        return max((v.drift or 0.0 for _, _, v in self.sessions), default=0.0)

    def summary_line(self) -> str:
        p = self.mean_precision
        return (
            f"{self.case_set} {self.backend}: {self.passed}/{self.total} passed, "
            f"mean precision {'n/a' if p is None else f'{p:.2f}'}, max drift {self.max_drift:.2f}"
        )


def load_corpus(store: BeliefStore, tenant_id: str, case_set: CaseSet) -> list[Belief]:
    beliefs = [Belief.from_record(r, tenant_id=tenant_id) for r in case_set.beliefs]
    result = store.put_many(beliefs, refresh="true")
    if result.failed:
        raise RuntimeError(f"corpus load failed: {result.failed}")
    return beliefs


Progress = Callable[[str, str], None]


def run_case_set(
    case_set: CaseSet,
    backend: Backend,
    store: BeliefStore,
    *,
    static_tenant: str,
    session_tenant: str,
    progress: Progress | None = None,
) -> RunResult:
    """Load the corpus for both tenants, run every static case and every session turn."""
    load_corpus(store, static_tenant, case_set)
    load_corpus(store, session_tenant, case_set)
    run = RunResult(case_set=case_set.name, backend=backend.name)
    for case in case_set.static:
        principal = case_set.principal(static_tenant, case.user_id)
        budget = RecallBudget.model_validate(case.budget) if case.budget else None
        tiers = backend.recall(principal, case.scope, case.query, budget)
        run.static.append(judge(case.case_id, case.expect, tiers))
        if progress:
            progress(backend.name, case.case_id)
    for session in case_set.sessions:
        principal = case_set.principal(session_tenant, session.user_id)
        for turn in session.turns:
            tiers = backend.recall(principal, turn.scope, turn.user_message, None)
            verdict = judge(f"{session.case_id}#{turn.index}", turn.expect, tiers)
            run.sessions.append((session.case_id, turn.index, verdict))
            apply_turn_mutations(store, principal, session.case_id, turn)
            if progress:
                progress(backend.name, verdict.case_id)
    return run


def apply_turn_mutations(store: BeliefStore, principal: Principal, session_id: str, turn: object) -> None:
    create = getattr(turn, "create_belief", None)
    if create:
        store.put(Belief.from_record(create, tenant_id=principal.tenant_id), refresh="true")
    update = getattr(turn, "add_aliases", None)
    if update:
        belief_id, aliases = update
        entry = ChangeLogEntry(
            changed_at=utcnow(),
            trigger="entity_update (session mutation)",
            actor=principal.user_id,
            changed_by_session=session_id,
            changed_by_turn=str(getattr(turn, "index", "")),
        )

        # the eval harness seeds its own store (no audit trail), so it edits the belief directly
        def add(belief: Belief) -> Belief:
            belief.aliases, _ = merge_aliases(belief.aliases, aliases)
            belief.change_log.append(entry)
            return belief

        mutate(store, principal, belief_id, add, refresh="true")
