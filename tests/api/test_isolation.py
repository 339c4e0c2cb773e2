"""Every belief endpoint across two tenants and two users.

Tenant A: alice (project pay, team core), bob (project pay), carol (admin). Tenant B is provisioned
the same way and holds beliefs with the *same ids and user names*, so any leak is visible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from tests.api.conftest import Team, belief_body, make_team, ok

IDS = {"b-personal": "domain:code", "b-team": "team:core", "b-project": "project:pay"}
ALL_SCOPES = ["domain:code", "team:core", "project:pay", "user:universal"]
QUERY = "personal thing, team thing, project thing"


@pytest.fixture(scope="module")
def tenants(client: TestClient, operator: dict[str, str]) -> tuple[Team, Team]:
    a, b = make_team(client, operator), make_team(client, operator)
    for team in (a, b):
        for belief_id, scope in IDS.items():
            name = belief_id.removeprefix("b-") + "_thing"
            body = belief_body(name, scope, id=belief_id, content=f"{team.tenant} secret {name}")
            ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
        ok(
            client.post(
                "/v1/beliefs",
                json=belief_body("question_thing", "domain:code", id="b-q", type="open_question"),
                headers=team.h("alice"),
            ),
            201,
        )
    return a, b


def _ids(items: list[dict[str, Any]]) -> set[str]:
    return {i["id"] for i in items}


def test_get_only_what_one_may_see(client: TestClient, tenants: tuple[Team, Team]) -> None:
    a, b = tenants
    for belief_id in IDS:
        mine = ok(client.get(f"/v1/beliefs/{belief_id}", headers=a.h("alice")))
        assert mine["tenant_id"] == a.tenant and a.tenant in mine["content"]
    assert ok(client.get("/v1/beliefs/b-project", headers=a.h("bob")))["tenant_id"] == a.tenant
    for belief_id in ("b-personal", "b-team"):
        response = client.get(f"/v1/beliefs/{belief_id}", headers=a.h("bob"))
        assert response.status_code == 404
        # indistinguishable from a belief that does not exist at all
        missing = client.get("/v1/beliefs/b-never-existed", headers=a.h("bob"))
        assert response.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
    assert ok(client.get("/v1/beliefs/b-personal", headers=b.h("alice")))["tenant_id"] == b.tenant


def test_list_and_export_never_leak(client: TestClient, tenants: tuple[Team, Team]) -> None:
    a, b = tenants
    assert _ids(ok(client.get("/v1/beliefs", headers=a.h("alice")))["items"]) == {*IDS, "b-q"}
    bob = ok(
        client.get("/v1/beliefs", params={"scope": ["domain:code", "team:core", "project:pay"]}, headers=a.h("bob"))
    )
    assert _ids(bob["items"]) == {"b-project"}
    for row in ok(client.get("/v1/beliefs", params={"all": "true"}, headers=b.h("carol")))["items"]:
        assert row["tenant_id"] == b.tenant
    exported = client.get("/v1/beliefs/export", headers=a.h("bob")).text
    assert "b-personal" not in exported and "b-team" not in exported and a.tenant in exported
    assert b.tenant not in exported


def test_recall_never_leaks(client: TestClient, tenants: tuple[Team, Team]) -> None:
    a, b = tenants
    body = {"scopes": ALL_SCOPES, "query": QUERY, "explain": True}
    alice = ok(client.post("/v1/recall", json=body, headers=a.h("alice")))
    assert set(alice["injected_ids"]) == set(IDS)  # b-q is an unpinned question: never injected
    assert b.tenant not in alice["injection"]["text"]
    bob = ok(client.post("/v1/recall", json=body, headers=a.h("bob")))
    assert bob["injected_ids"] == ["b-project"]
    assert {"scope": "team:core", "outcome": "filtered: no grant for this shared scope"} in bob["explain"]
    other = ok(client.post("/v1/recall", json=body, headers=b.h("alice")))
    assert a.tenant not in other["injection"]["text"] and b.tenant in other["injection"]["text"]


MUTATIONS: dict[str, Callable[[TestClient, str, dict[str, str]], Any]] = {
    "supersede": lambda c, i, h: c.post(f"/v1/beliefs/{i}/supersede", json={"content": "hijack"}, headers=h),
    "reinforce": lambda c, i, h: c.post(f"/v1/beliefs/{i}/reinforce", json={"aliases": ["x"]}, headers=h),
    "pin": lambda c, i, h: c.post(f"/v1/beliefs/{i}/pin", headers=h),
    "unpin": lambda c, i, h: c.post(f"/v1/beliefs/{i}/unpin", headers=h),
    "resolve": lambda c, i, h: c.post(f"/v1/beliefs/{i}/resolve", json={}, headers=h),
    "aliases": lambda c, i, h: c.post(f"/v1/beliefs/{i}/aliases", json={"aliases": ["hijack"]}, headers=h),
    "retract": lambda c, i, h: c.post(f"/v1/beliefs/{i}/retract", json={}, headers=h),
    "history": lambda c, i, h: c.get(f"/v1/beliefs/{i}/history", headers=h),
}


@pytest.mark.parametrize("action", sorted(MUTATIONS))
def test_others_beliefs_are_not_found_for_every_operation(
    client: TestClient, tenants: tuple[Team, Team], action: str
) -> None:
    a, b = tenants
    target = "b-q" if action == "resolve" else "b-personal"
    # another user of the tenant, and another tenant's admin (whose tenant has a belief with the
    # same id, owned by someone else): both get "not found"
    for headers in (a.h("bob"), b.h("carol")):
        response = MUTATIONS[action](client, target, headers)
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "not_found"
    assert MUTATIONS[action](client, "b-team", a.h("bob")).status_code == 404
    # alice's belief in tenant A is unchanged by anything done in tenant B or by bob
    belief = ok(client.get(f"/v1/beliefs/{target}", headers=a.h("alice")))
    assert belief["version"] == 1 and "hijack" not in belief["aliases"]


def test_writes_into_ungranted_shared_scopes_are_forbidden(client: TestClient, tenants: tuple[Team, Team]) -> None:
    a, _ = tenants
    create = client.post("/v1/beliefs", json=belief_body("sneaky", "team:core"), headers=a.h("bob"))
    assert create.status_code == 403 and create.json()["error"]["code"] == "forbidden"
    imported = client.post(
        "/v1/beliefs/import", json=[{**belief_body("sneaky", "team:core"), "_id": "b-sn"}], headers=a.h("bob")
    )
    assert imported.status_code == 403
    # shared beliefs are writable by every grant holder
    ok(client.post("/v1/beliefs/b-project/reinforce", json={}, headers=a.h("bob")))


def test_erase_across_tenants_is_not_found(client: TestClient, tenants: tuple[Team, Team]) -> None:
    a, b = tenants
    ok(client.post("/v1/beliefs", json=belief_body("doomed", id="b-doomed"), headers=a.h("alice")), 201)
    assert client.delete("/v1/beliefs/b-doomed", headers=b.h("carol")).status_code == 404
    assert client.delete("/v1/beliefs/b-doomed", headers=a.h("bob")).status_code == 403
    assert ok(client.get("/v1/beliefs/b-doomed", headers=a.h("alice")))["id"] == "b-doomed"
    assert ok(client.delete("/v1/beliefs/b-doomed", headers=a.h("carol")))["belief_versions_removed"] == ["b-doomed"]


def test_audit_across_tenants_and_roles(client: TestClient, tenants: tuple[Team, Team], services: Services) -> None:
    a, b = tenants
    services.audit.refresh()
    assert client.get("/v1/admin/audit", headers=a.h("alice")).status_code == 403
    assert client.get("/v1/admin/audit", params={"tenant_id": a.tenant}, headers=b.h("carol")).status_code == 403
    events = ok(client.get("/v1/admin/audit", params={"belief_id": "b-personal"}, headers=b.h("carol")))["items"]
    assert events and all(e["tenant_id"] == b.tenant for e in events)


def test_provisioning_across_tenants(client: TestClient, tenants: tuple[Team, Team]) -> None:
    a, b = tenants
    assert (
        client.post(
            f"/v1/admin/tenants/{a.tenant}/users", json={"user_id": "mallory"}, headers=b.h("carol")
        ).status_code
        == 403
    )
    assert (
        client.post(f"/v1/admin/tenants/{a.tenant}/users/alice/keys", json={}, headers=b.h("carol")).status_code == 403
    )
    assert client.get(f"/v1/admin/tenants/{a.tenant}/users", headers=a.h("alice")).status_code == 403
    assert client.post("/v1/admin/tenants", json={"tenant_id": "nope-x"}, headers=a.h("carol")).status_code == 403
    a_key = a.keys["bob"].split("_")[1]
    assert client.delete(f"/v1/admin/keys/{a_key}", headers=b.h("carol")).status_code == 404
    assert client.delete(f"/v1/admin/keys/{a_key}", headers=a.h("alice")).status_code == 404  # not her key
    users = ok(client.get(f"/v1/admin/tenants/{a.tenant}/users", headers=a.h("carol")))["items"]
    assert sorted(u["user_id"] for u in users) == ["alice", "bob", "carol"]
