"""A Japanese, a Chinese and a European team use the REST API as a new user would: names and
aliases of any script are stored as written, and bad names get a clear 422."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from tests.api.conftest import Team, belief_body, ok


def test_cjk_and_accented_names_are_stored_as_written(client: TestClient, team: Team) -> None:
    for name, aliases, stored in [
        ("テスト方針", ["セッションストア", "ｻｰﾊﾞｰ"], ["セッションストア", "サーバー"]),
        ("数据库选型", ["PostgreSQL", "数据库"], ["postgresql", "数据库"]),
        ("Größenlimit", ["Überwachung"], ["überwachung"]),
        ("configuración regional", ["localización"], ["localización"]),
    ]:
        created = ok(client.post("/v1/beliefs", json=belief_body(name, aliases=aliases), headers=team.h("alice")), 201)
        assert created["aliases"] == stored
        fetched = ok(client.get(f"/v1/beliefs/{created['id']}", headers=team.h("alice")))
        assert fetched["canonical_name"] == created["canonical_name"]
    names = {b["canonical_name"] for b in ok(client.get("/v1/beliefs", headers=team.h("alice")))["items"]}
    assert {"テスト方針", "数据库选型", "größenlimit", "configuración_regional"} <= names


def test_a_name_without_letters_in_any_script_is_a_422(client: TestClient, team: Team) -> None:
    response = client.post("/v1/beliefs", json=belief_body("・・！"), headers=team.h("alice"))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"
    too_long = client.post("/v1/beliefs", json=belief_body("数" * 121, aliases=[]), headers=team.h("alice"))
    assert too_long.status_code == 422 and "120" in json.dumps(too_long.json())
