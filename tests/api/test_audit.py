"""The audit trail: every write with before/after, every recall as an injection receipt, queried by
admins of the tenant only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.domain.audit import matching_actions
from service.storage.audit import AuditEvent
from service.storage.templates import AUDIT
from tests.api.conftest import Team, auth, belief_body, ok


def _audit(client: TestClient, team: Team, services: Services, **params: Any) -> list[dict[str, Any]]:
    services.audit.refresh()
    return list(ok(client.get("/v1/admin/audit", params=params, headers=team.h("carol")))["items"])


def test_writes_are_recorded_with_before_after_and_request_id(
    client: TestClient, team: Team, services: Services
) -> None:
    created = client.post(
        "/v1/beliefs",
        json=belief_body("audited", id="b-au"),
        headers={**team.h("alice"), "X-Request-ID": "req-create-1"},
    )
    assert created.status_code == 201 and created.headers["X-Request-ID"] == "req-create-1"
    ok(client.post("/v1/beliefs/b-au/pin", headers={**team.h("alice"), "X-Tenure-Session": "sess-9"}))
    events = _audit(client, team, services, belief_id="b-au")
    assert [e["action"] for e in events] == ["belief.pin", "belief.create"]  # newest first
    pin, create = events
    assert create["request_id"] == "req-create-1" and create["actor_id"] == "alice" and create["before"] is None
    assert create["after"]["id"] == "b-au" and create["actor_kind"] == "api_key"
    assert pin["before"]["pinned"] is False and pin["after"]["pinned"] is True and pin["session_id"] == "sess-9"
    assert pin["credential_id"] == team.keys["alice"].split("_")[1]


def test_recall_writes_an_injection_receipt(client: TestClient, team: Team, services: Services) -> None:
    ok(client.post("/v1/beliefs", json=belief_body("kafka_topics", id="b-k"), headers=team.h("alice")), 201)
    result = ok(
        client.post(
            "/v1/recall",
            json={"scopes": ["domain:code"], "query": "kafka topics?", "session_id": "s-42"},
            headers=team.h("alice"),
        )
    )
    receipts = _audit(client, team, services, session_id="s-42", action="recall")
    assert len(receipts) == 1
    receipt = receipts[0]
    assert receipt["event_id"] == result["receipt_id"] and receipt["belief_ids"] == ["b-k"]
    assert receipt["scopes"] == ["domain:code"] and receipt["actor_id"] == "alice"
    assert receipt["injected"] == [{"id": "b-k", "tier": "relevant", "score": result["tiers"]["relevant"][0]["score"]}]
    # "which beliefs were injected into that session?" and "who saw this belief?"
    assert _audit(client, team, services, belief_id="b-k", action="recall")[0]["session_id"] == "s-42"


def test_filters_time_range_and_pagination(client: TestClient, team: Team, services: Services) -> None:
    start = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(5):
        ok(client.post("/v1/beliefs", json=belief_body(f"page_{i}", id=f"b-p{i}"), headers=team.h("bob")), 201)
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"actor_id": "bob", "action": "belief.create", "limit": 2, "since": start.isoformat()}
        if cursor:
            params["cursor"] = cursor
        services.audit.refresh()
        page = ok(client.get("/v1/admin/audit", params=params, headers=team.h("carol")))
        seen += [e["belief_ids"][0] for e in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [f"b-p{i}" for i in reversed(range(5))]
    assert _audit(client, team, services, actor_id="bob", until=start.isoformat()) == []
    bad = client.get("/v1/admin/audit", params={"since": "yesterday"}, headers=team.h("carol"))
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == ["query", "since"]


def test_provisioning_is_audited_and_operators_may_read_any_tenant(
    client: TestClient, team: Team, services: Services, operator: dict[str, str]
) -> None:
    services.audit.refresh()
    events = ok(
        client.get("/v1/admin/audit", params={"tenant_id": team.tenant, "action": "key.issue"}, headers=operator)
    )["items"]
    assert sorted(e["details"]["user_id"] for e in events) == ["alice", "bob", "carol"]
    assert client.get("/v1/admin/audit", headers=team.h("bob")).status_code == 403


def test_import_records_one_event_per_belief_with_payload(client: TestClient, team: Team, services: Services) -> None:
    records = [{**belief_body(f"imp_{i}"), "_id": f"b-imp{i}"} for i in range(3)]
    ok(client.post("/v1/beliefs/import", json=records, headers=team.h("alice")))
    events = _audit(client, team, services, action="belief.import")
    assert sorted(e["belief_ids"][0] for e in events) == ["b-imp0", "b-imp1", "b-imp2"]
    assert all(e["after"]["content"].startswith("Content of imp_") and e["before"] is None for e in events)


def test_filters_match_the_names_written_before_the_vocabulary_was_unified(
    client: TestClient, team: Team, services: Services
) -> None:
    """The memory loop used to write ``belief.created``, ``belief.superseded``... for the actions
    the API calls ``belief.create``, ``belief.supersede``: a filter on either spelling finds both."""
    ok(client.post("/v1/beliefs", json=belief_body("vocab_new", id="b-vocab"), headers=team.h("alice")), 201)
    legacy = AuditEvent(
        tenant_id=team.tenant, action="belief.created", actor_id="alice", actor_kind="worker", belief_ids=["b-vocab"]
    )
    services.audit.append(legacy)
    for spelling in ("belief.create", "belief.created"):
        found = _audit(client, team, services, belief_id="b-vocab", action=spelling)
        assert sorted(e["action"] for e in found) == ["belief.create", "belief.created"], spelling
    assert _audit(client, team, services, belief_id="b-vocab", action="belief.reinforced") == []
    assert matching_actions("review.conflict_filed") == ["review.file_conflict", "review.conflict_filed"]
    assert matching_actions("no.such_action") == ["no.such_action"]


@contextmanager
def _audit_writes_blocked(services: Services) -> Iterator[None]:
    """The audit index refuses writes (a write block, as the disk flood stage sets), the accounts
    index still takes them: an account change lands, its audit event does not."""
    alias = AUDIT.alias(services.settings.opensearch_namespace)
    services.opensearch.indices.put_settings(index=alias, body={"index.blocks.write": True})
    try:
        yield
    finally:
        services.opensearch.indices.put_settings(index=alias, body={"index.blocks.write": None})


def test_an_account_change_whose_audit_write_failed_is_still_audited(
    client: TestClient, team: Team, services: Services
) -> None:
    """A revoke (or a disable) stored before its audit event could be written answered 503; the
    client's retry found the change made ("already so: nothing to audit") and answered 200, so
    the change was never in the audit trail. The event is kept in the audit outbox then, and
    reaches the trail with the next drain."""
    key_id = team.keys["bob"].split("_")[1]
    changes = [
        ("DELETE", f"/v1/admin/keys/{key_id}", "key.revoke"),
        ("POST", f"/v1/admin/tenants/{team.tenant}/users/alice/disable", "user.disable"),
    ]
    with _audit_writes_blocked(services):
        first = [client.request(method, url, headers=team.h("carol")) for method, url, _ in changes]
    for (method, url, _), answer in zip(changes, first, strict=True):
        if answer.status_code == 503:  # what a client does with a 503: send it again
            ok(client.request(method, url, headers=team.h("carol")))
        else:
            ok(answer)
    events = _audit(client, team, services, actor_id="carol")
    assert [e["details"].get("key_id") for e in events if e["action"] == "key.revoke"] == [key_id]
    assert [e["details"]["user_id"] for e in events if e["action"] == "user.disable"] == ["alice"]


def test_an_import_whose_audit_write_failed_is_still_audited(
    client: TestClient, team: Team, services: Services
) -> None:
    """The beliefs of an import were stored, then the audit index refused their events: the 503
    made the client send the import again, which found every id taken (``failed``: conflict) and
    recorded nothing, so the import never reached the audit trail. Likewise a single create."""
    records = [{**belief_body(f"late_{i}"), "_id": f"b-late{i}"} for i in range(2)]
    with _audit_writes_blocked(services):
        imported = client.post("/v1/beliefs/import", json=records, headers=team.h("alice"))
        created = client.post("/v1/beliefs", json=belief_body("late_one", id="b-late-one"), headers=team.h("alice"))
    if imported.status_code == 503:
        ok(client.post("/v1/beliefs/import", json=records, headers=team.h("alice")))
    else:
        assert ok(imported)["imported"] == ["b-late0", "b-late1"]
    assert created.status_code in (201, 503), created.text
    events = _audit(client, team, services, actor_id="alice")
    assert sorted(e["belief_ids"][0] for e in events if e["action"] == "belief.import") == ["b-late0", "b-late1"]
    assert [e["belief_ids"] for e in events if e["action"] == "belief.create"] == [["b-late-one"]]


def test_an_import_the_audit_outbox_cannot_hold_whole_queues_none_of_its_events(
    client: TestClient, team: Team, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit index refused an import's events and the outbox had room for only some: those
    were queued one by one until the first refused, then the import answered 503, so the trail
    later showed part of an import the client was told had failed (and its resend, finding every
    id taken, recorded the rest never). An import's events are queued all together or not at all."""
    outbox = services.beliefs.lifecycle.audit_outbox
    assert outbox is not None
    monkeypatch.setattr(outbox, "max_pending", outbox.pending() + 2)  # room for two of three
    records = [{**belief_body(f"cramped_{i}"), "_id": f"b-cramped{i}"} for i in range(3)]
    with _audit_writes_blocked(services):
        imported = client.post("/v1/beliefs/import", json=records, headers=team.h("alice"))
        assert imported.status_code == 503, imported.text
        assert outbox.pending() == outbox.max_pending - 2  # nothing of the import waits
        # two events fit whole: an import of two is queued and answered as done
        pair = [{**belief_body(f"roomy_{i}"), "_id": f"b-roomy{i}"} for i in range(2)]
        assert ok(client.post("/v1/beliefs/import", json=pair, headers=team.h("alice")))["imported"] == [
            "b-roomy0",
            "b-roomy1",
        ]
    events = _audit(client, team, services, actor_id="alice", action="belief.import")
    assert sorted(e["belief_ids"][0] for e in events) == ["b-roomy0", "b-roomy1"]


def test_a_development_token_is_traceable_from_its_issue_to_its_use_and_revocation(
    client: TestClient, team: Team, services: Services
) -> None:
    """Requests made with a token are audited under its jti (``credential_id``), and its revocation
    names the jti; its issue did not, so no admin could tell who issued the token behind a request."""
    issued = ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/tokens", json={}, headers=team.h("carol")), 201)
    token = issued["token"]
    ok(client.post("/v1/beliefs", json=belief_body("traced", id="b-traced"), headers=auth(token)), 201)
    jti = ok(client.post("/v1/admin/tokens/revoke", json={"token": token}, headers=team.h("carol")))["jti"]
    used = _audit(client, team, services, belief_id="b-traced")
    assert [e["credential_id"] for e in used] == [jti]
    issue = _audit(client, team, services, action="token.issue")
    assert [(e["details"]["user_id"], e["details"].get("jti")) for e in issue] == [("bob", jti)]


def test_a_grants_change_that_changes_nothing_records_nothing(
    client: TestClient, team: Team, services: Services
) -> None:
    """As disabling what is disabled: a PATCH that grants what the user holds (a reconciling
    script, ``tenure grant`` run twice) rewrote the user record and recorded a grants.update
    whose before and after were the same."""
    url = f"/v1/admin/tenants/{team.tenant}/users/bob/grants"
    before = ok(client.get(f"/v1/admin/tenants/{team.tenant}/users/bob", headers=team.h("carol")))
    for patch in ({}, {"add_projects": ["pay"]}, {"remove_teams": ["core"]}, {"add_roles": ["member"]}):
        assert ok(client.patch(url, json=patch, headers=team.h("carol"))) == before
    assert _audit(client, team, services, action="grants.update") == []
    ok(client.patch(url, json={"add_teams": ["core"]}, headers=team.h("carol")))
    changed = _audit(client, team, services, action="grants.update")
    assert [(e["details"]["before"]["teams"], e["details"]["after"]["teams"]) for e in changed] == [([], ["core"])]
