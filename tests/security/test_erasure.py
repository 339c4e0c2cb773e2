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

from fastapi.testclient import TestClient
from opensearchpy import OpenSearch, helpers

from service.api.state import Services
from service.config import Settings
from service.extraction.sidecar import BEGIN, END
from tests.api.conftest import Team, belief_body, ok


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
