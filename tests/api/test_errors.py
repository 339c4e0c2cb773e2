"""One error shape everywhere; 4xx for bad input, 413 for big bodies, 503 when OpenSearch is down."""

from __future__ import annotations

import socket
import uuid

import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from pydantic import TypeAdapter

from service.api.state import Services
from service.app import create_app
from service.config import Settings
from service.errors import ValidationFailed
from service.storage.client import translate_errors
from tests.api.conftest import Team, auth, ok


def _shape(response: object, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details", "request_id"}
    assert body["error"]["code"] == code and body["error"]["message"]
    assert body["error"]["request_id"] == response.headers["X-Request-ID"]  # type: ignore[attr-defined]
    return body["error"]  # type: ignore[no-any-return]


def test_health(client: TestClient) -> None:
    assert ok(client.get("/healthz")) == {"status": "ok"}
    assert ok(client.get("/readyz")) == {"status": "ready", "opensearch": True, "redis": True, "indices": True}


def test_framework_errors_share_the_shape(client: TestClient, team: Team) -> None:
    _shape(client.get("/v1/nothing-here"), 404, "not_found")
    _shape(client.put("/v1/recall", headers=team.h("alice")), 405, "method_not_allowed")
    _shape(client.post("/v1/recall", json={}), 401, "unauthenticated")


def test_validation_errors_have_precise_paths(client: TestClient, team: Team) -> None:
    err = _shape(
        client.post(
            "/v1/recall",
            json={"scopes": ["domain:ok", "BAD SCOPE"], "budget": {"maxBeliefs": -1}},
            headers=team.h("alice"),
        ),
        422,
        "validation_error",
    )
    locs = [d["loc"] for d in err["details"]]  # type: ignore[union-attr]
    assert ["body", "scopes"] in locs and ["body", "budget", "maxBeliefs"] in locs
    err = _shape(
        client.post(
            "/v1/beliefs",
            json={"type": "opinion", "canonical_name": "x", "content": "y", "scope": []},
            headers=team.h("alice"),
        ),
        422,
        "validation_error",
    )
    assert {("body", "type"), ("body", "scope")} <= {tuple(d["loc"]) for d in err["details"]}  # type: ignore[union-attr]
    _shape(
        client.post(
            "/v1/recall", content=b"{not json", headers={**team.h("alice"), "Content-Type": "application/json"}
        ),
        422,
        "validation_error",
    )
    _shape(client.get("/v1/beliefs/bad id!", headers=team.h("alice")), 422, "validation_error")
    _shape(client.get("/v1/beliefs", params={"limit": 0}, headers=team.h("alice")), 422, "validation_error")
    _shape(
        client.post("/v1/beliefs/b-x/resolve", json={"unexpected": 1}, headers=team.h("alice")), 422, "validation_error"
    )


def test_body_size_limit(client: TestClient, team: Team) -> None:
    big = b'{"query": "' + b"x" * 300_000 + b'"}'
    err = _shape(
        client.post("/v1/recall", content=big, headers={**team.h("alice"), "Content-Type": "application/json"}),
        413,
        "payload_too_large",
    )
    assert err["details"] == {"limit": 200_000}

    def chunks() -> object:  # no Content-Length: the limit is enforced while streaming
        yield b'{"query": "'
        for _ in range(30):
            yield b"x" * 10_000
        yield b'"}'

    _shape(
        client.post("/v1/recall", content=chunks(), headers={**team.h("alice"), "Content-Type": "application/json"}),
        413,
        "payload_too_large",
    )  # type: ignore[arg-type]


def test_request_id_is_generated_or_echoed(client: TestClient) -> None:
    assert client.get("/healthz").headers["X-Request-ID"].startswith("req-")
    assert client.get("/healthz", headers={"X-Request-ID": "abc-123"}).headers["X-Request-ID"] == "abc-123"
    assert (
        client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"}).headers["X-Request-ID"]
        != "bad id with spaces"
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def down_client(api_settings: Settings) -> TestClient:
    settings = api_settings.model_copy(
        update={"opensearch_url": f"http://127.0.0.1:{_closed_port()}", "opensearch_timeout_s": 1.0}
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c  # type: ignore[misc]


def test_opensearch_down_is_503_with_retry_after(down_client: TestClient) -> None:
    assert ok(down_client.get("/healthz")) == {"status": "ok"}
    ready = down_client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["opensearch"] is False and ready.headers["Retry-After"]
    fake_key = "tnr_0123456789abcdef_" + "A" * 43
    response = down_client.post("/v1/recall", json={"query": "x"}, headers=auth(fake_key))
    _shape(response, 503, "store_unavailable")
    assert int(response.headers["Retry-After"]) > 0


def test_openapi_documents_security_and_the_error_shape(app: object) -> None:
    schema = app.openapi()  # type: ignore[attr-defined]
    assert schema["components"]["securitySchemes"]["BearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT or tnr_<key id>_<secret> API key",
        "description": "An API key issued by an admin, or a JWT (RS256/ES256 via JWKS; HS256 in development).",
    }
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # our 422 shape, not FastAPI's
    # The proxy's wire-compatible routes answer in their SDK's error shape (tested beside them);
    # the Anthropic one also takes the key as Anthropic clients send it (x-api-key).
    messages = schema["paths"]["/v1/messages"]["post"]
    assert messages["security"] == [{"BearerAuth": []}, {"AnthropicApiKey": []}]
    assert messages["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/AnthropicErrorOut")
    for path, operations in schema["paths"].items():
        if not path.startswith("/v1/") or path in {"/v1/chat/completions", "/v1/messages"}:
            continue
        for method, operation in operations.items():
            assert operation.get("security") == [{"BearerAuth": []}], (method, path)
            ref = operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorOut"), (method, path)


def test_an_unreadable_body_is_a_400_bad_request(client: TestClient, team: Team) -> None:
    """FastAPI answers "error parsing the body" with 400; its code was validation_error, which the
    docs give as a 422."""
    headers = {**team.h("alice"), "Content-Type": "application/json"}
    unreadable = b'{"content": ' + b"1" * 5000 + b"}"  # Python refuses integers of more than 4300 digits
    err = _shape(client.post("/v1/beliefs", content=unreadable, headers=headers), 400, "bad_request")
    assert err["message"] == "There was an error parsing the body"


@pytest.fixture(scope="module")
def failing_client(api_settings: Settings) -> TestClient:
    """The app with two routes that fail the way only a bug can: answered by the app's handlers."""
    app = create_app(api_settings)

    def crash() -> None:
        raise RuntimeError("a bug")

    def stray_model_error() -> None:
        TypeAdapter(int).validate_python("not a number")

    app.add_api_route("/test/crash", crash)
    app.add_api_route("/test/stray-model-error", stray_model_error)
    return TestClient(app, raise_server_exceptions=False)


def test_a_500_carries_the_request_id_header(failing_client: TestClient) -> None:
    """Starlette sends the 500 from outside the middleware that adds X-Request-ID to the rest."""
    err = _shape(failing_client.get("/test/crash", headers={"X-Request-ID": "crash-1"}), 500, "internal_error")
    assert err["request_id"] == "crash-1"


def test_a_stray_model_validation_error_is_a_422(failing_client: TestClient) -> None:
    err = _shape(failing_client.get("/test/stray-model-error"), 422, "validation_error")
    assert err["details"]


def test_a_value_the_store_cannot_encode_is_a_validation_failure(services: Services) -> None:
    """opensearch-py's SerializationError is no TransportError: it escaped translation as a 500."""
    with pytest.raises(ValidationFailed), translate_errors("index a probe"):
        services.opensearch.index(index="no-such-index", body={"text": "x\ud800"})


def test_templates_the_store_refuses_leave_the_api_unready_not_failing(
    api_settings: Settings, os_client: OpenSearch
) -> None:
    """An index squatting on the beliefs alias's name (a stray write before the templates were
    applied creates one) makes the store refuse the alias: /readyz answered 500 with the error
    escaping, instead of 503 with ``indices: false`` and the refusal in the log."""
    namespace = f"squat-{uuid.uuid4().hex[:8]}"
    os_client.indices.create(index=f"{namespace}-beliefs")
    try:
        settings = api_settings.model_copy(update={"opensearch_namespace": namespace})
        with TestClient(create_app(settings), raise_server_exceptions=False) as squatted:
            assert ok(squatted.get("/healthz")) == {"status": "ok"}
            ready = squatted.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.json()["indices"] is False and ready.json()["opensearch"] is True
    finally:
        os_client.indices.delete(index=f"{namespace}-*")
