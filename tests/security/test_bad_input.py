"""Issue 10 finding 6: bad input is a 4xx in the service's JSON error shape, never a 500 and never
a framework's text/plain page: cursors holding integers beyond 64 bits, deeply nested JSON on the
chat proxy, header values the HTTP parser refuses."""

from __future__ import annotations

import base64
import json
import socket
from typing import Any

import pytest
from fastapi.testclient import TestClient

from deploy.localstack import LocalStack
from tests.api.conftest import Team, belief_body, ok


def _cursor(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def _json_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] and error["message"] and error["request_id"]
    return error


# beyond the signed 64-bit range OpenSearch sorts dates in, or not a finite number at all
# (json writes ``Infinity``/``NaN`` and reads them back)
HUGE: list[Any] = [2**63, -(2**63) - 1, 2**64 + 5, 10**40, float("inf"), float("nan"), 1.5, "x" * 5000]


@pytest.mark.parametrize("value", HUGE, ids=lambda v: str(v)[:24])
def test_cursor_with_out_of_range_value_is_422(client: TestClient, team: Team, value: Any) -> None:
    client.post("/v1/beliefs", json=belief_body("cursor_probe"), headers=team.h("carol"))
    users = f"/v1/admin/tenants/{team.tenant}/users"
    keys = f"/v1/admin/tenants/{team.tenant}/keys"
    quarantine = [("/v1/admin/quarantine", {"kind": kind}) for kind in ("belief", "turn", "review", "audit_event")]
    for path, params in [*((p, {}) for p in ("/v1/beliefs", "/v1/admin/audit", users, keys)), *quarantine]:
        cursor = _cursor([value, "x"])
        response = client.get(path, params={**params, "cursor": cursor}, headers=team.h("carol"))
        error = _json_error(response, 422)
        assert error["code"] == "validation_error", (path, error)
        assert error["details"][0]["loc"] == ["query", "cursor"], (path, error)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_deeply_nested_json_on_the_proxy_is_4xx(client: TestClient, team: Team, path: str) -> None:
    body = '{"model": "gpt-4o", "max_tokens": 8, "messages": ' + "[" * 1000 + "]" * 1000 + "}"
    response = client.post(path, content=body.encode(), headers={**team.h("alice"), "Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["error"]["message"]


def test_deeply_nested_json_on_the_api_is_4xx(client: TestClient, team: Team) -> None:
    deep = "[" * 5000 + "]" * 5000
    for path in ("/v1/beliefs", "/v1/recall", "/v1/beliefs/import", "/v1/turns"):
        response = client.post(
            path,
            content=f'{{"content": {deep}}}'.encode(),
            headers={**team.h("alice"), "Content-Type": "application/json"},
        )
        assert 400 <= response.status_code < 500, (path, response.text)
        _json_error(response, response.status_code)


def _raw_request(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    return status, headers, body


@pytest.mark.parametrize(
    "header",
    [b"X-Tenure-Session: a\x01b", b"Authorization: Bearer \x00tnr_x", b"X-Odd\x7f: v", b"Bad Header Name: v"],
    ids=["control-char-value", "nul-in-credential", "del-in-name", "space-in-name"],
)
def test_malformed_header_gets_the_json_error_shape(served_api: LocalStack, header: bytes) -> None:
    request = b"GET /v1/beliefs HTTP/1.1\r\nHost: api\r\n" + header + b"\r\nConnection: close\r\n\r\n"
    status, headers, body = _raw_request(served_api.api_url, request)
    assert status == 400, body
    assert headers["content-type"].startswith("application/json"), headers
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and error["message"] and error["request_id"]
    assert headers["x-request-id"] == error["request_id"]


@pytest.mark.parametrize("path", ["/v1/chat/completions?x=1", "/v1/models", "/v1/messages"])
def test_a_malformed_header_on_the_proxy_gets_its_sdks_error_shape(served_api: LocalStack, path: str) -> None:
    """Found by the API fuzz: the server's own 400 answered the proxy's routes in the service's
    shape, which the OpenAI and Anthropic SDKs cannot parse."""
    request = f"POST {path} HTTP/1.1\r\nHost: api\r\n".encode() + b"X-Session-Id: a\x01b\r\nConnection: close\r\n\r\n"
    status, _, body = _raw_request(served_api.api_url, request)
    assert status == 400, body
    parsed = json.loads(body)
    if path == "/v1/messages":
        assert parsed["type"] == "error" and parsed["error"]["type"] == "invalid_request_error", parsed
        assert parsed["request_id"] and parsed["error"]["code"] == "bad_request"
    else:
        error = parsed["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "bad_request" and error["request_id"]


def test_served_api_still_answers_good_requests(served_api: LocalStack) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n"
    status, _, body = _raw_request(served_api.api_url, request)
    assert status == 200 and json.loads(body) == {"status": "ok"}


def test_belief_list_survives_a_good_cursor(client: TestClient, team: Team) -> None:
    for i in range(3):
        ok(client.post("/v1/beliefs", json=belief_body(f"paged_{i}"), headers=team.h("alice")), 201)
    page = ok(client.get("/v1/beliefs", params={"limit": 2}, headers=team.h("alice")))
    assert page["next_cursor"]
    rest = ok(client.get("/v1/beliefs", params={"limit": 2, "cursor": page["next_cursor"]}, headers=team.h("alice")))
    assert len(page["items"]) + len(rest["items"]) == 3


def test_unpaired_surrogates_in_belief_text_are_dropped_not_a_500(client: TestClient, team: Team) -> None:
    """A JSON ``\\ud800`` escape decodes to an unpaired surrogate, which no UTF-8 encoder takes:
    in an alias it used to fail the write with a 500 (the names' analysis could not be sent).
    The write succeeds without it, on create and import, and the belief is recalled."""
    escaped = json.dumps(belief_body("surrogate_probe", aliases=["kafka"])).replace('"kafka"', '"kaf\\ud800ka"')
    headers = {**team.h("alice"), "content-type": "application/json"}
    created = client.post("/v1/beliefs", content=escaped, headers=headers)
    assert created.status_code == 201, created.text
    assert created.json()["aliases"] == ["kafka"]
    imported = escaped.replace("surrogate_probe", "surrogate_import").replace("ud800", "udc00")
    report = ok(client.post("/v1/beliefs/import", content=f"[{imported}]", headers=headers))
    assert len(report["imported"]) == 1 and report["failed"] == {}
    recalled = ok(
        client.post("/v1/recall", json={"scopes": ["domain:code"], "query": "kafka?"}, headers=team.h("alice"))
    )
    names = {e["canonical_name"] for e in recalled["tiers"]["relevant"]}
    assert names >= {"surrogate_probe", "surrogate_import"}


# Each of these used to answer 500 (the reviewer's probes): now a 4xx naming the field.


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_a_date_beyond_the_utc_calendar_is_422(client: TestClient, team: Team, when: str) -> None:
    """Converting such an offset time to UTC leaves year 1..9999: datetime raised OverflowError."""
    created = client.post("/v1/beliefs", json=belief_body("far_date", resolved_at=when), headers=team.h("alice"))
    assert _json_error(created, 422)["code"] == "validation_error"
    record = belief_body("far_import", provenance={"extracted_at": when})
    imported = client.post("/v1/beliefs/import", json=[record], headers=team.h("alice"))
    error = _json_error(imported, 422)
    assert ["body", 0, "provenance", "extracted_at"] in [d["loc"] for d in error["details"]]


def test_an_import_with_a_number_of_too_many_digits_is_422(client: TestClient, team: Team) -> None:
    """Python's json refuses integers above 4300 digits with a plain ValueError."""
    body = '[{"confidence": ' + "1" * 5000 + "}]"
    headers = {**team.h("alice"), "Content-Type": "application/json"}
    response = client.post("/v1/beliefs/import", content=body.encode(), headers=headers)
    assert _json_error(response, 422)["code"] == "validation_error"


@pytest.mark.parametrize("route", ["aliases", "reinforce"])
def test_an_alias_that_grows_past_the_limit_when_normalised_is_422(client: TestClient, team: Team, route: str) -> None:
    """Six characters sent, 108 once NFKC-normalised: the re-validation of the changed belief
    refused it, uncaught."""
    belief = ok(client.post("/v1/beliefs", json=belief_body(f"grown_{route}"), headers=team.h("alice")), 201)
    response = client.post(f"/v1/beliefs/{belief['id']}/{route}", json={"aliases": ["ﷺ" * 6]}, headers=team.h("alice"))
    error = _json_error(response, 422)
    assert error["code"] == "validation_error" and ["body", "aliases"] in [d["loc"] for d in error["details"]]


def _proxy_post(client: TestClient, team: Team, path: str, body: dict[str, Any]) -> Any:
    escaped = json.dumps(body).replace("SURROGATE", "\\ud800")
    headers = {**team.h("alice"), "Content-Type": "application/json"}
    return client.post(path, content=escaped.encode(), headers=headers)


def _proxy_error(response: Any, path: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "validation_error" and error["message"], error
    assert path != "/v1/chat/completions" or error["request_id"] == response.headers["X-Request-ID"]
    return error


PROXY_PATHS = ["/v1/chat/completions", "/v1/messages"]


@pytest.mark.parametrize("path", PROXY_PATHS)
def test_a_lone_surrogate_in_a_proxied_message_is_422(client: TestClient, team: Team, path: str) -> None:
    """No UTF-8 encoder takes it: building the upstream request failed with UnicodeEncodeError."""
    body = {"model": "gpt-4o", "max_tokens": 8, "messages": [{"role": "user", "content": "hi SURROGATE"}]}
    assert "surrogate" in _proxy_error(_proxy_post(client, team, path, body), path)["message"]


@pytest.mark.parametrize("path", PROXY_PATHS)
@pytest.mark.parametrize("session", ["s-SURROGATE", "s-\u0007bell", "s-\nline"])
def test_a_session_id_the_answer_cannot_carry_is_422(client: TestClient, team: Team, path: str, session: str) -> None:
    """A surrogate in ``metadata.session_id`` failed the JSON answer after the upstream call."""
    body = {
        "model": "gpt-4o",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"session_id": session},
    }
    _proxy_error(_proxy_post(client, team, path, body), path)


@pytest.mark.parametrize("path", PROXY_PATHS)
def test_pass_through_json_nested_too_deeply_to_forward_is_422(client: TestClient, team: Team, path: str) -> None:
    """300 levels parse, but pydantic refuses to serialise them for the upstream."""
    deep = '{"model": "gpt-4o", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "extra": '
    body = deep + "[" * 300 + "]" * 300 + "}"
    headers = {**team.h("alice"), "Content-Type": "application/json"}
    response = client.post(path, content=body.encode(), headers=headers)
    assert "nested" in _proxy_error(response, path)["message"]


@pytest.mark.parametrize("injected", ["x\ud800", "b-" + "x" * 40_000, "has space"], ids=["surrogate", "40kB", "space"])
def test_a_turn_naming_an_impossible_belief_id_is_422(client: TestClient, team: Team, injected: str) -> None:
    """A surrogate failed the store's serializer (500); a 40 kB id became a retryable 503."""
    turn = {"model": "gpt-4o", "user_message": "hi", "assistant_message": "hello", "injected_ids": [injected]}
    escaped = json.dumps(turn).encode()
    response = client.post(
        "/v1/turns", content=escaped, headers={**team.h("alice"), "Content-Type": "application/json"}
    )
    error = _json_error(response, 422)
    assert ["body", "injected_ids", 0] in [d["loc"] for d in error["details"]]


ADMIN_IMPORT_DAMAGE: list[tuple[str, dict[str, Any]]] = [
    ("version", {"version": 2**64}),
    ("reinforcement_count", {"reinforcement_count": 2**64}),
    ("supersedes", {"supersedes": "b-\ud800"}),
    ("supersedes", {"supersedes": "b-" + "x" * 5000}),
    (
        "change_log",
        {"change_log": [{"changed_at": "2024-01-01T00:00:00Z", "trigger": "t", "removed_aliases": ["\ud800"]}]},
    ),
    (
        "change_log",
        {"change_log": [{"changed_at": "2024-01-01T00:00:00Z", "trigger": "t", "removed_aliases": ["x" * 5000]}]},
    ),
]


@pytest.mark.parametrize(("field", "damage"), ADMIN_IMPORT_DAMAGE, ids=lambda v: str(v)[:20])
def test_an_admin_import_of_values_the_store_cannot_hold_is_422(
    client: TestClient, team: Team, field: str, damage: dict[str, Any]
) -> None:
    """An admin's import keeps server-owned fields: a 2**64 version failed the store's JSON encoder
    and a surrogate its serializer (500), long strings went in unchecked."""
    record = json.dumps([belief_body("admin_import_probe", **damage)])
    headers = {**team.h("carol"), "Content-Type": "application/json"}
    response = client.post("/v1/beliefs/import", content=record.encode(), headers=headers)
    error = _json_error(response, 422)
    assert any(d["loc"][:3] == ["body", 0, field] for d in error["details"]), error
