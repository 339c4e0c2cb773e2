"""Issue 10 finding 1 beyond beliefs: a stored turn, review item or audit event the model cannot load
never takes a read down. The documents are written straight into the real indices (as an older
version, a hand edit or a restore could leave them), next to good ones, and every read goes over
HTTP to the API served by a real uvicorn process: a member's and an admin's turn reads, both review
listings and the resolve call, the audit trail page by page, and the console pages that read them.
Each bad record is skipped (logged once with its id), listed by kind in the admin quarantine with
a reason, and erased by id without loading it; another tenant's admin sees and reaches none of it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opensearchpy import OpenSearch

from deploy.localstack import LocalStack, wait_until
from service.domain.belief import Belief
from service.storage.audit import AuditEvent
from service.storage.client import routed_id
from service.storage.reviews import ReviewItem
from service.storage.templates import AUDIT, REVIEWS, TURNS
from service.storage.turns import TurnRecord
from tests.api.conftest import Team, auth, make_team, ok
from tests.security.conftest import store_as_is

LOGIN_RE = re.compile(r'name="login_csrf" value="([^"]+)"')


@dataclass
class Planted:
    team: Team
    other: Team
    good_turn: str
    good_review: str


@pytest.fixture(scope="module")
def http(served_api: LocalStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served_api.api_url, timeout=60) as client:
        yield client


def _index(os_client: OpenSearch, alias: str, doc_id: str, tenant: str, source: dict[str, Any]) -> None:
    os_client.index(index=alias, id=doc_id, routing=tenant, body=source, refresh=True)


@pytest.fixture(scope="module")
def planted(served_api: LocalStack, http: httpx.Client, os_client: OpenSearch) -> Planted:
    ns = served_api.config.namespace
    operator = auth(served_api.operator_key())
    team, other = make_team(http, operator), make_team(http, operator)  # type: ignore[arg-type]
    t = team.tenant
    turn = {"model": "gpt-4o", "scope": ["domain:code"], "user_message": "hi", "assistant_message": "Noted."}
    good_turn = ok(http.post("/v1/turns", json=turn, headers=team.h("alice")), 202)["turn_id"]
    # a turn stored with a status this version does not know and a single id where a list belongs
    bad_turn = TurnRecord(tenant_id=t, turn_id="turn-poison", owner_id="alice", session_id="s", scope=["domain:code"])
    source = {**bad_turn.model_dump(mode="json"), "extraction_status": "exploded", "injected_ids": "b-x"}
    _index(os_client, TURNS.alias(ns), routed_id(t, "turn-poison"), t, source)
    # a belief stored with empty content, which the good review item and audit event below name
    belief = Belief(
        id="b-poison", tenant_id=t, owner_id="alice", type="decision", canonical_name="ledger", content="x",
        scope=["domain:code"],
    )  # fmt: skip
    store_as_is(os_client, ns, belief, content="")
    # review items: one good (about the unloadable belief), one of a kind that does not exist
    for review_id, damage in (("rv-good", {}), ("rv-poison", {"kind": "bogus"})):
        item = ReviewItem(
            tenant_id=t, review_id=review_id, kind="conflict", owner_id="alice", scope=["domain:code"],
            belief_id="b-poison",
        )  # fmt: skip
        _index(os_client, REVIEWS.alias(ns), routed_id(t, review_id), t, {**item.model_dump(mode="json"), **damage})
    # audit events: one good (naming the unloadable belief), one without its actor kind and with
    # one belief id where a list belongs
    for event_id in ("ev-good", "ev-poison"):
        event = AuditEvent(
            event_id=event_id, tenant_id=t, action="belief.create", actor_id="alice", actor_kind="user",
            belief_ids=["b-poison"],
        )  # fmt: skip
        source = event.model_dump(mode="json", exclude_none=True)
        if event_id == "ev-poison":
            source = {k: v for k, v in source.items() if k != "actor_kind"} | {"belief_ids": "b-x"}
        _index(os_client, AUDIT.alias(ns), event_id, t, source)
    return Planted(team=team, other=other, good_turn=good_turn, good_review="rv-good")


def _quarantine(http: httpx.Client, team: Team, kind: str, user: str = "carol") -> list[str]:
    page = ok(http.get("/v1/admin/quarantine", params={"kind": kind}, headers=team.h(user)))
    assert page["kind"] == kind
    return [item["record_id"] for item in page["items"]]


def _sign_in(served_api: LocalStack, credential: str) -> httpx.Client:
    web = httpx.Client(base_url=served_api.api_url, timeout=60, follow_redirects=False)
    token = LOGIN_RE.search(web.get("/console/login").text)
    assert token
    done = web.post("/console/login", data={"credential": credential, "login_csrf": token.group(1), "next": ""})
    assert done.status_code == 303, done.text
    return web


def test_turn_reads_never_fail_on_a_stored_turn_they_cannot_load(http: httpx.Client, planted: Planted) -> None:
    team = planted.team
    assert ok(http.get(f"/v1/turns/{planted.good_turn}", headers=team.h("alice")))["turn_id"] == planted.good_turn
    for user in ("alice", "carol"):  # the owner and the tenant's admin
        refused = http.get("/v1/turns/turn-poison", headers=team.h(user))
        assert refused.status_code == 409, refused.text
        # the message names the record and where an admin erases it
        assert "/v1/admin/quarantine/turn/turn-poison" in refused.json()["error"]["message"]
    # a client retrying a post under the poisoned turn's id gets the same answer, not a 5xx
    again = {"turn_id": "turn-poison", "model": "gpt-4o", "user_message": "hi", "assistant_message": "Noted."}
    assert http.post("/v1/turns", json=again, headers=team.h("alice")).status_code == 409
    assert http.get("/v1/turns/turn-poison", headers=planted.other.h("carol")).status_code == 404


def test_review_and_audit_reads_skip_what_they_cannot_load(
    http: httpx.Client, planted: Planted, served_api: LocalStack
) -> None:
    team = planted.team
    for path, user in (("/v1/reviews", "alice"), ("/v1/admin/reviews", "carol")):
        items = ok(http.get(path, params={"kind": "conflict"}, headers=team.h(user)))
        assert [i["review_id"] for i in items] == [planted.good_review]
        assert [i["review_id"] for i in ok(http.get(path, headers=team.h(user)))] == [planted.good_review]
    resolve = http.post("/v1/admin/reviews/rv-poison/resolve", json={"action": "dismiss"}, headers=team.h("carol"))
    assert resolve.status_code == 409, resolve.text
    assert "/v1/admin/quarantine/review/rv-poison" in resolve.json()["error"]["message"]
    belief = http.get("/v1/beliefs/b-poison", headers=team.h("alice"))  # beliefs have their own erase route
    assert belief.status_code == 409 and "/v1/admin/quarantine/b-poison" in belief.json()["error"]["message"]
    page = ok(http.get("/v1/admin/audit", headers=team.h("carol")))
    assert "ev-poison" not in [e["event_id"] for e in page["items"]] and page["quarantined"] == 1
    # page by page, one event at a time: the cursor walks past the bad one
    seen, cursor, skipped = [], None, 0
    while True:
        params = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        one = ok(http.get("/v1/admin/audit", params=params, headers=team.h("carol")))
        seen += [e["event_id"] for e in one["items"]]
        skipped += one["quarantined"]
        cursor = one["next_cursor"]
        if cursor is None:
            break
    assert skipped == 1 and "ev-poison" not in seen and len(seen) == len(page["items"])
    # the console's pages over the same records
    web = _sign_in(served_api, team.keys["carol"])
    for path in ("/console/reviews", "/console/audit", "/console/audit/export.jsonl", "/console/audit/export.csv"):
        shown = web.get(path)
        assert shown.status_code == 200, (path, shown.text[:300])
        assert "rv-poison" not in shown.text and "ev-poison" not in shown.text
    assert web.get("/console/audit/ev-poison").status_code == 404
    assert web.get("/console/audit/ev-good").status_code == 200  # names a belief that cannot be loaded
    web.close()
    # each bad record logged once, with its id, however often it was met
    log = (served_api.logs / "api.log").read_text()
    for kind, record_id in (("turn", "turn-poison"), ("review", "rv-poison"), ("audit_event", "ev-poison")):
        assert log.count(f"quarantined {kind} {record_id} ") == 1, (kind, record_id)


def test_admin_lists_and_erases_quarantined_records_by_id(http: httpx.Client, planted: Planted) -> None:
    team, other = planted.team, planted.other
    expected = {"turn": "turn-poison", "review": "rv-poison", "audit_event": "ev-poison"}
    assert http.get("/v1/admin/quarantine", params={"kind": "turn"}, headers=team.h("alice")).status_code == 403
    for kind, record_id in expected.items():
        assert _quarantine(http, team, kind) == [record_id]
        assert _quarantine(http, other, kind) == []  # another tenant's admin sees none of it
        assert http.delete(f"/v1/admin/quarantine/{kind}/{record_id}", headers=other.h("carol")).status_code == 404
        assert http.delete(f"/v1/admin/quarantine/{kind}/{record_id}", headers=team.h("alice")).status_code == 403
    listed = ok(http.get("/v1/admin/quarantine", params={"kind": "review"}, headers=team.h("carol")))["items"][0]
    assert listed["owner_id"] == "alice" and "kind" in listed["reason"] and listed["belief_id"] is None
    # records that load are not the quarantine's to erase
    assert http.delete(f"/v1/admin/quarantine/turn/{planted.good_turn}", headers=team.h("carol")).status_code == 409
    assert http.delete("/v1/admin/quarantine/review/rv-good", headers=team.h("carol")).status_code == 409
    for kind, record_id in expected.items():
        erased = ok(http.delete(f"/v1/admin/quarantine/{kind}/{record_id}", headers=team.h("carol")))
        assert erased["kind"] == kind and erased["record_id"] == record_id
        assert _quarantine(http, team, kind) == []
        assert http.delete(f"/v1/admin/quarantine/{kind}/{record_id}", headers=team.h("carol")).status_code == 404
    assert http.get("/v1/turns/turn-poison", headers=team.h("alice")).status_code == 404
    assert ok(http.get("/v1/admin/audit", headers=team.h("carol")))["quarantined"] == 0

    def erasures() -> list[tuple[str, str]]:
        params = {"action": "record.quarantine_erase"}
        events = ok(http.get("/v1/admin/audit", params=params, headers=team.h("carol")))["items"]
        return sorted((e["details"]["kind"], e["details"]["record_id"]) for e in events)

    # an audit read refreshes the index first: the erasures are there at once
    wait_until(lambda: erasures() == sorted(expected.items()), 15, "the three erasures in the audit trail")
