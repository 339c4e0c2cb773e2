"""Issue 10: import accepts the paper author's later belief format, a relation carrying
``relation_type``; the type is stored, shown in recall's tiers and explain, and rendered into the
injection, while fields that mean nothing are still refused."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import Team, belief_body, ok


def _records() -> list[dict[str, object]]:
    api = {**belief_body("payments_api", content="The payments API is a FastAPI service."), "_id": "b-pay-api"}
    cache = {**belief_body("session_cache", content="Sessions live in Redis."), "_id": "b-cache"}
    relation = {
        **belief_body("payments_api_uses_session_cache", content="The payments API reads sessions from Redis."),
        "_id": "b-pay-uses-cache",
        "type": "relation",
        "aliases": ["payments sessions"],
        "participants": ["b-pay-api", "b-cache"],
        "relation_type": "Depends On",
    }
    return [api, cache, relation]


def _dynamic(recalled: dict[str, Any]) -> str:
    """The dynamic part of the injection, cut from its text (the block is sent once)."""
    injection = recalled["injection"]
    return str(injection["text"][injection["dynamic_start"] :])


def test_a_relation_type_is_imported_stored_recalled_and_rendered(client: TestClient, team: Team) -> None:
    report = ok(client.post("/v1/beliefs/import", json=_records(), headers=team.h("alice")))
    assert sorted(report["imported"]) == ["b-cache", "b-pay-api", "b-pay-uses-cache"]
    stored = ok(client.get("/v1/beliefs/b-pay-uses-cache", headers=team.h("alice")))
    assert stored["relation_type"] == "depends_on"  # snake_cased like a name
    assert ok(client.get("/v1/beliefs/b-cache", headers=team.h("alice")))["relation_type"] is None
    exported = client.get("/v1/beliefs/export", headers=team.h("alice")).text.splitlines()
    assert {json.loads(line)["id"]: json.loads(line)["relation_type"] for line in exported}["b-pay-uses-cache"] == (
        "depends_on"
    )

    body = {"scopes": ["domain:code"], "query": "how do payments sessions work?", "explain": True}
    recalled = ok(client.post("/v1/recall", json=body, headers=team.h("alice")))
    relevant = {t["id"]: t for t in recalled["tiers"]["relevant"]}
    assert relevant["b-pay-uses-cache"]["relation_type"] == "depends_on"
    # the participants it brought in name the relation and its type in their clause
    for participant in ("b-pay-api", "b-cache"):
        assert relevant[participant]["via_relation"] == "b-pay-uses-cache"
        assert [c["clause"] for c in relevant[participant]["clauses"]] == ["relation.depends_on"]
    rendered = json.loads(_dynamic(recalled).split("<relevant_beliefs>", 1)[1].split("</relevant_beliefs>", 1)[0])
    typed = next(item for item in rendered if item["id"] == "b-pay-uses-cache")
    assert typed["type"] == "relation" and typed["relation_type"] == "depends_on"
    assert all("relation_type" not in item for item in rendered if item["id"] != "b-pay-uses-cache")


def test_relation_type_only_on_relations_and_other_unknown_fields_still_refused(client: TestClient, team: Team) -> None:
    not_a_relation = {**belief_body("lonely_pref"), "_id": "b-lonely", "relation_type": "uses"}
    refused = client.post("/v1/beliefs/import", json=[not_a_relation], headers=team.h("alice"))
    assert refused.status_code == 422 and "relation_type is only valid on relation beliefs" in refused.text
    blank = {**_records()[2], "_id": "b-blank-type", "relation_type": "  ->  "}
    assert client.post("/v1/beliefs/import", json=[blank], headers=team.h("alice")).status_code == 422
    meaningless = {**_records()[2], "_id": "b-extra", "weight_in_grams": 3}
    extra = client.post("/v1/beliefs/import", json=[meaningless], headers=team.h("alice"))
    assert extra.status_code == 422 and "Extra inputs are not permitted" in extra.text
    created = ok(
        client.post(
            "/v1/beliefs",
            json={k: v for k, v in _records()[2].items() if k != "_id"}
            | {"id": "b-created-relation", "relation_type": "owned-by"},
            headers=team.h("alice"),
        ),
        201,
    )
    assert created["relation_type"] == "owned_by"
