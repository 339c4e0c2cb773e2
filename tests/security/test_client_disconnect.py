"""A client that hangs up before its request body arrived (its own timeout, a cancelled call, a
load balancer giving up) is not a server failure: the API logs one INFO line with the request id,
no ERROR and no traceback, and records the request as 499 (nginx's "client closed request").

Against the API under a real uvicorn process: only a real server sees a socket close mid-body."""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest

from deploy.localstack import LocalStack
from service.cli import bootstrap


@pytest.fixture(scope="module")
def member_key(served_api: LocalStack) -> str:
    """A member's API key in the served API's own namespace, provisioned over HTTP."""
    operator = bootstrap(served_api.settings(), "disconnect-test")["key"]
    tenant = f"gone-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=served_api.api_url, headers={"Authorization": f"Bearer {operator}"}) as http:
        assert http.post("/v1/admin/tenants", json={"tenant_id": tenant, "name": tenant}).status_code == 201
        created = http.post(f"/v1/admin/tenants/{tenant}/users", json={"user_id": "alice"})
        assert created.status_code == 201, created.text
        issued = http.post(f"/v1/admin/tenants/{tenant}/users/alice/keys", json={"name": "gone"})
        assert issued.status_code == 201, issued.text
        return str(issued.json()["key"])


def _hang_up_mid_body(url: str, path: str, request_id: str, key: str | None) -> None:
    """Send the headers and half of a promised body, then close the socket."""
    host, port = url.removeprefix("http://").split(":")
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n"
        f"X-Request-ID: {request_id}\r\n{auth}\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"model": "gpt-4o", "messages": [')
        time.sleep(0.3)  # the request is in the app, waiting for the rest of its body


def _log_lines_for(log: Path, request_id: str, timeout_s: float = 20.0) -> list[dict[str, object]]:
    """The API's JSON log lines that name the request id, once the access line has been written."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [json.loads(line) for line in log.read_text(errors="replace").splitlines() if request_id in line]
        if any(line.get("logger") == "tenure.access" for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("path", "authenticated"),
    [
        ("/v1/chat/completions", True),  # the proxy reads its body itself, after authentication
        ("/v1/beliefs/import", True),  # a raw body read by the route
        ("/v1/recall", False),  # a body the framework parses before anything else runs
    ],
    ids=["proxy", "import", "framework-parsed"],
)
def test_a_client_hanging_up_mid_request_is_not_an_error(
    served_api: LocalStack, member_key: str, path: str, authenticated: bool
) -> None:
    request_id = f"gone-{uuid.uuid4().hex[:12]}"
    _hang_up_mid_body(served_api.api_url, path, request_id, member_key if authenticated else None)
    log = served_api.logs / "api.log"
    lines = _log_lines_for(log, request_id)
    assert lines, f"no log line names {request_id}"
    assert not [line for line in lines if line.get("level") in ("ERROR", "CRITICAL")], lines
    assert not [line for line in lines if line.get("exc_info") or "Traceback" in json.dumps(line)], lines
    gone = [line for line in lines if "client disconnected" in str(line.get("message"))]
    assert gone and gone[0]["level"] == "INFO", lines
    access = [line for line in lines if line.get("logger") == "tenure.access"]
    assert access and access[0]["status"] == 499, lines
    # and nothing else in the log reports it unhandled (uvicorn's own "Exception in ASGI application")
    text = log.read_text(errors="replace")
    assert "unhandled error in request " + request_id not in text
    assert "Exception in ASGI application" not in text
