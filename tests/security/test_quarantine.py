"""Issue 10 finding 1, the read half: a stored document the model cannot load never takes a read
down. The documents are planted as an older version stored them (content ``""`` from the
whitespace bug, a canonical name past the limit once normalised), since the API no longer writes
them. Every read a colleague or an admin makes still answers: recall, list, export (member and
``all=true``), the proxy's recall; by-id reads and changes answer 409 naming the quarantine; the
admin lists them with a reason and erases them by id without loading them."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch

from service.config import Settings
from service.domain.belief import Belief
from service.storage.client import routed_id
from service.storage.templates import BELIEF_LOGS, BELIEFS
from tests.api.conftest import Team, belief_body, ok
from tests.security.conftest import store_as_is

POISON = {
    "b-blank-content": {"content": ""},
    "b-long-name": {"canonical_name": "payments_" + "very_long_" * 18 + "name"},
    "b-not-a-list": {"scope": "project:pay"},
}


def _plant(os_client: OpenSearch, settings: Settings, team: Team) -> None:
    """Store the documents as an older version did, straight into the tenant's belief index."""
    for belief_id, damage in POISON.items():
        good = Belief(
            id=belief_id,
            tenant_id=team.tenant,
            owner_id="bob",
            type="decision",
            canonical_name="payments_database",
            aliases=["payments database", "payments"],
            content="placeholder",
            why_it_matters="Shapes payment answers.",
            scope=["project:pay"],
            pinned=True,
        )
        store_as_is(os_client, settings.opensearch_namespace, good, **damage)


@pytest.fixture
def poisoned(client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings) -> Team:
    body = belief_body("payments_ledger", scope="project:pay", pinned=True)
    ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    _plant(os_client, api_settings, team)
    return team


def _jsonl(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


def test_every_read_of_the_project_still_answers(
    client: TestClient, poisoned: Team, caplog: pytest.LogCaptureFixture
) -> None:
    team = poisoned
    with caplog.at_level(logging.WARNING, logger="service.storage.unreadable"):
        recalled = ok(
            client.post(
                "/v1/recall", json={"scopes": ["project:pay"], "query": "payments database"}, headers=team.h("alice")
            )
        )
        assert [p["canonical_name"] for p in recalled["tiers"]["pinned"]] == ["payments_ledger"]
        assert recalled["quarantined"] == len(POISON)
        for user, params in (("alice", {}), ("carol", {"all": "true"})):
            page = ok(client.get("/v1/beliefs", params=params, headers=team.h(user)))
            assert [b["canonical_name"] for b in page["items"]] == ["payments_ledger"]
            assert page["quarantined"] == len(POISON)
            exported = _jsonl(client.get("/v1/beliefs/export", params=params, headers=team.h(user)))
            assert [b["canonical_name"] for b in exported] == ["payments_ledger"]
    logged = [r.getMessage() for r in caplog.records if "quarantined belief" in r.getMessage()]
    for belief_id in POISON:  # each logged with its id, once however often it is met
        assert sum(belief_id in line for line in logged) <= 1
    for path in ("", "/history"):
        response = client.get(f"/v1/beliefs/b-blank-content{path}", headers=team.h("bob"))
        assert response.status_code == 409, response.text
        assert "quarantine" in response.json()["error"]["message"]
    retract = client.post("/v1/beliefs/b-blank-content/retract", json={}, headers=team.h("bob"))
    assert retract.status_code == 409, retract.text
    # the admin's ordinary erase works on it too, by id, without loading it
    erased = ok(client.delete("/v1/beliefs/b-long-name", headers=team.h("carol")))
    assert erased["belief_versions_removed"] == ["b-long-name"]
    assert client.get("/v1/beliefs/b-long-name", headers=team.h("carol")).status_code == 404


def test_admin_lists_and_erases_quarantined_beliefs_by_id(client: TestClient, poisoned: Team, team: Team) -> None:
    assert client.get("/v1/admin/quarantine", headers=team.h("alice")).status_code == 403
    page = ok(client.get("/v1/admin/quarantine", headers=team.h("carol")))
    assert page["scanned"] == len(POISON) + 1 and page["next_cursor"] is None
    listed = {item["belief_id"]: item for item in page["items"]}
    assert set(listed) == set(POISON)
    assert listed["b-blank-content"]["owner_id"] == "bob" and "content" in listed["b-blank-content"]["reason"]
    # paging by one finds the same
    found, cursor = [], None
    while True:
        small = ok(
            client.get(
                "/v1/admin/quarantine",
                params={"limit": 1, **({"cursor": cursor} if cursor else {})},
                headers=team.h("carol"),
            )
        )
        found += [i["belief_id"] for i in small["items"]]
        cursor = small["next_cursor"]
        if cursor is None:
            break
    assert sorted(found) == sorted(POISON)
    # a belief that loads is not the quarantine's to erase
    ledger = ok(client.get("/v1/beliefs", headers=team.h("alice")))["items"][0]["id"]
    assert client.delete(f"/v1/admin/quarantine/{ledger}", headers=team.h("carol")).status_code == 409
    for belief_id in POISON:
        erased = ok(client.delete(f"/v1/admin/quarantine/{belief_id}", headers=team.h("carol")))
        assert erased["belief_id"] == belief_id
    assert ok(client.get("/v1/admin/quarantine", headers=team.h("carol")))["items"] == []
    assert client.delete("/v1/admin/quarantine/b-blank-content", headers=team.h("carol")).status_code == 404
    recalled = ok(
        client.post("/v1/recall", json={"scopes": ["project:pay"], "query": "payments database"}, headers=team.h("bob"))
    )
    assert recalled["quarantined"] == 0
    events = ok(client.get("/v1/admin/audit", params={"action": "belief.quarantine_erase"}, headers=team.h("carol")))
    assert sorted(e["belief_ids"][0] for e in events["items"]) == sorted(POISON)


def test_another_tenant_cannot_see_or_erase_the_quarantine(
    client: TestClient, poisoned: Team, other_team: Team
) -> None:
    assert ok(client.get("/v1/admin/quarantine", headers=other_team.h("carol")))["items"] == []
    assert client.delete("/v1/admin/quarantine/b-blank-content", headers=other_team.h("carol")).status_code == 404


def test_a_belief_whose_change_log_is_lost_is_listed_and_erased_by_id(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings
) -> None:
    """A restore that brought the beliefs back without their change-log documents: the belief
    cannot be shown or written back without its history, so the admin's scan lists it."""
    kept = ok(
        client.post("/v1/beliefs", json=belief_body("payments_ledger", scope="project:pay"), headers=team.h("alice")),
        201,
    )
    lost = ok(
        client.post("/v1/beliefs", json=belief_body("payments_queue", scope="project:pay"), headers=team.h("alice")),
        201,
    )
    ok(client.post(f"/v1/beliefs/{lost['id']}/pin", headers=team.h("alice")))  # a history to lose
    stored = os_client.get(
        index=BELIEFS.alias(api_settings.opensearch_namespace),
        id=routed_id(team.tenant, lost["id"]),
        routing=team.tenant,
    )
    os_client.delete(
        index=BELIEF_LOGS.alias(api_settings.opensearch_namespace),
        id=routed_id(team.tenant, stored["_source"]["change_log_ref"]),
        routing=team.tenant,
        refresh=True,
    )

    assert client.get(f"/v1/beliefs/{lost['id']}/history", headers=team.h("alice")).status_code == 409
    page = ok(client.get("/v1/admin/quarantine", headers=team.h("carol")))
    assert [item["belief_id"] for item in page["items"]] == [lost["id"]]
    assert "change_log" in page["items"][0]["reason"]
    ok(client.delete(f"/v1/admin/quarantine/{lost['id']}", headers=team.h("carol")))
    assert ok(client.get("/v1/admin/quarantine", headers=team.h("carol")))["items"] == []
    assert ok(client.get(f"/v1/beliefs/{kept['id']}", headers=team.h("alice")))["id"] == kept["id"]
