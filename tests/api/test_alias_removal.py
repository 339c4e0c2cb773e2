"""Taking back a wrong alias: ``POST /v1/beliefs/{id}/aliases/remove`` through the lifecycle module,
so the alias stops surfacing the belief at once, the change log and the audit trail record it,
and the same walls as every other write apply (another tenant: 404; unknown alias: 422, no change)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import Team, belief_body, ok


def _recall(client: TestClient, team: Team, user: str, query: str) -> list[str]:
    body = {"query": query, "scopes": ["project:pay"]}
    ids: list[str] = ok(client.post("/v1/recall", json=body, headers=team.h(user)))["injected_ids"]
    return ids


def test_a_removed_alias_no_longer_surfaces_the_belief_and_is_audited(
    client: TestClient, team: Team, other_team: Team
) -> None:
    body = belief_body("deploy_freeze", "project:pay", aliases=["release freeze", "payments outage"])
    bid = ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)["id"]
    assert _recall(client, team, "bob", "is there a payments outage right now?") == [bid]  # the wrong alias

    path = f"/v1/beliefs/{bid}/aliases/remove"
    refused = client.post(path, json={"aliases": ["payments outage"]}, headers=other_team.h("alice"))
    assert refused.status_code == 404  # another tenant cannot even tell it exists
    unknown = client.post(path, json={"aliases": ["payments outage", "never an alias"]}, headers=team.h("bob"))
    assert unknown.status_code == 422 and "never an alias" in unknown.json()["error"]["message"]
    assert "payments outage" in ok(client.get(f"/v1/beliefs/{bid}", headers=team.h("alice")))["aliases"]

    updated = ok(client.post(path, json={"aliases": ["Payments  Outage"]}, headers=team.h("bob")))  # normalised
    assert updated["aliases"] == ["release freeze"] and updated["version"] == 2
    assert updated["change_log"][-1]["trigger"] == "aliases removed"
    assert updated["change_log"][-1]["note"] == "payments outage"
    assert _recall(client, team, "bob", "is there a payments outage right now?") == []
    assert _recall(client, team, "bob", "when is the release freeze?") == [bid]

    events = ok(
        client.get(
            "/v1/admin/audit", params={"belief_id": bid, "action": "belief.remove_aliases"}, headers=team.h("carol")
        )
    )["items"]
    assert len(events) == 1 and events[0]["actor_id"] == "bob"
    assert events[0]["details"]["removed"] == ["payments outage"]
    assert "payments outage" in events[0]["before"]["aliases"]
    assert "payments outage" not in events[0]["after"]["aliases"]


def test_removing_nothing_is_a_validation_error(client: TestClient, team: Team) -> None:
    bid = ok(client.post("/v1/beliefs", json=belief_body("tabs_policy", "project:pay"), headers=team.h("alice")), 201)[
        "id"
    ]
    response = client.post(f"/v1/beliefs/{bid}/aliases/remove", json={"aliases": []}, headers=team.h("alice"))
    assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error"
