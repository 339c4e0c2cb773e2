"""The relation hop (docs/architecture.md, "Recall" 4): a relation that hits brings in the beliefs it
links. A participant is named by id, and a belief's content changes only by a new version (paper
§4.5: supersede), so the hop follows a superseded participant to its current version: a relation
never goes dead because one of its beliefs was updated, and never brings in an old version."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import Team, belief_body, ok

QUERY = "how do payments sessions work?"


def _add(client: TestClient, team: Team, name: str, content: str, **extra: Any) -> None:
    body = {**belief_body(name, "project:pay", id=f"b-{name.replace('_', '-')}", content=content), **extra}
    ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)


def _linked_world(client: TestClient, team: Team, label: str) -> None:
    _add(client, team, "payments_api", f"The payments API is a FastAPI service ({label}).")
    _add(client, team, "session_cache", f"Sessions live in Redis ({label}).")
    _add(
        client,
        team,
        "payments_api_uses_session_cache",
        f"The payments API reads its sessions from the session cache ({label}).",
        type="relation",
        aliases=["payments sessions"],
        participants=["b-payments-api", "b-session-cache"],
    )


def _supersede(client: TestClient, team: Team, belief_id: str, new_id: str, content: str) -> None:
    body = {"id": new_id, "content": content}
    ok(client.post(f"/v1/beliefs/{belief_id}/supersede", json=body, headers=team.h("alice")), 201)


def _recall(client: TestClient, team: Team, user: str) -> tuple[dict[str, str | None], str]:
    body = {"scopes": ["project:pay"], "query": QUERY}
    answer = ok(client.post("/v1/recall", json=body, headers=team.h(user)))
    relevant = {item["id"]: item.get("via_relation") for item in answer["tiers"]["relevant"]}
    return relevant, answer["injection"]["text"]


def test_a_relation_brings_in_the_current_version_of_a_superseded_participant(
    client: TestClient, team: Team, other_team: Team
) -> None:
    _linked_world(client, team, "ours")
    _linked_world(client, other_team, "theirs")  # the same ids in another tenant, never superseded
    _supersede(client, team, "b-session-cache", "b-session-cache-2", "Sessions live in Valkey (ours).")
    _supersede(client, team, "b-session-cache-2", "b-session-cache-3", "Sessions live in Valkey 8 (ours).")
    ok(client.post("/v1/beliefs/b-payments-api/retract", json={"reason": "gone"}, headers=team.h("alice")))
    for user in ("alice", "bob"):  # bob sees the project through his grant
        relevant, text = _recall(client, team, user)
        assert relevant == {
            "b-payments-api-uses-session-cache": None,
            "b-session-cache-3": "b-payments-api-uses-session-cache",
        }, user
        assert "Valkey 8 (ours)" in text and "Redis (ours)" not in text and "theirs" not in text
        assert "Valkey (ours)" not in text and "FastAPI" not in text  # an old version, a retracted one
    relevant, text = _recall(client, other_team, "bob")
    assert set(relevant) == {"b-payments-api-uses-session-cache", "b-payments-api", "b-session-cache"}
    assert "ours" not in text


def test_beliefs_a_relation_brings_in_rank_with_it_under_the_budget(
    client: TestClient, team: Team, other_team: Team
) -> None:
    """A relation's participants carry its score (their clause is the relation's), but they were
    appended after every other hit: under ``maxBeliefs`` the budget cut them first, keeping weaker
    hits the message only brushed. They follow their relation, in score order."""
    for each in (team, other_team):
        _linked_world(client, each, "ours")
        _add(client, each, "work_sessions", "Work sessions are timeboxed.", aliases=["work"])
    body = {"scopes": ["project:pay"], "query": "how do payments sessions work?", "budget": {"maxBeliefs": 3}}
    for user in ("alice", "bob"):
        answer = ok(client.post("/v1/recall", json=body, headers=team.h(user)))
        relevant = [(item["id"], item["score"]) for item in answer["tiers"]["relevant"]]
        assert [item for item, _ in relevant] == [
            "b-payments-api-uses-session-cache",
            "b-payments-api",
            "b-session-cache",
        ], relevant
        assert answer["truncated"] is True
        scores = [score for _, score in relevant]
        assert scores == sorted(scores, reverse=True)
    unbounded = ok(client.post("/v1/recall", json={**body, "budget": {}}, headers=other_team.h("bob")))
    assert [item["id"] for item in unbounded["tiers"]["relevant"]][-1] == "b-work-sessions"
