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


def test_export_and_list_keep_cjk_as_written(client: TestClient, team: Team) -> None:
    body = belief_body(
        "決済プロバイダ", aliases=["決済代行"], content="決済は Stripe に決定。", why_it_matters="例は Stripe で。"
    )
    created = ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    exported = client.get("/v1/beliefs/export", headers=team.h("alice"))
    assert exported.status_code == 200
    assert "決済は Stripe に決定。" in exported.text and "\\u" not in exported.text
    assert json.loads(exported.text.splitlines()[0])["canonical_name"] == "決済プロバイダ"
    # the list's text filter segments like recall: the whole name inside a sentence, not a part of it
    found = ok(client.get("/v1/beliefs", params={"q": "決済代行の件"}, headers=team.h("alice")))["items"]
    assert [b["id"] for b in found] == [created["id"]]
    assert ok(client.get("/v1/beliefs", params={"q": "決済"}, headers=team.h("alice")))["items"] == []


def test_the_cli_adds_recalls_and_exports_japanese(client: TestClient, team: Team) -> None:
    from tests.api.test_cli import _json, _run

    key = ["--key", team.keys["alice"]]
    made = _json(
        client, *key, "add", "セッションストア", "--type", "decision", "--scope", "domain:code",
        "--alias", "セッション管理", "--content", "セッションは Redis に置く。", "--why", "Redis 前提で答える。",
    )  # fmt: skip
    assert made["canonical_name"] == "セッションストア" and made["aliases"] == ["セッション管理"]
    code, text, err = _run(
        client, *key, "recall", "--scope", "domain:code", "--injection-only", "セッションストアの設定を教えて"
    )
    assert code == 0, err
    assert "Redis 前提で答える。" in text and "\\u" not in text
    code, exported, err = _run(client, *key, "export")
    assert code == 0 and "セッションは Redis に置く。" in exported and "\\u" not in exported


def test_a_clipped_persona_never_cuts_a_letter_in_two(client: TestClient, team: Team, other_team: Team) -> None:
    """A universal preference longer than the persona's budget is cut with an ellipsis; the cut
    used to fall between a letter and what completes it (``é`` written as ``e`` + U+0301, a Hangul
    syllable written as jamo, an emoji's ZWJ sequence), so the persona ended in another letter or a
    broken glyph. It is cut between graphemes, like every other clipped text of the injection."""
    budget = {"maxPersonaChars": 20}
    for i, ending in enumerate(("e\u0301 au lait", "\u1100\u1161\u11a8 style", "\U0001f469\u200d\U0001f4bb mode")):
        body = {**belief_body(f"reply_style_{'abc'[i]}", "user:universal"), "subtype": "style"}
        body["id"], body["content"] = f"b-style-{i}", "A" * 18 + ending
        for each in (team, other_team):
            ok(client.post("/v1/beliefs", json=body, headers=each.h("alice")), 201)
        recalled = ok(client.post("/v1/recall", json={"query": "hi", "budget": budget}, headers=team.h("alice")))
        assert recalled["persona"] == "A" * 18 + "…", ending  # the grapheme that did not fit left out whole
        bob = ok(client.post("/v1/recall", json={"query": "hi", "budget": budget}, headers=team.h("bob")))
        assert bob["persona"] is None  # alice's own
        ok(client.post(f"/v1/beliefs/b-style-{i}/retract", json={"reason": "next case"}, headers=team.h("alice")))
