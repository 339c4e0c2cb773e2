"""Issue 10 finding 3, replayed over HTTP against the real stack: after an admin erases a belief,
its text is nowhere in the namespace. The text is spread the way normal use spreads it: the belief
and a superseding version (change log keeps the earlier content), a turn that stated it (user
message, answer, raw sidecar JSON), a recall whose query quoted it (receipt in the Redis outbox,
then the audit trail), audit payload copies. After ``DELETE /v1/beliefs/{id}?expunge=true`` a scan
of every document of every index of the namespace, and of the namespace's Redis keys, finds it zero
times; the colleague's unrelated belief and turn survive."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch, helpers

from service.api.state import Services
from service.config import Settings
from service.domain.belief import Belief
from service.errors import StoreUnavailable
from service.extraction.sidecar import BEGIN, END
from service.recall.query import clean_query
from service.storage import erasure
from service.storage.audit import AuditEvent
from service.storage.turns import TurnRecord
from service.storage.vocabulary import UNITS_FIELD
from tests.api.conftest import Team, belief_body, ok
from tests.api.test_console import csrf_of, sign_in
from tests.security.conftest import store_as_is
from workers.resources import build as build_worker_resources


def _occurrences(os_client: OpenSearch, namespace: str, text: str) -> list[str]:
    """Every document of every index of the namespace whose source holds ``text`` (as written or
    JSON-escaped)."""
    forms = {text, json.dumps(text)[1:-1]}
    found = []
    for hit in helpers.scan(os_client, index=f"{namespace}-*", query={"query": {"match_all": {}}}):
        raw = json.dumps(hit["_source"], ensure_ascii=False)
        if any(form in raw for form in forms) or text in json.dumps(hit["_source"]):
            found.append(f"{hit['_index']}/{hit['_id']}")
    return found


def _redis_occurrences(services: Services, namespace: str, text: str) -> list[str]:
    found = []
    for key in services.redis.scan_iter(match=f"{namespace}:*", count=1000):
        kind = services.redis.type(key)
        if kind == b"string":
            values = [services.redis.get(key) or b""]
        elif kind == b"stream":
            values = [
                json.dumps({k.decode(): v.decode() for k, v in fields.items()}).encode()
                for _, fields in services.redis.xrange(key)
            ]
        elif kind == b"hash":
            values = list(services.redis.hgetall(key).values())
        else:
            continue
        if any(text.encode() in v or json.dumps(text)[1:-1].encode() in v for v in values):
            found.append(key.decode())
    return found


def test_erased_text_is_found_nowhere_in_the_namespace(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings, services: Services
) -> None:
    ns = api_settings.opensearch_namespace
    secret = f'Payroll secret {uuid.uuid4().hex}: salaries leave via "bank 42" on Fridays'
    later = f"Payroll secret {uuid.uuid4().hex}: salaries now leave on Mondays"
    keeper = f"Unrelated note {uuid.uuid4().hex} that must stay"
    body = belief_body("payroll_schedule", scope="project:pay", pinned=True, content=secret)
    first = ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)["id"]
    second = ok(client.post(f"/v1/beliefs/{first}/supersede", json={"content": later}, headers=team.h("bob")), 201)[
        "current"
    ]["id"]
    kept = ok(client.post("/v1/beliefs", json=belief_body("kept_note", content=keeper), headers=team.h("alice")), 201)
    sidecar = json.dumps({"turn_signal": "substantive", "new_beliefs": [{"content": secret}]})
    turn = {
        "model": "gpt-4o",
        "user_message": f"Remember: {secret}",
        "assistant_message": f"Noted. {secret}\n\n{BEGIN}{sidecar}{END}",
        "scope": ["project:pay"],
    }
    ok(client.post("/v1/turns", json=turn, headers=team.h("bob")), 202)
    ok(
        client.post(
            "/v1/turns", json={**turn, "user_message": keeper, "assistant_message": "ok"}, headers=team.h("alice")
        ),
        202,
    )
    ok(
        client.post(
            "/v1/recall", json={"scopes": ["project:pay"], "query": f"what about {later}"}, headers=team.h("alice")
        )
    )
    assert _occurrences(os_client, ns, secret), "the text was spread before the erase"

    receipt = ok(client.delete(f"/v1/beliefs/{second}", params={"expunge": "true"}, headers=team.h("carol")))
    assert sorted(receipt["belief_versions_removed"]) == sorted([first, second])
    assert receipt["text_copies_redacted"] >= 1 and receipt["expunged"] is True

    for text in (secret, later):
        assert _occurrences(os_client, ns, text) == [], text
        assert _redis_occurrences(services, ns, text) == [], text
    # what was not erased is all still there
    assert ok(client.get(f"/v1/beliefs/{kept['id']}", headers=team.h("alice")))["content"] == keeper
    assert _occurrences(os_client, ns, keeper)
    # and the redacted turn still reads
    listed: dict[str, Any] = ok(client.get("/v1/beliefs", headers=team.h("bob")))
    assert all(b["id"] not in (first, second) for b in listed["items"])


def _unit_occurrences(os_client: OpenSearch, namespace: str, text: str) -> list[str]:
    """Every analysed unit stored in the namespace's beliefs (doc values of ``vocabulary_units``,
    which are not in ``_source``: every tenant's, live or deleted-but-unmerged documents aside)
    that holds ``text``."""
    body = {"size": 0, "aggs": {"units": {"terms": {"field": UNITS_FIELD, "size": 50_000, "execution_hint": "map"}}}}
    buckets = os_client.search(index=f"{namespace}-beliefs", body=body)["aggregations"]["units"]["buckets"]
    return [str(b["key"]) for b in buckets if text in str(b["key"])]


def test_erased_names_leave_no_vocabulary_unit(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings
) -> None:
    """A belief's names are stored once more, analysed, in its own document (recall's vocabulary):
    an erase removes them with the document, and no other document holds them."""
    ns = api_settings.opensearch_namespace
    word = f"zqsecret{uuid.uuid4().hex[:12]}"
    kept_word = f"zqkept{uuid.uuid4().hex[:12]}"
    body = belief_body("payroll_vault", scope="project:pay", aliases=[f"{word} vault"])
    first = ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)["id"]
    replaced = {"content": "moved", "aliases": [f"{word} store"]}
    superseded = ok(client.post(f"/v1/beliefs/{first}/supersede", json=replaced, headers=team.h("bob")), 201)
    second = superseded["current"]["id"]
    ok(client.post("/v1/beliefs", json=belief_body("kept_thing", aliases=[kept_word]), headers=team.h("alice")), 201)
    assert _unit_occurrences(os_client, ns, word), "the names were analysed into units before the erase"
    ok(client.delete(f"/v1/beliefs/{second}", params={"expunge": "true"}, headers=team.h("carol")))
    os_client.indices.refresh(index=f"{ns}-beliefs")
    assert _unit_occurrences(os_client, ns, word) == []
    assert _unit_occurrences(os_client, ns, kept_word)  # a colleague's belief keeps its own


@pytest.mark.parametrize("via", ["/v1/beliefs/{id}", "/v1/admin/quarantine/{id}"])
def test_erasing_a_quarantined_belief_leaves_its_text_nowhere(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings, via: str
) -> None:
    """A stored belief the model cannot load is erased by id without loading it, and its statements
    (read from the raw source) are redacted from the turns and audit events that copied them,
    like any erase."""
    ns = api_settings.opensearch_namespace
    secret = f"Quarantined secret {uuid.uuid4().hex}: the vault key rotates on Tuesdays"
    belief_id = f"b-q-{uuid.uuid4().hex[:10]}"
    good = Belief(
        id=belief_id, tenant_id=team.tenant, owner_id="bob", type="decision", canonical_name="v", content=secret,
        scope=["project:pay"],
    )  # fmt: skip
    store_as_is(os_client, ns, good, scope="project:pay")  # one scope where a list belongs
    turn = {"model": "gpt-4o", "user_message": f"Remember: {secret}", "assistant_message": "ok", "scope": []}
    ok(client.post("/v1/turns", json=turn, headers=team.h("bob")), 202)
    assert _occurrences(os_client, ns, secret), "the text was spread before the erase"
    receipt = ok(client.delete(via.format(id=belief_id), params={"expunge": "true"}, headers=team.h("carol")))
    assert receipt["belief_versions_removed"] == [belief_id]
    assert _occurrences(os_client, ns, secret) == []


def _extract(api_settings: Settings, tenant: str, turn_id: str) -> dict[str, Any]:
    """Run the turn's extraction exactly as the Celery task does (the worker's own pipeline,
    built from the same settings), in this process."""
    resources = build_worker_resources(api_settings)
    try:
        outcome = resources.pipeline.run(tenant, turn_id)
    finally:
        resources.close()
    assert outcome.status == "done", outcome
    return outcome.result


def _proposal_turn(client: TestClient, team: Team, user: str, content: str, name: str = "payments_provider") -> str:
    proposal = {
        "type": "decision",
        "canonical_name": name,
        "content": content,
        "why_it_matters": "Decides where payouts go.",
        "scope": ["project:pay"],
        "confidence": 0.75,
        "epistemic_status": "active",
        "aliases": [],
    }
    sidecar = json.dumps({"turn_signal": "substantive", "new_beliefs": [proposal]})
    turn = {
        "model": "gpt-4o",
        "user_message": "Where do payouts go now?",
        "assistant_message": f"Noted.\n\n{BEGIN}{sidecar}{END}",
        "scope": ["project:pay"],
    }
    posted: dict[str, Any] = ok(client.post("/v1/turns", json=turn, headers=team.h(user)), 202)
    assert posted["parse_status"] == "parsed"
    turn_id: str = posted["turn_id"]
    return turn_id


def test_erased_text_in_review_proposals_is_removed_with_the_chain(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings, services: Services
) -> None:
    """The erased text sits in the review queue the way extraction puts it there: bob's turn
    proposes it against alice's project belief (a conflict), the admin accepts it (the resolved
    item names the belief it created), and a later turn files another conflict against that
    belief. Erasing the accepted belief removes both items (their proposals quote the text, and
    their belief is gone), nothing of the text is left in any index or in Redis, and an unrelated
    conflict of the same tenant stays in the queue."""
    ns = api_settings.opensearch_namespace
    secret = f"Payouts go to bank account {uuid.uuid4().hex} every Friday"
    later = f"Payouts go to bank account {uuid.uuid4().hex} every Monday"
    first = belief_body("payments_provider", scope="project:pay", content="Payouts go through Stripe.")
    first.update(type="decision", confidence=0.8)
    original = ok(client.post("/v1/beliefs", json=first, headers=team.h("alice")), 201)["id"]
    other = belief_body("ci_runner", scope="project:pay", content="CI runs on Jenkins.")
    other.update(type="decision", confidence=0.8)
    ok(client.post("/v1/beliefs", json=other, headers=team.h("alice")), 201)

    merged = _extract(api_settings, team.tenant, _proposal_turn(client, team, "bob", secret))
    assert [op["outcome"] for op in merged["merge"]["ops"]] == ["conflict_queued"], merged
    queue = ok(client.get("/v1/admin/reviews", params={"kind": "conflict"}, headers=team.h("carol")))
    assert [r["belief_id"] for r in queue] == [original]
    accepted = ok(
        client.post(
            f"/v1/admin/reviews/{queue[0]['review_id']}/resolve",
            json={"action": "accept_proposed"},
            headers=team.h("carol"),
        )
    )
    current = accepted["result_belief_id"]
    assert ok(client.get(f"/v1/beliefs/{current}", headers=team.h("alice")))["content"] == secret
    merged = _extract(api_settings, team.tenant, _proposal_turn(client, team, "bob", later))
    assert [op["outcome"] for op in merged["merge"]["ops"]] == ["conflict_queued"], merged
    # an unrelated conflict of the same tenant (about the CI runner), which the erase must not touch
    merged = _extract(api_settings, team.tenant, _proposal_turn(client, team, "bob", "CI runs on Drone.", "ci_runner"))
    assert [op["outcome"] for op in merged["merge"]["ops"]] == ["conflict_queued"], merged
    assert _occurrences(os_client, ns, secret), "the text was spread before the erase"

    receipt = ok(client.delete(f"/v1/beliefs/{current}", headers=team.h("carol")))
    assert sorted(receipt["belief_versions_removed"]) == sorted([original, current])
    assert receipt["review_items_removed"] == 2
    assert _occurrences(os_client, ns, secret) == []
    assert _redis_occurrences(services, ns, secret) == []
    assert ok(client.get("/v1/admin/reviews", params={"status": "resolved"}, headers=team.h("carol"))) == []
    still_open = ok(client.get("/v1/admin/reviews", headers=team.h("carol")))
    assert [r["canonical_name"] for r in still_open] == ["ci_runner"]


def test_a_console_erase_drains_the_receipt_outbox_first(
    app: FastAPI, client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings, services: Services
) -> None:
    """A recall quoting the text leaves its receipt in the Redis outbox (no drainer runs here);
    the console's erase, like the API's, moves it into the audit index before redacting, so the
    text is in neither afterwards (it used to stay in Redis and reach the audit trail unredacted
    at the next drain)."""
    ns = api_settings.opensearch_namespace
    secret = f"Console secret {uuid.uuid4().hex}: the vault opens at nine"
    # the receipt keeps the query as recall cleaned it (numbers, hex runs and punctuation out)
    recorded = clean_query(secret).text
    assert recorded != secret and len(recorded) > 20
    body = belief_body("vault_hours", scope="project:pay", content=secret)
    doomed = ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)["id"]
    ok(client.post("/v1/recall", json={"scopes": ["project:pay"], "query": f"is it {secret}"}, headers=team.h("alice")))
    assert _redis_occurrences(services, ns, recorded), "the receipt waits in the outbox"

    web = sign_in(app, team.keys["carol"])
    token = csrf_of(web)
    erased = web.post(f"/console/beliefs/{doomed}/erase", data={"csrf_token": token, "confirmed": "yes"})
    assert erased.status_code == 200 and 'id="erasure-receipt"' in erased.text
    for text in (secret, recorded):
        assert _redis_occurrences(services, ns, text) == [], text
        assert _occurrences(os_client, ns, text) == [], text
    # the receipt itself was kept (drained, its query redacted), not dropped
    events = ok(client.get("/v1/admin/audit", params={"action": "recall"}, headers=team.h("carol")))["items"]
    assert any("[erased]" in json.dumps(e) for e in events)


def test_an_erase_never_rewrites_identifiers_that_equal_the_erased_text(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings
) -> None:
    """A member's belief whose content is the tenant's id (or a colleague's session id): erasing
    it redacts statements, never identifiers; before, every turn, review and audit event of the
    tenant had its ``tenant_id`` rewritten to ``[erased]`` and vanished from the tenant."""
    session = f"session-{uuid.uuid4().hex[:12]}"
    turn = {"model": "gpt-4o", "user_message": "hello there", "assistant_message": "hi", "session_id": session}
    posted = ok(client.post("/v1/turns", json=turn, headers=team.h("alice")), 202)
    bait = ok(client.post("/v1/beliefs", json=belief_body("bait_one", content=team.tenant), headers=team.h("bob")), 201)
    other = ok(client.post("/v1/beliefs", json=belief_body("bait_two", content=session), headers=team.h("bob")), 201)
    for doomed in (bait["id"], other["id"]):
        ok(client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol")))
    kept = ok(client.get(f"/v1/turns/{posted['turn_id']}", headers=team.h("alice")))
    assert kept["session_id"] == session
    events = ok(client.get("/v1/admin/audit", headers=team.h("carol")))["items"]
    assert events and all(e["tenant_id"] == team.tenant for e in events)


def test_an_erase_cut_off_part_way_is_finished_by_its_retry(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copies are erased before the beliefs: an erase that fails part-way (here the redaction,
    as a timeout on a large tenant would) leaves the belief in place, so the admin's retry finds
    it and finishes. Deleted first, the belief was gone and the retry answered 404, with its text
    left in the turns for good."""
    ns = api_settings.opensearch_namespace
    secret = f"Retried secret {uuid.uuid4().hex}: the vault code changes at dawn"
    doomed = ok(
        client.post(
            "/v1/beliefs", json=belief_body("vault_code", scope="project:pay", content=secret), headers=team.h("bob")
        ),
        201,
    )["id"]
    turn = {"model": "gpt-4o", "user_message": f"Remember: {secret}", "assistant_message": "ok", "scope": []}
    ok(client.post("/v1/turns", json=turn, headers=team.h("bob")), 202)
    real_redact = erasure.redact

    def cut_off(*args: Any, **kwargs: Any) -> int:
        raise StoreUnavailable("redact erased text: the node did not answer in time")

    monkeypatch.setattr(erasure, "redact", cut_off)
    failed = client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol"))
    assert failed.status_code == 503, failed.text
    assert ok(client.get(f"/v1/beliefs/{doomed}", headers=team.h("bob")))["content"] == secret
    monkeypatch.setattr(erasure, "redact", real_redact)
    receipt = ok(client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol")))
    assert receipt["belief_versions_removed"] == [doomed] and receipt["text_copies_redacted"] >= 1
    assert _occurrences(os_client, ns, secret) == []


def test_a_quarantine_erase_drains_the_receipt_outbox_first(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings, services: Services
) -> None:
    """The quarantine's erase moves pending receipts into the audit index before redacting, like
    the API's and the console's: a recall that quoted the text does not bring it back later."""
    ns = api_settings.opensearch_namespace
    secret = f"Quarantined receipt secret {uuid.uuid4().hex}: the vault opens at noon"
    recorded = clean_query(secret).text
    belief_id = f"b-q-{uuid.uuid4().hex[:10]}"
    broken = Belief(
        id=belief_id, tenant_id=team.tenant, owner_id="bob", type="decision", canonical_name="v", content=secret,
        scope=["project:pay"],
    )  # fmt: skip
    store_as_is(os_client, ns, broken, scope="project:pay")
    ok(client.post("/v1/recall", json={"scopes": ["project:pay"], "query": f"is it {secret}"}, headers=team.h("alice")))
    assert _redis_occurrences(services, ns, recorded), "the receipt waits in the outbox"
    ok(client.delete(f"/v1/admin/quarantine/{belief_id}", headers=team.h("carol")))
    for text in (secret, recorded):
        assert _redis_occurrences(services, ns, text) == [], text
        assert _occurrences(os_client, ns, text) == [], text


def test_an_erase_drops_the_decoded_belief_from_the_serving_process(
    client: TestClient, team: Team, services: Services
) -> None:
    """Recall keeps each decoded belief in the process (DecodedBeliefs); the process that serves
    the erase drops it there at once, not when it ages out."""
    body = belief_body("vault_rota", scope="project:pay", pinned=True, content="The vault rota is kept by Dana.")
    doomed = ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)["id"]
    recalled = ok(client.post("/v1/recall", json={"scopes": ["project:pay"], "query": "rota"}, headers=team.h("bob")))
    assert doomed in recalled["injected_ids"]

    def held() -> list[Any]:
        return [key for key, _ in services.store.decoded._entries.items() if key[1] == f"{team.tenant}:{doomed}"]

    assert held(), "recall decoded it once"
    ok(client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol")))
    assert held() == []


def test_an_erase_redacts_the_records_waiting_in_redis(
    client: TestClient, team: Team, other_team: Team, services: Services
) -> None:
    """A turn parked while OpenSearch was down and a receipt the audit index refused (set aside
    for an operator) keep their text in Redis; an erase redacts it there too, in the erasing
    tenant's records only: another tenant's record quoting the same words is theirs."""
    secret = f"Waiting secret {uuid.uuid4().hex}: the vault opens at one"
    body = belief_body("vault_opening", scope="project:pay", content=secret)
    doomed = ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)["id"]

    def turn(tenant: str) -> TurnRecord:
        return TurnRecord(
            tenant_id=tenant, turn_id=f"turn-{uuid.uuid4().hex}", owner_id="bob", session_id="s-1",
            user_message=f"Remember: {secret}", assistant_text="Noted.",
        )  # fmt: skip

    parked = services.loop.parked
    assert parked.park(turn(team.tenant)) and parked.park(turn(other_team.tenant))
    refused = AuditEvent(tenant_id=team.tenant, action="recall", actor_id="bob", actor_kind="api_key", query=secret)
    services.receipts.outbox.set_aside(refused, f"mapper_parsing_exception: failed to parse [{secret}]")
    streams = [parked.outbox.key, services.receipts.outbox.dead_key]
    try:
        receipt = ok(client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol")))
        assert receipt["text_copies_redacted"] >= 2
        left = {
            json.loads(fields[b"e"])["tenant_id"]: fields
            for key in streams
            for _, fields in services.redis.xrange(key)
            if secret.encode() in b"".join(fields.values())
        }
        assert list(left) == [other_team.tenant]  # theirs, untouched
    finally:
        services.redis.delete(*streams)


def test_an_erase_whose_sweep_of_cached_renderings_failed_is_finished_by_its_retry(
    client: TestClient, team: Team, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep of the tenant's cached renderings (the shared vocabulary holds names and aliases,
    compressed) comes after the beliefs are deleted: when it failed (Redis down at that moment) the
    erase answered 503, and the retry found no belief and answered 404 without sweeping, leaving
    the erased names in Redis until their TTL."""
    word = f"zqswept{uuid.uuid4().hex[:12]}"
    body = belief_body("vault_words", scope="project:pay", aliases=[f"{word} vault"])
    doomed = ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)["id"]
    asked = {"scopes": ["project:pay"], "query": f"the {word} vault please"}
    recalled = ok(client.post("/v1/recall", json=asked, headers=team.h("alice")))["tiers"]["relevant"]
    assert doomed in [b["id"] for b in recalled]

    def renderings() -> list[bytes]:
        return list(services.redis.scan_iter(match=services.render_cache.prefix(team.tenant) + "*", count=1000))

    assert renderings(), "the tenant's vocabulary was shared in Redis before the erase"

    def redis_down(tenant_id: str) -> int:
        raise StoreUnavailable("Redis is unreachable while dropping cached renderings")

    monkeypatch.setattr(services.render_cache, "invalidate_tenant", redis_down)
    assert client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol")).status_code == 503
    monkeypatch.undo()
    assert renderings(), "what the failed sweep left"
    retried = client.delete(f"/v1/beliefs/{doomed}", headers=team.h("carol"))
    assert retried.status_code == 404, retried.text
    assert renderings() == []
