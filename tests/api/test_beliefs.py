"""The belief lifecycle over HTTP: create, import, get, list, supersede, reinforce, pin, resolve,
aliases, retract, history, export, erase."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from evals.cases import paper_case_set
from service import redis_keys
from service.api.state import Services
from tests.api.conftest import Team, belief_body, ok


def _create(client: TestClient, team: Team, user: str, name: str, scope: str = "domain:code", **extra: Any) -> Any:
    return ok(client.post("/v1/beliefs", json=belief_body(name, scope, **extra), headers=team.h(user)), 201)


def _recall_ids(client: TestClient, team: Team, user: str, scopes: list[str], query: str) -> list[str]:
    body = ok(client.post("/v1/recall", json={"scopes": scopes, "query": query}, headers=team.h(user)))
    return list(body["injected_ids"])


def test_create_get_and_owner_from_credentials(client: TestClient, team: Team) -> None:
    created = _create(client, team, "alice", "redis_cache", id="b-redis")
    assert (created["id"], created["tenant_id"], created["owner_id"]) == ("b-redis", team.tenant, "alice")
    assert ok(client.get("/v1/beliefs/b-redis", headers=team.h("alice")))["content"] == "Content of redis_cache."
    again = client.post("/v1/beliefs", json=belief_body("redis_cache", id="b-redis"), headers=team.h("alice"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    smuggled = client.post("/v1/beliefs", json={**belief_body("x"), "owner_id": "bob"}, headers=team.h("alice"))
    assert smuggled.status_code == 422  # the owner is never taken from the body


def test_import_paper_seed_json_and_jsonl_keeps_ids(client: TestClient, team: Team) -> None:
    seed = paper_case_set().beliefs
    mine = [r for r in seed if r["user_id"] == "alice" or r["user_id"] == "test-user"]
    records = [{**r, "user_id": "alice"} for r in mine]
    report = ok(client.post("/v1/beliefs/import", json=records[:10], headers=team.h("alice")))
    assert report["imported"] == [r["_id"] for r in records[:10]] and report["failed"] == {}
    jsonl = "\n".join(json.dumps(r) for r in records[8:]) + "\n"
    report = ok(
        client.post(
            "/v1/beliefs/import", content=jsonl, headers={**team.h("alice"), "Content-Type": "application/x-ndjson"}
        )
    )
    assert sorted(report["imported"]) == sorted(r["_id"] for r in records[10:])
    assert set(report["failed"]) == {records[8]["_id"], records[9]["_id"]}  # already there: only those fail
    assert ok(client.get(f"/v1/beliefs/{records[0]['_id']}", headers=team.h("alice")))["owner_id"] == "alice"


def test_import_for_another_user_needs_admin(client: TestClient, team: Team) -> None:
    record = {**belief_body("bobs_pref"), "_id": "b-bob", "user_id": "bob"}
    denied = client.post("/v1/beliefs/import", json=[record], headers=team.h("alice"))
    assert denied.status_code == 403
    assert ok(client.post("/v1/beliefs/import", json=[record], headers=team.h("carol")))["imported"] == ["b-bob"]
    assert ok(client.get("/v1/beliefs/b-bob", headers=team.h("bob")))["owner_id"] == "bob"


def test_import_rejects_bad_records_with_their_position(client: TestClient, team: Team) -> None:
    bad = [
        belief_body("fine") | {"_id": "b-fine"},
        {"type": "preference", "content": "no name", "scope": ["domain:code"]},
    ]
    response = client.post("/v1/beliefs/import", json=bad, headers=team.h("alice"))
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["loc"][:2] == ["body", 1]
    assert client.get("/v1/beliefs/b-fine", headers=team.h("alice")).status_code == 404  # all or nothing
    broken = client.post(
        "/v1/beliefs/import", content="{nope\n", headers={**team.h("alice"), "Content-Type": "application/x-ndjson"}
    )
    assert broken.status_code == 422 and "line 1" in broken.json()["error"]["message"]


def test_list_filters_and_cursor_pagination(client: TestClient, team: Team) -> None:
    for i in range(7):
        _create(client, team, "alice", f"topic_{i}", id=f"b-t{i}", pinned=i % 2 == 0)
    _create(client, team, "alice", "pay_rule", "project:pay", id="b-pay", type="decision")
    _create(client, team, "alice", "open_thing", id="b-q", type="open_question")
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3, "type": "preference"}
        if cursor:
            params["cursor"] = cursor
        page = ok(client.get("/v1/beliefs", params=params, headers=team.h("alice")))
        seen += [b["id"] for b in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [f"b-t{i}" for i in range(7)]
    pinned = ok(client.get("/v1/beliefs", params={"pinned": "true", "type": "preference"}, headers=team.h("alice")))
    assert [b["id"] for b in pinned["items"]] == ["b-t0", "b-t2", "b-t4", "b-t6"]
    scoped = ok(client.get("/v1/beliefs", params={"scope": "project:pay"}, headers=team.h("bob")))
    assert [b["id"] for b in scoped["items"]] == ["b-pay"]
    text = ok(client.get("/v1/beliefs", params={"q": "topic 3"}, headers=team.h("alice")))
    assert "b-t3" in [b["id"] for b in text["items"]]
    bad = client.get("/v1/beliefs", params={"cursor": "not-a-cursor"}, headers=team.h("alice"))
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"
    bad_scope = client.get("/v1/beliefs", params={"scope": "Not A Scope"}, headers=team.h("alice"))
    assert bad_scope.status_code == 422


def test_supersede_carries_counter_signal_aliases(client: TestClient, team: Team) -> None:
    _create(client, team, "alice", "orm_choice", id="b-orm", aliases=["mongoose"], pinned=True)
    result = ok(
        client.post(
            "/v1/beliefs/b-orm/supersede",
            json={
                "id": "b-raw",
                "canonical_name": "raw_driver",
                "content": "Use the raw MongoDB driver.",
                "aliases": ["mongodb driver"],
            },
            headers=team.h("alice"),
        ),
        201,
    )
    old, new = result["superseded"], result["current"]
    assert (old["epistemic_status"], old["superseded_by"]) == ("superseded", "b-raw")
    assert new["supersedes"] == "b-orm" and new["pinned"] is True and new["scope"] == ["domain:code"]
    assert {"mongoose", "orm choice", "mongodb driver"} <= set(new["aliases"])
    # the old vocabulary now routes to the live replacement, never to the dead one
    assert _recall_ids(client, team, "alice", ["domain:code"], "should I use mongoose?") == ["b-raw"]
    again = client.post("/v1/beliefs/b-orm/supersede", json={"content": "x"}, headers=team.h("alice"))
    assert again.status_code == 409
    history = ok(client.get("/v1/beliefs/b-raw/history", headers=team.h("alice")))
    assert [b["id"] for b in history["chain"]] == ["b-orm", "b-raw"]
    triggers = [e["entry"]["trigger"] for e in history["change_log"]]
    assert "superseded by b-raw" in triggers and "supersedes belief b-orm" in triggers
    assert ok(client.get("/v1/beliefs/b-orm/history", headers=team.h("alice")))["chain"] == history["chain"]


def test_supersede_alias_inheritance_is_the_memory_loops(client: TestClient, team: Team) -> None:
    """One rule for the API and extraction (service/beliefs/lifecycle.py): the old name becomes a
    counter-signal alias only when the name changes, spelled as people type it."""
    _create(client, team, "alice", "queue_choice", id="b-q1", aliases=["queue choice", "broker"])
    same_name = ok(
        client.post("/v1/beliefs/b-q1/supersede", json={"id": "b-q2", "content": "SQS."}, headers=team.h("alice")), 201
    )
    assert same_name["current"]["aliases"] == ["queue choice", "broker"]  # no second slot for the name
    renamed = ok(
        client.post(
            "/v1/beliefs/b-q2/supersede",
            json={"id": "b-q3", "content": "Kafka.", "canonical_name": "event_bus"},
            headers=team.h("alice"),
        ),
        201,
    )
    assert renamed["current"]["aliases"] == ["queue choice", "broker"]  # "queue choice" already there
    assert _recall_ids(client, team, "alice", ["domain:code"], "which queue choice did we make?") == ["b-q3"]


def test_reinforce_pin_aliases_retract(client: TestClient, team: Team) -> None:
    _create(client, team, "alice", "tabs_style", id="b-tabs")
    reinforced = ok(
        client.post("/v1/beliefs/b-tabs/reinforce", json={"aliases": ["indentation"]}, headers=team.h("alice"))
    )
    assert (
        reinforced["reinforcement_count"] == 1 and "indentation" in reinforced["aliases"] and reinforced["version"] == 2
    )
    assert ok(client.post("/v1/beliefs/b-tabs/pin", headers=team.h("alice")))["pinned"] is True
    assert _recall_ids(client, team, "alice", ["domain:code"], "hello") == ["b-tabs"]  # pinned tier
    assert ok(client.post("/v1/beliefs/b-tabs/unpin", headers=team.h("alice")))["pinned"] is False
    added = ok(client.post("/v1/beliefs/b-tabs/aliases", json={"aliases": ["Whitespace "]}, headers=team.h("alice")))
    assert "whitespace" in added["aliases"]
    assert _recall_ids(client, team, "alice", ["domain:code"], "whitespace rules?") == ["b-tabs"]
    assert ok(client.post("/v1/beliefs/b-tabs/retract", json={"reason": "wrong"}, headers=team.h("alice")))[
        "retracted_at"
    ]
    assert _recall_ids(client, team, "alice", ["domain:code"], "whitespace rules?") == []
    assert client.post("/v1/beliefs/b-tabs/retract", headers=team.h("alice")).status_code == 409
    assert client.post("/v1/beliefs/b-tabs/aliases", json={"aliases": []}, headers=team.h("alice")).status_code == 422


def test_an_alias_of_control_characters_only_is_refused_and_none_is_stored(client: TestClient, team: Team) -> None:
    """The alias routes merge into a stored belief without rebuilding the model, so a NUL alias
    was stored (and the same on reinforce) while a created belief's aliases were cleaned."""
    _create(client, team, "alice", "ctl_style", id="b-ctl")
    refused = client.post(
        "/v1/beliefs/b-ctl/aliases", json={"aliases": ["\x00", "\u202e\x1b[2J"]}, headers=team.h("alice")
    )
    assert refused.status_code == 422, refused.text
    mixed = ok(
        client.post(
            "/v1/beliefs/b-ctl/aliases", json={"aliases": ["\x00", "tab\x00s \u202eway"]}, headers=team.h("alice")
        )
    )
    reinforced = ok(client.post("/v1/beliefs/b-ctl/reinforce", json={"aliases": ["\x07"]}, headers=team.h("alice")))
    for aliases in (mixed["aliases"], reinforced["aliases"]):
        assert "tabs way" in aliases
        assert all(a and a.isprintable() for a in aliases), aliases


def test_a_colleagues_pin_does_not_carry_a_belief_into_the_owners_other_sessions(
    client: TestClient, team: Team, other_team: Team
) -> None:
    """The paper's one exception to scope walls: the *owner's* user-edited pinned beliefs surface in
    all of the owner's sessions. A pin counted as the user's edit whoever pinned: bob's pin of
    alice's project belief marked it her edit. (A colleague cannot pin one that also carries her
    personal scope at all: the next test.) Her own pin still counts, in every tenant."""
    for each in (team, other_team):
        body = belief_body("ledger_rules", "project:pay", id="b-ledger")
        ok(client.post("/v1/beliefs", json=body, headers=each.h("alice")), 201)
    pinned = ok(client.post("/v1/beliefs/b-ledger/pin", headers=team.h("bob")))
    assert _recall_ids(client, team, "bob", ["project:pay"], "hello") == ["b-ledger"]  # his project's pin
    assert _recall_ids(client, team, "alice", ["project:pay"], "hello") == ["b-ledger"]
    assert pinned["pinned"] is True and pinned["user_edited"] is False
    assert ok(client.post("/v1/beliefs/b-ledger/pin", headers=other_team.h("alice")))["user_edited"] is True
    assert _recall_ids(client, other_team, "bob", ["domain:writing"], "hello") == []


CHANGES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "pin": ("pin", None),
    "unpin": ("unpin", None),
    "reinforce": ("reinforce", {"aliases": ["ledger"]}),
    "aliases": ("aliases", {"aliases": ["ledger"]}),
    "remove aliases": ("aliases/remove", {"aliases": ["ledger rules"]}),
    "retract": ("retract", {"reason": "not ours"}),
    "supersede": ("supersede", {"content": "Ledger entries are append-only.", "reason": "changed"}),
}


def test_a_colleague_cannot_change_a_belief_beyond_their_own_grants_or_into_the_owners_sessions(
    client: TestClient, team: Team, other_team: Team
) -> None:
    """Bob sees alice's belief through project pay, but it also lives in team core (no grant of his)
    or in her personal domain:code: any change of his (a pin, aliases, a retraction) would reach
    those sessions. Only supersede used to check grants, and not the owner's personal scopes."""
    for each in (team, other_team):
        for belief_id, scope in (("b-core", "team:core"), ("b-mine", "domain:code"), ("b-pay", None)):
            body = belief_body("ledger_rules", "project:pay", id=belief_id)
            scopes = ["project:pay", scope] if scope else ["project:pay"]
            ok(client.post("/v1/beliefs", json={**body, "scope": scopes}, headers=each.h("alice")), 201)
    for label, (path, payload) in CHANGES.items():
        for belief_id, said in (("b-core", "team:core"), ("b-mine", "alice's personal scope")):
            refused = client.post(f"/v1/beliefs/{belief_id}/{path}", json=payload, headers=team.h("bob"))
            assert refused.status_code == 403, (label, belief_id, refused.text)
            assert said in refused.json()["error"]["message"], (label, refused.text)
    assert ok(client.get("/v1/beliefs/b-mine", headers=team.h("alice")))["version"] == 1  # nothing changed
    assert ok(client.get("/v1/beliefs/b-core", headers=team.h("alice")))["version"] == 1
    # what bob may change: a belief of his project alone; and alice changes her own
    ok(client.post("/v1/beliefs/b-pay/aliases", json={"aliases": ["ledger"]}, headers=team.h("bob")))
    ok(client.post("/v1/beliefs/b-mine/retract", json={"reason": "mine"}, headers=team.h("alice")))
    # the other tenant's bob is refused the same, and its beliefs are untouched by this one's
    assert client.post("/v1/beliefs/b-mine/pin", headers=other_team.h("bob")).status_code == 403
    assert ok(client.get("/v1/beliefs/b-mine", headers=other_team.h("alice")))["retracted_at"] is None


def test_resolve_open_question(client: TestClient, team: Team) -> None:
    _create(client, team, "alice", "which_queue", id="b-q", type="open_question", pinned=True)
    _create(client, team, "alice", "use_celery", id="b-a", type="decision")
    assert _recall_ids(client, team, "alice", ["domain:code"], "anything") == ["b-q"]
    resolved = ok(
        client.post("/v1/beliefs/b-q/resolve", json={"resolved_by": "b-a", "note": "decided"}, headers=team.h("alice"))
    )
    assert resolved["resolved_at"] is not None
    assert _recall_ids(client, team, "alice", ["domain:code"], "anything") == []
    assert client.post("/v1/beliefs/b-q/resolve", headers=team.h("alice")).status_code == 409
    assert client.post("/v1/beliefs/b-a/resolve", headers=team.h("alice")).status_code == 422  # not a question


def test_export_jsonl_round_trips(client: TestClient, team: Team, other_team: Team) -> None:
    _create(client, team, "alice", "one", id="b-1")
    _create(client, team, "alice", "two", "project:pay", id="b-2")
    _create(client, team, "bob", "bobs", id="b-3")
    response = client.get("/v1/beliefs/export", headers=team.h("alice"))
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in response.text.splitlines()]
    assert [r["id"] for r in rows] == ["b-1", "b-2"]  # not bob's personal belief
    whole = client.get("/v1/beliefs/export", params={"all": "true"}, headers=team.h("carol"))
    assert sorted(json.loads(x)["id"] for x in whole.text.splitlines()) == ["b-1", "b-2", "b-3"]
    assert client.get("/v1/beliefs/export", params={"all": "true"}, headers=team.h("alice")).status_code == 403
    # the export is an import format: it loads into another tenant unchanged
    ok(
        client.post(
            "/v1/beliefs/import",
            content=response.text,
            headers={**other_team.h("alice"), "Content-Type": "application/x-ndjson"},
        )
    )
    assert ok(client.get("/v1/beliefs/b-2", headers=other_team.h("bob")))["tenant_id"] == other_team.tenant


def test_erase_removes_versions_audit_payloads_and_renderings(
    client: TestClient, team: Team, services: Services
) -> None:
    _create(client, team, "alice", "secret_thing", id="b-s1", aliases=["codename"])
    ok(
        client.post(
            "/v1/beliefs/b-s1/supersede", json={"id": "b-s2", "content": "Second version."}, headers=team.h("alice")
        ),
        201,
    )
    ok(client.post("/v1/recall", json={"scopes": ["domain:code"], "query": "codename?"}, headers=team.h("alice")))
    services.redis.set(services.render_cache.prefix(team.tenant) + "session-1", "rendered block mentioning b-s2")
    # the recall shared the tenant's vocabulary (which holds the alias) under the same prefix
    shared_vocabulary = redis_keys.shared_vocabulary(services.store.namespace, team.tenant)
    assert services.redis.exists(shared_vocabulary)
    assert client.delete("/v1/beliefs/b-s2", headers=team.h("alice")).status_code == 403  # members may not
    receipt = ok(client.delete("/v1/beliefs/b-s2", headers=team.h("carol")))
    assert sorted(receipt["belief_versions_removed"]) == ["b-s1", "b-s2"]
    assert receipt["audit_payload_copies_removed"] >= 3  # create, supersede (old), create (new)
    assert receipt["cached_renderings_removed"] == 2  # the rendering and the shared vocabulary
    assert not services.redis.exists(shared_vocabulary)
    for belief_id in ("b-s1", "b-s2"):
        assert client.get(f"/v1/beliefs/{belief_id}", headers=team.h("alice")).status_code == 404
    services.audit.refresh()
    events = ok(client.get("/v1/admin/audit", params={"belief_id": "b-s1"}, headers=team.h("carol")))["items"]
    assert events and all("before" not in e or e["before"] is None for e in events)
    assert all(e.get("after") is None for e in events if e["action"] != "belief.erase")
    assert any(e["action"] == "belief.erase" for e in events)
    assert "Second version" not in json.dumps(events)
    assert client.delete("/v1/beliefs/b-s2", headers=team.h("carol")).status_code == 404


def test_concurrent_writers_never_lose_updates(client: TestClient, team: Team) -> None:
    """Optimistic concurrency: every reinforce that reports success is counted, none is lost."""
    from concurrent.futures import ThreadPoolExecutor

    _create(client, team, "alice", "hot_belief", "project:pay", id="b-hot")

    def reinforce(user: str) -> int:
        return client.post("/v1/beliefs/b-hot/reinforce", json={}, headers=team.h(user)).status_code

    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = list(pool.map(reinforce, ["alice", "bob", "carol"] * 3))
    assert set(statuses) <= {200, 409}
    final = ok(client.get("/v1/beliefs/b-hot", headers=team.h("bob")))
    assert final["reinforcement_count"] == statuses.count(200) >= 1
    assert final["version"] == 1 + statuses.count(200)


def test_import_accepts_a_wrapped_list_and_rejects_other_shapes(client: TestClient, team: Team) -> None:
    wrapped = {"beliefs": [{**belief_body("wrapped"), "_id": "b-wrapped"}]}
    assert ok(client.post("/v1/beliefs/import", json=wrapped, headers=team.h("alice")))["imported"] == ["b-wrapped"]
    for bad in ({"nope": 1}, "text", 3):
        response = client.post("/v1/beliefs/import", json=bad, headers=team.h("alice"))
        assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error"
    deep = "[" * 100_000 + "]" * 100_000
    for content_type in ("application/json", "application/x-ndjson"):
        response = client.post(
            "/v1/beliefs/import", content=deep, headers={**team.h("alice"), "Content-Type": content_type}
        )
        assert response.status_code == 422, response.text
    too_many = [{**belief_body(f"n_{i}"), "_id": f"b-n{i}"} for i in range(3)]
    assert client.post("/v1/beliefs/import", json=[*too_many, 5], headers=team.h("alice")).status_code == 422


def test_a_long_message_keeps_the_whole_word_at_its_cut(client: TestClient, team: Team, other_team: Team) -> None:
    """A message is clamped to 1,000 characters, front-biased, back to the last space. When the
    1,000th character ended a word, that whole word was dropped with the part after it: a belief
    named there was not recalled, though the word lay entirely within the clamp."""
    for each in (team, other_team):
        _create(client, each, "alice", "kubernetes_cluster", id="b-k8s", aliases=["kubernetes"])
    message = "lorem " * 165 + "kubernetes" + " and then some more words after the cut" * 3
    assert len("lorem " * 165 + "kubernetes") == 1000
    assert _recall_ids(client, team, "alice", ["domain:code"], message) == ["b-k8s"]
    assert _recall_ids(client, team, "bob", ["domain:code"], message) == []  # alice's personal belief
    cut = ok(client.post("/v1/recall", json={"scopes": ["domain:code"], "query": message}, headers=team.h("alice")))
    assert cut["query"].endswith(" kubernetes") and len(cut["query"]) == 1000
