"""Property: whatever the principals, grants and beliefs, no recall and no list ever returns a
belief outside the principal's tenant and grants, and list returns exactly what they may see.

Beliefs are written straight into the real index (fast); principals authenticate over HTTP with
JWTs carrying their grants, so the filters under test are built from the auth context alone.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.domain.belief import Belief
from service.domain.scopes import is_shared
from service.storage.beliefs import BeliefStore
from tests.api.conftest import HS_SECRET, ok, sign_jwt

SCOPES = ["user:universal", "domain:code", "domain:code/python", "project:p1", "project:p2", "team:t1"]
NAMES = ["redis_cache", "kafka_topics", "error_handling", "style_guide", "deploy_flow"]
USERS = ["u1", "u2", "u3"]


@dataclass(frozen=True)
class Who:
    tenant: int
    user: str
    projects: frozenset[str]
    teams: frozenset[str]

    def grants(self) -> set[str]:
        return {f"project:{p}" for p in self.projects} | {f"team:{t}" for t in self.teams}


beliefs_st = st.lists(
    st.fixed_dictionaries(
        {
            "tenant": st.integers(0, 1),
            "owner": st.sampled_from(USERS),
            "scope": st.sampled_from(SCOPES),
            "name": st.sampled_from(NAMES),
            "pinned": st.booleans(),
            "user_edited": st.booleans(),
            "type": st.sampled_from(["preference", "decision", "open_question"]),
        }
    ),
    min_size=1,
    max_size=14,
)
who_st = st.builds(
    Who,
    tenant=st.integers(0, 1),
    user=st.sampled_from(USERS),
    projects=st.frozensets(st.sampled_from(["p1", "p2"])),
    teams=st.frozensets(st.sampled_from(["t1"])),
)


def _token(tenant_id: str, who: Who) -> str:
    now = int(time.time())
    claims = {
        "iss": "tenure",
        "aud": "tenure-api",
        "sub": who.user,
        "tenant_id": tenant_id,
        "roles": ["member"],
        "projects": sorted(who.projects),
        "teams": sorted(who.teams),
        "iat": now,
        "exp": now + 600,
    }
    return sign_jwt({"alg": "HS256"}, claims, HS_SECRET.encode())


def _visible(row: dict[str, Any], tenants: list[str], who: Who) -> bool:
    if row["tenant"] != who.tenant:
        return False
    if is_shared(row["scope"]):
        return row["scope"] in who.grants()
    return bool(row["owner"] == who.user)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(rows=beliefs_st, who=who_st, session=st.lists(st.sampled_from(SCOPES), max_size=4, unique=True))
def test_no_recall_or_list_leaks(
    client: TestClient, store: BeliefStore, rows: list[dict[str, Any]], who: Who, session: list[str]
) -> None:
    run = uuid.uuid4().hex[:8]
    tenants = [f"prop-{run}-a", f"prop-{run}-b"]
    beliefs = []
    by_id: dict[str, tuple[str, dict[str, Any]]] = {}
    for i, row in enumerate(rows):
        belief_id = f"b-{i}"  # the same ids occur in both tenants
        beliefs.append(
            Belief.model_validate(
                {
                    "id": belief_id,
                    "tenant_id": tenants[row["tenant"]],
                    "owner_id": row["owner"],
                    "type": row["type"],
                    "canonical_name": row["name"],
                    "aliases": [row["name"].split("_")[0]],
                    "content": f"{tenants[row['tenant']]} {i}",
                    "scope": [row["scope"]],
                    "pinned": row["pinned"],
                    "user_edited": row["user_edited"],
                }
            )
        )
        by_id[f"{tenants[row['tenant']]}:{belief_id}"] = (tenants[row["tenant"]], row)
    assert not store.put_many(beliefs, refresh="true").failed
    tenant_id = tenants[who.tenant]
    headers = {"Authorization": f"Bearer {_token(tenant_id, who)}"}
    allowed = {
        k.split(":", 1)[1]
        for k, (_, row) in by_id.items()
        if k.startswith(tenant_id + ":") and _visible(row, tenants, who)
    }

    listed = ok(client.get("/v1/beliefs", params={"limit": 100}, headers=headers))["items"]
    assert all(b["tenant_id"] == tenant_id for b in listed)
    assert {b["id"] for b in listed} == allowed  # exactly: nothing leaks, nothing visible is lost

    query = " ".join(NAMES).replace("_", " ")
    recalled = ok(client.post("/v1/recall", json={"scopes": session, "query": query}, headers=headers))
    returned = recalled["injected_ids"]
    assert set(returned) <= allowed, (returned, allowed)
    for tier in recalled["tiers"].values():
        for item in tier:
            assert tenant_id in item["content"]  # never another tenant's copy of the same id
    other = tenants[1 - who.tenant]
    assert other not in recalled["injection"]["text"]
    if recalled["persona"]:
        assert other not in recalled["persona"]
