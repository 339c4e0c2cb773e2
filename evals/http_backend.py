"""The paper suite over HTTP, through the Python SDK (``tenure_client``): provision tenants and
users with real API keys, load the corpus with ``POST /v1/beliefs/import``, recall with
``POST /v1/recall`` and apply session mutations through the belief endpoints. Works with any
``httpx.Client`` pointed at the API (a live server, or FastAPI's TestClient in tests).

The SDK's retries are off: a 429 or 503 fails the run as any other unexpected answer does."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import httpx
from tenure_client import Tenure

from evals.cases import CaseSet, UserGrants
from evals.judge import Tiers, judge
from evals.runner import RunResult
from service.domain.principal import Principal
from service.recall.context import RecallBudget

PAPER_USERS = ("test-user", "other-user", "brand-new-user")


def sdk_client(http: httpx.Client, key: str, session_id: str | None = None) -> Tenure:
    """An SDK client with ``key`` over the shared ``http`` connection (no retries)."""
    return Tenure(api_key=key, http_client=http, session_id=session_id, max_retries=0)


class HttpBackend:
    """Recall through the API with the credential of the principal's (tenant, user)."""

    def __init__(self, client: httpx.Client, keys: dict[tuple[str, str], str], name: str = "http"):
        self.client = client
        self.keys = keys
        self.name = name

    def sdk(self, tenant_id: str, user_id: str, session_id: str | None = None) -> Tenure:
        return sdk_client(self.client, self.keys[(tenant_id, user_id)], session_id)

    def recall(self, principal: Principal, scopes: list[str], query: str, budget: RecallBudget | None) -> Tiers:
        limits = budget.model_dump(by_alias=True, exclude_none=True) if budget is not None else None
        tenure = self.sdk(principal.tenant_id, principal.user_id)
        started = time.perf_counter()
        result = tenure.recall(query, scopes=scopes, budget=limits, explain=True)
        elapsed = (time.perf_counter() - started) * 1000
        tiers = result.tiers
        return Tiers(
            persona=result.persona,
            pinned=[e.id for e in tiers.pinned],
            relevant=[e.id for e in tiers.relevant],
            questions=[e.id for e in tiers.questions],
            scores={e.id: float(e.score or 0.0) for e in tiers.relevant},
            clauses={e.id: _clauses(e.clauses) for e in tiers.relevant},
            latency_ms=elapsed,
        )


def _clauses(clauses: list[Any] | None) -> list[dict[str, Any]]:
    """The explain clauses as the server sent them (only the fields it set)."""
    return [c.model_dump(mode="json", exclude_unset=True) for c in clauses or []]


def case_set_users(case_set: CaseSet) -> dict[str, UserGrants]:
    """The users to provision: the paper's three, plus every user the case set names in
    ``users.json`` with the project and team grants it gives them."""
    return {user: UserGrants() for user in PAPER_USERS} | case_set.users


def provision(
    client: httpx.Client,
    operator_key: str,
    tenant: str,
    users: dict[str, UserGrants] | tuple[str, ...] = PAPER_USERS,
) -> dict[tuple[str, str], str]:
    """A tenant with the given users (with their shared-scope grants), each with an API key."""
    admin = sdk_client(client, operator_key).admin
    admin.create_tenant(tenant, f"paper {tenant}")
    grants = users if isinstance(users, dict) else dict.fromkeys(users, UserGrants())
    keys: dict[tuple[str, str], str] = {}
    for user, held in grants.items():
        admin.create_user(tenant, user, projects=list(held.projects), teams=list(held.teams))
        keys[(tenant, user)] = admin.issue_key(tenant, user, name="paper-suite").key
    return keys


def load_corpus(backend: HttpBackend, tenant: str, case_set: CaseSet) -> None:
    """Each user imports their own records with their own key (the seed format, ids kept)."""
    by_owner: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in case_set.beliefs:
        by_owner[record.get("user_id") or PAPER_USERS[0]].append(record)
    for owner, records in by_owner.items():
        report = backend.sdk(tenant, owner).beliefs.import_(records)
        if report.failed:
            raise RuntimeError(f"corpus import failed for {owner}: {report.failed}")


def apply_turn(backend: HttpBackend, principal: Principal, session_id: str, turn: object) -> None:
    tenure = backend.sdk(principal.tenant_id, principal.user_id, session_id)
    create = getattr(turn, "create_belief", None)
    if create:
        tenure.beliefs.import_([create])
    update = getattr(turn, "add_aliases", None)
    if update:
        belief_id, aliases = update
        tenure.beliefs.add_aliases(belief_id, aliases)


def run_over_http(
    case_set: CaseSet, client: httpx.Client, operator_key: str, *, static_tenant: str, session_tenant: str
) -> RunResult:
    users = case_set_users(case_set)
    keys = provision(client, operator_key, static_tenant, users) | provision(
        client, operator_key, session_tenant, users
    )
    backend = HttpBackend(client, keys)
    load_corpus(backend, static_tenant, case_set)
    load_corpus(backend, session_tenant, case_set)
    run = RunResult(case_set=case_set.name, backend=backend.name)
    for case in case_set.static:
        principal = case_set.principal(static_tenant, case.user_id)
        budget = RecallBudget.model_validate(case.budget) if case.budget else None
        run.static.append(judge(case.case_id, case.expect, backend.recall(principal, case.scope, case.query, budget)))
    for session in case_set.sessions:
        principal = case_set.principal(session_tenant, session.user_id)
        for turn in session.turns:
            tiers = backend.recall(principal, turn.scope, turn.user_message, None)
            run.sessions.append(
                (session.case_id, turn.index, judge(f"{session.case_id}#{turn.index}", turn.expect, tiers))
            )
            apply_turn(backend, principal, session.case_id, turn)
    return run
