"""The MCP server driven by the official ``mcp`` SDK's own client, over both transports, against a
real uvicorn serving the app (real OpenSearch and Redis): streamable HTTP at ``/mcp`` with each
caller's own key, and ``tenure mcp`` over stdio talking to the REST API. A member probes another
tenant's beliefs and a colleague's private ones and sees nothing; recalls leave receipts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from service.app import create_app
from service.cli import EXIT_USAGE
from service.config import Settings
from tests.api.conftest import Team, belief_body, ok
from tests.live import serve

TENURE = str(Path(sys.executable).with_name("tenure"))


@pytest.fixture(scope="module")
def live_url(api_settings: Settings, client: TestClient) -> Iterator[str]:
    """The app under uvicorn on a free port (same indices and Redis as the TestClient's)."""
    with serve(create_app(api_settings)) as url:
        yield url


def _http(url: str, key: str, from_address: str | None = None) -> Client:
    """An MCP client over HTTP; ``from_address``: the loopback address it connects from (all of
    127.0.0.0/8 is loopback on Linux), so the server sees another caller."""
    transport = httpx2.AsyncHTTPTransport(local_address=from_address) if from_address else None
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0, transport=transport)
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), cache=None)


def _stdio(url: str, key: str) -> Client:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}}
    env.update({"TENURE_CLI_URL": url, "TENURE_CLI_KEY": key})
    return Client(StdioServerParameters(command=TENURE, args=["mcp"], env=env), cache=None)


async def _call(client: Client, tool: str, **arguments: Any) -> tuple[bool, Any]:
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        return True, " ".join(getattr(c, "text", "") for c in result.content)
    return False, result.structured_content


def _seed(client: TestClient, team: Team) -> dict[str, str]:
    """alice: one belief shared with project pay, one private; bob: one private."""
    ids = {}
    for user, name, scope in (
        ("alice", "billing_retry_policy", "project:pay"),
        ("alice", "alice_editor_theme", "user:alice"),
        ("bob", "bob_secret_shortcut", "user:bob"),
    ):
        created = ok(client.post("/v1/beliefs", json=belief_body(name, scope), headers=team.h(user)), 201)
        ids[name] = created["id"]
    return ids


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_tools_answer_only_what_the_callers_credential_allows(
    transport: str, live_url: str, client: TestClient, team: Team, other_team: Team
) -> None:
    ids = _seed(client, team)
    connect = _http if transport == "http" else _stdio

    async def scenario() -> None:
        async with connect(live_url, team.keys["alice"]) as alice:
            names = {t.name for t in (await alice.list_tools()).tools}
            assert {"recall", "remember", "supersede", "reinforce", "search_beliefs", "history"} <= names
            assert {"open_questions", "resolve"} <= names

            failed, recalled = await _call(
                alice,
                "recall",
                query="billing retry policy and the alice editor theme",
                scopes=["project:pay", "user:alice"],
                session_id=f"mcp-{transport}",
            )
            assert not failed and sorted(recalled["injected_ids"]) == sorted(
                [ids["billing_retry_policy"], ids["alice_editor_theme"]]
            )
            assert "Shapes answers about billing_retry_policy" in recalled["injection"]

            failed, made = await _call(
                alice,
                "remember",
                type="decision",
                canonical_name=f"mcp_{transport}_decision",
                content="Retries back off exponentially.",
                scope=["project:pay"],
                aliases=["backoff"],
            )
            assert not failed and made["canonical_name"] == f"mcp_{transport}_decision"
            failed, swapped = await _call(alice, "supersede", belief_id=made["id"], content="Retries use jitter.")
            assert not failed and swapped["current"]["content"] == "Retries use jitter."
            failed, chain = await _call(alice, "history", belief_id=swapped["current"]["id"])
            assert not failed and [b["id"] for b in chain["chain"]] == [made["id"], swapped["current"]["id"]]

        async with connect(live_url, team.keys["bob"]) as bob:  # a colleague on the same project
            failed, recalled = await _call(
                bob, "recall", query="billing retry policy and alice editor theme", scopes=["project:pay", "user:alice"]
            )
            assert not failed and recalled["injected_ids"] == [ids["billing_retry_policy"]]
            assert "alice_editor_theme" not in recalled["injection"]
            failed, found = await _call(bob, "search_beliefs", query="alice editor theme")
            assert not failed and found["items"] == []
            failed, message = await _call(bob, "history", belief_id=ids["alice_editor_theme"])
            assert failed and "not_found" in message
            failed, message = await _call(bob, "reinforce", belief_id=ids["alice_editor_theme"])
            assert failed and "not_found" in message

        async with connect(live_url, other_team.keys["alice"]) as stranger:  # another tenant
            failed, recalled = await _call(
                stranger, "recall", query="billing retry policy editor theme secret shortcut", scopes=["project:pay"]
            )
            assert not failed and recalled["injected_ids"] == []
            failed, found = await _call(stranger, "search_beliefs", query="billing retry policy")
            assert not failed and found["items"] == []
            failed, message = await _call(stranger, "history", belief_id=ids["bob_secret_shortcut"])
            assert failed and "not_found" in message

    anyio.run(scenario)

    # the injections made through MCP left receipts, attributed to the caller (audit reads drain)
    page = ok(
        client.get(
            "/v1/admin/audit", params={"action": "recall", "session_id": f"mcp-{transport}"}, headers=team.h("carol")
        )
    )
    assert [r["actor_id"] for r in page["items"]] == ["alice"]
    assert sorted(page["items"][0]["belief_ids"]) == sorted([ids["billing_retry_policy"], ids["alice_editor_theme"]])


def test_tenure_mcp_after_global_options_serves_with_that_url_and_key(live_url: str, team: Team) -> None:
    """``tenure --url U --key K mcp``: the options before the command reach the stdio server (it
    used to exit 0 without serving). Run from this checkout's ``service.cli``."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "clients" / "python")])
    command = [sys.executable, "-m", "service.cli", "--url", live_url, "--key", team.keys["alice"], "mcp"]
    server = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(root))

    async def scenario() -> tuple[bool, Any]:
        async with Client(server, cache=None) as alice:
            return await _call(alice, "search_beliefs", query="billing")

    failed, answer = anyio.run(scenario)
    assert not failed and answer["items"] == [], answer


def test_open_questions_pages_with_the_cursor_it_returns(live_url: str, client: TestClient, team: Team) -> None:
    scope = "user:alice"
    for n in range(3):
        body = belief_body(f"open_question_{n}", scope, type="open_question", epistemic_status="exploratory")
        ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)

    async def scenario() -> list[Any]:
        pages: list[Any] = []
        cursor = None
        async with _http(live_url, team.keys["alice"]) as alice:
            for _ in range(3):  # 3 questions, 2 a page: the cursor must end it within 2 pages
                failed, page = await _call(alice, "open_questions", scopes=[scope], limit=2, cursor=cursor)
                assert not failed, page
                pages.append(page)
                cursor = page["next_cursor"]
                if not cursor:
                    break
        return pages

    pages = anyio.run(scenario)
    names = [b["canonical_name"] for page in pages for b in page["items"]]
    assert len(pages) == 2 and sorted(names) == [f"open_question_{n}" for n in range(3)]


def test_http_endpoint_refuses_requests_without_a_credential(live_url: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    response = httpx.post(f"{live_url}/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == "unauthenticated" and error["request_id"] == response.headers["X-Request-ID"]


def test_a_wrong_credential_gets_a_tool_error_not_data(live_url: str, team: Team) -> None:
    async def scenario() -> tuple[bool, Any]:
        async with _http(live_url, "tnr_bogus_notasecret") as intruder:
            return await _call(intruder, "search_beliefs", query="billing")

    failed, message = anyio.run(scenario)
    assert failed and "unauthenticated" in message


def test_bad_credentials_over_mcp_block_their_caller_not_every_mcp_user(api_settings: Settings, team: Team) -> None:
    """The failed-authentication limit keys on the MCP caller's own address: the in-process REST
    call used to come from 127.0.0.1 for everyone, and one caller's junk bearer locked out all."""
    api = api_settings.api.model_copy(update={"failed_auth_per_s": 0.01, "failed_auth_burst": 3})
    with serve(create_app(api_settings.model_copy(update={"api": api}))) as url:

        async def scenario() -> tuple[list[str], tuple[bool, Any]]:
            refusals = []
            async with _http(url, "junk", from_address="127.0.0.2") as intruder:
                for _ in range(5):
                    refusals.append((await _call(intruder, "search_beliefs", query="billing"))[1])
            async with _http(url, team.keys["alice"]) as alice:
                return refusals, await _call(alice, "search_beliefs", query="billing")

        refusals, (failed, answer) = anyio.run(scenario)
    assert "unauthenticated" in refusals[0] and "rate_limited" in refusals[-1]  # the intruder is blocked
    assert not failed, answer  # alice, from another address, is not
    assert answer["items"] == []


def test_recall_over_mcp_matches_rest(live_url: str, client: TestClient, team: Team) -> None:
    ids = _seed(client, team)
    rest = ok(
        client.post(
            "/v1/recall", json={"query": "billing retry policy", "scopes": ["project:pay"]}, headers=team.h("bob")
        )
    )

    async def scenario() -> tuple[bool, Any]:
        async with _http(live_url, team.keys["bob"]) as bob:
            return await _call(bob, "recall", query="billing retry policy", scopes=["project:pay"])

    failed, recalled = anyio.run(scenario)
    assert not failed and recalled["injected_ids"] == rest["injected_ids"] == [ids["billing_retry_policy"]]
    assert recalled["injection"] == rest["injection"]["text"]
    assert json.loads(json.dumps(recalled)) == recalled  # plain JSON for any MCP client


@pytest.mark.parametrize("credential", ["alice", "junk"])
def test_a_get_is_refused_at_once_not_held_open_for_ever(live_url: str, team: Team, credential: str) -> None:
    """The endpoint is stateless: there is no session whose server-sent events a GET could carry.
    A GET (any bearer, junk included: validity is checked per tool call) was answered with an
    event stream that never ended, holding a connection and a task of the API worker for as long
    as the caller liked; it is a 405 (what MCP prescribes for a server without such a stream), and
    the official client carries on without it (the tests above)."""
    bearer = team.keys["alice"] if credential == "alice" else "tnr_junk_junk"
    for accept in ("text/event-stream", "*/*"):
        headers = {"Authorization": f"Bearer {bearer}", "Accept": accept}
        response = httpx.get(f"{live_url}/mcp", headers=headers, timeout=10)
        assert response.status_code == 405 and response.headers["Allow"] == "POST"
        error = response.json()["error"]
        assert response.json()["id"] is None and error["code"] == -32600


@pytest.mark.parametrize(
    ("setting", "value"),
    [("TENURE_CLI_TIMEOUT_S", "soon"), ("TENURE_CLI_TIMEOUT_S", "0"), ("TENURE_CLI_TIMEOUT_S", "601")],
)
def test_tenure_mcp_with_a_bad_setting_says_which_in_one_line(setting: str, value: str) -> None:
    """It printed pydantic's traceback; now one line naming the setting, and exit 2 (a command
    line or setting it cannot run with, as argparse says for a bad option). Nothing on stdout,
    the MCP channel."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "clients" / "python")])
    env |= {"TENURE_CLI_KEY": "tnr_a_b", setting: value}
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "mcp"],
        env=env,
        cwd=root,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr.startswith(f"tenure mcp: error: {setting}: ") and done.stderr.count("\n") == 1, done.stderr
    assert f"fix {setting} or unset it" in done.stderr


def _post_mcp(url: str, key: str, body: bytes) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {key}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    return httpx.post(f"{url}/mcp", content=body, headers=headers, timeout=10)


@pytest.mark.parametrize("request_id", ["null", "true", "1.5", '{"a": 1}', "[1]"])
def test_a_request_with_an_id_mcp_forbids_gets_an_invalid_request_error(
    live_url: str, team: Team, request_id: str
) -> None:
    """It was taken for a notification: 202 and no reply, so its caller waited for ever."""
    body = f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/list"}}'.encode()
    response = _post_mcp(live_url, team.keys["alice"], body)
    assert response.status_code == 400, response.text
    answer = response.json()
    assert answer["id"] is None and answer["error"]["code"] == -32600 and "id" in answer["error"]["message"]


def test_a_batch_is_refused_as_an_invalid_request_saying_so(live_url: str, team: Team) -> None:
    """It got -32602 (invalid params), which points the caller at the wrong thing."""
    batch = [{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in (1, 2)]
    response = _post_mcp(live_url, team.keys["alice"], json.dumps(batch).encode())
    assert response.status_code == 400
    answer = response.json()
    assert answer["id"] is None and answer["error"]["code"] == -32600
    assert "batches are not supported" in answer["error"]["message"]


def test_what_the_check_lets_through_is_answered_as_before(live_url: str, team: Team) -> None:
    """A request with an integer or string id is answered with that id, a notification with a 202,
    and JSON that does not parse with the SDK's own -32700."""
    for request_id in (7, "seven"):
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "ping"}).encode()
        response = _post_mcp(live_url, team.keys["alice"], body)
        assert response.status_code == 200 and response.json()["id"] == request_id, response.text
    notification = _post_mcp(live_url, team.keys["alice"], b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    assert notification.status_code == 202
    broken = _post_mcp(live_url, team.keys["alice"], b'{"jsonrpc": ')
    assert broken.status_code == 400 and broken.json()["error"]["code"] == -32700


def test_tenure_mcp_waits_for_the_api_only_as_long_as_the_cli_timeout() -> None:
    """``TENURE_CLI_TIMEOUT_S`` bounds each tool's call to the API in ``tenure mcp`` as in every
    other command (it was checked, then ignored: a silent API held a tool for the SDK's 30 s)."""
    root = Path(__file__).resolve().parents[2]
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
        env.update(
            {
                "PYTHONPATH": os.pathsep.join([str(root), str(root / "clients" / "python")]),
                "TENURE_CLI_URL": f"http://127.0.0.1:{silent.getsockname()[1]}",
                "TENURE_CLI_KEY": "tnr_k1_notasecret",
                "TENURE_CLI_TIMEOUT_S": "1",
            }
        )
        server = StdioServerParameters(
            command=sys.executable, args=["-m", "service.cli", "mcp"], env=env, cwd=str(root)
        )

        async def scenario() -> tuple[bool, Any, float]:
            async with Client(server, cache=None) as client:
                started = time.monotonic()
                failed, answer = await _call(client, "search_beliefs", query="billing")
                return failed, answer, time.monotonic() - started

        failed, answer, took = anyio.run(scenario)
    assert failed, answer
    # one attempt and the SDK's resends of a read (up to 2, with short waits): far below 30 s
    assert took < 12, (took, answer)
