"""The Python SDK (``clients/python``, ``tenure_client``) against the real app: its models match the
live OpenAPI schema, every belief operation round-trips typed, errors carry code and request id,
429s are retried after Retry-After, cursors are followed, and the async client does the same."""

from __future__ import annotations

import ast
import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from tenure_client import (
    AsyncTenure,
    AuthenticationFailed,
    BadRequest,
    ConnectionFailed,
    NotFound,
    PermissionDenied,
    RateLimited,
    Tenure,
    chunked,
    models,
)
from tenure_client._codegen import render
from tenure_client.keepalive import KeepAliveSyncTransport, KeepAliveTransport

from service.app import create_app
from service.config import Settings
from tests.api.conftest import Team, belief_body, recallable_name
from tests.live import serve

MODELS = Path(__file__).resolve().parents[2] / "clients" / "python" / "tenure_client" / "models.py"


def test_models_match_the_live_openapi_schema(app: FastAPI) -> None:
    """Regenerate with: .venv/bin/python -m tenure_client._codegen <(curl -s localhost:8000/openapi.json)
    > clients/python/tenure_client/models.py (or see clients/python/README.md)."""
    expected = ast.dump(ast.parse(render(app.openapi())))
    assert ast.dump(ast.parse(MODELS.read_text())) == expected, (
        "clients/python/tenure_client/models.py is stale: regenerate it from the live schema"
    )


def _sdk(client: TestClient, key: str, **kwargs: Any) -> Tenure:
    return Tenure("http://testserver", key, http_client=client, **kwargs)


def test_belief_lifecycle_round_trips_typed(client: TestClient, team: Team) -> None:
    alice = _sdk(client, team.keys["alice"], session_id="sdk-s1")
    created = alice.beliefs.create(**belief_body("session_cache", "project:pay"))
    assert isinstance(created, models.Belief) and created.owner_id == "alice" and created.version == 1

    assert alice.beliefs.get(created.id or "").canonical_name == "session_cache"
    assert alice.beliefs.reinforce(created.id or "", ["redis sessions"]).reinforcement_count == 1
    assert "redis sessions" in (alice.beliefs.add_aliases(created.id or "", ["kv sessions"]).aliases or [])
    assert alice.beliefs.pin(created.id or "").pinned is True
    assert alice.beliefs.unpin(created.id or "").pinned is False

    replaced = alice.beliefs.supersede(created.id or "", content="Sessions live in Valkey.", reason="migrated")
    assert replaced.superseded.superseded_by == replaced.current.id
    history = alice.beliefs.history(replaced.current.id or "")
    assert [b.id for b in history.chain] == [created.id, replaced.current.id]

    question = alice.beliefs.create(
        **belief_body("cache_eviction_question", "project:pay", type="open_question", epistemic_status="exploratory")
    )
    assert alice.beliefs.resolve(question.id or "", note="LRU").resolved_at is not None
    assert alice.beliefs.retract(replaced.current.id or "", reason="wrong").retracted_at is not None


def test_recall_and_cursor_iteration(client: TestClient, team: Team) -> None:
    alice = _sdk(client, team.keys["alice"])
    names = [f"sdk_{w}_topic" for w in ("amber", "birch", "cedar", "dahlia", "elm")]
    report = alice.beliefs.import_([{**belief_body(n, "project:pay"), "_id": f"b-{n}"} for n in names])
    assert sorted(report.imported) == sorted(f"b-{n}" for n in names) and report.failed == {}

    seen = [b.canonical_name for b in alice.beliefs.iter(page_size=2, scope=["project:pay"])]
    assert sorted(seen) == names  # three pages, nothing twice
    page = alice.beliefs.list(limit=2, scope=["project:pay"])
    assert len(page.items) == 2 and page.next_cursor

    recalled = alice.recall("what about the sdk cedar topic?", scopes=["project:pay"], session_id="sdk-recall")
    assert recalled.injected_ids == ["b-sdk_cedar_topic"] and recalled.receipt_id
    assert "sdk_cedar_topic" in recalled.injection.text

    exported = [b.id for b in alice.beliefs.export(scope=["project:pay"])]
    assert sorted(exported) == sorted(f"b-{n}" for n in names)
    # bob shares project pay: he recalls it too; another tenant's member sees nothing
    assert _sdk(client, team.keys["bob"]).recall("sdk cedar topic", scopes=["project:pay"]).injected_ids == [
        "b-sdk_cedar_topic"
    ]


def test_errors_carry_code_status_and_request_id(client: TestClient, team: Team, other_team: Team) -> None:
    alice = _sdk(client, team.keys["alice"])
    mine = alice.beliefs.create(**belief_body("private_pref", "user:alice"))

    with pytest.raises(NotFound) as missing:
        _sdk(client, other_team.keys["alice"]).beliefs.get(mine.id or "")
    assert missing.value.code == "not_found" and missing.value.status == 404
    assert missing.value.request_id and missing.value.request_id.startswith("req-")
    with pytest.raises(NotFound):
        _sdk(client, team.keys["bob"]).beliefs.get(mine.id or "")  # a colleague's private belief

    with pytest.raises(PermissionDenied) as denied:
        alice.admin.audit()
    assert denied.value.code == "forbidden"
    with pytest.raises(AuthenticationFailed) as unauth:
        _sdk(client, "tnr_notakey_secret").whoami()
    assert unauth.value.code == "unauthenticated" and unauth.value.status == 401
    with pytest.raises(BadRequest) as invalid:
        alice.beliefs.create(**{**belief_body("x", "project:pay"), "scope": ["nonsense"]})
    assert invalid.value.code == "validation_error" and invalid.value.details


def test_ids_of_dots_or_nothing_never_reach_another_route(
    client: TestClient, operator_key: str, team: Team, other_team: Team
) -> None:
    """An id ``..`` went out as a dot segment that httpx resolves against the path:
    ``disable_user(tenant, "..")`` sent ``POST /v1/admin/tenants/<tenant>/disable`` and disabled
    the whole tenant; ``get(".")`` and ``get("")`` reached the listing's redirect and raised
    pydantic's ValidationError, not a TenureError."""
    operator = _sdk(client, operator_key)
    for user_id in ("..", "."):
        with pytest.raises(BadRequest):  # the server's 422: no user id is made of dots
            operator.admin.disable_user(team.tenant, user_id)
    with pytest.raises(BadRequest):
        operator.admin.disable_user(team.tenant, "")
    for tenant in (team, other_team):  # neither tenant, nor anyone in it, was disabled
        for user in ("alice", "bob"):
            assert _sdk(client, tenant.keys[user]).whoami().tenant_id == tenant.tenant

    alice = _sdk(client, team.keys["alice"])
    mine = alice.beliefs.create(**belief_body("dotted_ids_rule", "project:pay"))
    for belief_id in ("", ".", ".."):
        with pytest.raises(BadRequest):
            alice.beliefs.get(belief_id)
        with pytest.raises(BadRequest):
            alice.beliefs.pin(belief_id)
    assert alice.beliefs.get(mine.id or "").pinned is False


def _behind_prefix(app: ASGIApp, prefix: str) -> ASGIApp:
    """``app`` as a proxy serving it at a path prefix serves it (Caddy's ``handle_path
    /tenure/*``): the prefix stripped, any other path a 404 of the proxy's own."""

    async def proxy(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if not scope["path"].startswith(f"{prefix}/"):
                await PlainTextResponse("not found", status_code=404)(scope, receive, send)
                return
            scope = {**scope, "path": scope["path"][len(prefix) :], "raw_path": scope["raw_path"][len(prefix) :]}
        await app(scope, receive, send)

    return proxy


def test_a_base_url_with_a_path_keeps_it(app: FastAPI, client: TestClient, team: Team, other_team: Team) -> None:
    """``Tenure("https://host/tenure")`` sent its requests, key and all, to ``https://host/v1/...``
    (an RFC 3986 join of an absolute path drops the base's path), another service's on a shared
    host; the base URL's path is kept, as httpx keeps it for a relative URL."""
    proxied = _behind_prefix(app, "/tenure")
    http = TestClient(proxied, base_url="http://testserver/tenure")  # the app's lifespan already runs
    for tenant in (team, other_team):
        sdk = Tenure("http://testserver/tenure", tenant.keys["alice"], http_client=http, max_retries=0)
        assert sdk.whoami().tenant_id == tenant.tenant
        made = sdk.beliefs.create(**belief_body("prefixed_rule", "project:pay"))
        assert sdk.beliefs.get(made.id or "").id == made.id
        assert [b.id for b in sdk.beliefs.export(scope=["project:pay"])] == [made.id]

    async def scenario() -> tuple[str, str]:
        transport = httpx.ASGITransport(app=proxied)
        async with AsyncTenure("http://testserver/tenure/", team.keys["bob"], transport=transport) as bob:
            return (await bob.whoami()).user_id, (await bob.ready())["status"]

    assert asyncio.run(scenario()) == ("bob", "ready")


def test_connection_failure_names_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    dead = Tenure(f"http://127.0.0.1:{port}", "tnr_x_y", max_retries=1, max_retry_wait_s=0.01)
    with dead, pytest.raises(ConnectionFailed) as failed:
        dead.whoami()
    assert failed.value.url == f"http://127.0.0.1:{port}" and f"127.0.0.1:{port}" in str(failed.value)


@pytest.fixture(scope="module")
def limited(api_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """The same deployment with a budget of 1 request/s and a burst of 2."""
    api = api_settings.api.model_copy(update={"rate_limit_per_s": 1.0, "rate_limit_burst": 2})
    with TestClient(create_app(api_settings.model_copy(update={"api": api}))) as test_client:
        yield test_client


def test_rate_limited_calls_are_retried_after_retry_after(limited: TestClient, team: Team) -> None:
    patient = _sdk(limited, team.keys["carol"], max_retries=3)
    started = time.monotonic()
    for _ in range(4):  # the 3rd and 4th exceed the burst: each waits for the server's Retry-After
        assert patient.whoami().user_id == "carol"
    assert time.monotonic() - started >= 1.0

    impatient = _sdk(limited, team.keys["bob"], max_retries=0)
    for _ in range(2):  # the burst
        impatient.whoami()
    with pytest.raises(RateLimited) as limited_error:
        impatient.whoami()
    assert limited_error.value.retry_after_s and limited_error.value.retry_after_s >= 1


def test_an_export_refused_by_the_rate_limit_is_retried_after_retry_after(limited: TestClient, team: Team) -> None:
    """Every call is retried after a 429 (README "Retries") but the export, which raised
    RateLimited at once: a streamed read is now retried as any read is, until its answer starts."""
    alice = _sdk(limited, team.keys["alice"], max_retries=3)
    made = alice.beliefs.create(**belief_body("exported_when_limited", "project:pay"))
    alice.whoami()  # the burst (2) is spent: the export's first attempt is refused
    started = time.monotonic()
    assert [b.id for b in alice.beliefs.export(scope=["project:pay"])] == [made.id]
    assert time.monotonic() - started >= 0.5  # it waited for the Retry-After

    async def scenario() -> list[str | None]:
        transport = httpx.ASGITransport(app=limited.app)
        async with AsyncTenure("http://testserver", team.keys["bob"], transport=transport, max_retries=3) as bob:
            await bob.whoami()
            await bob.whoami()
            return [b.id async for b in bob.beliefs.export(scope=["project:pay"])]

    assert asyncio.run(scenario()) == [made.id]


def test_chunked_stays_under_the_byte_limit() -> None:
    records = [{"canonical_name": f"n{i}", "content": "x" * 1000} for i in range(50)]
    batches = list(chunked(records, max_bytes=10_000))
    assert [r for b in batches for r in b] == records
    assert all(sum(len(str(r)) for r in b) < 10_000 for b in batches) and len(batches) >= 5


def test_async_client_mirrors_the_sync_one(app: FastAPI, client: TestClient, team: Team) -> None:
    async def scenario() -> tuple[str, list[str], list[str]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            alice = AsyncTenure("http://testserver", team.keys["alice"], http_client=http)
            name = recallable_name("async")
            created = await alice.beliefs.create(**belief_body(name, "project:pay"))
            assert (await alice.beliefs.get(created.id or "")).canonical_name == name
            listed = [b.id async for b in alice.beliefs.iter(page_size=1, scope=["project:pay"])]
            assert created.id in listed and len(listed) == len(set(listed))
            recalled = await alice.recall(name.replace("_", " "), scopes=["project:pay"])
            with pytest.raises(NotFound):
                await AsyncTenure("http://testserver", team.keys["bob"], http_client=http).beliefs.get("b-nope")
            return created.id or "", listed, recalled.injected_ids

    created_id, listed, injected = asyncio.run(scenario())
    assert listed and injected == [created_id]


def test_async_client_has_erase_export_and_ready_as_the_sync_one_does(
    app: FastAPI, client: TestClient, team: Team
) -> None:
    async def scenario() -> tuple[Any, str, list[str], str, list[str]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http:
            alice = AsyncTenure("http://testserver", team.keys["alice"], http_client=http)
            carol = AsyncTenure("http://testserver", team.keys["carol"], http_client=http)
            created = await alice.beliefs.create(**belief_body(recallable_name("async_export"), "project:pay"))
            exported = [b.id or "" async for b in alice.beliefs.export(scope=["project:pay"])]
            receipt = await carol.beliefs.erase(created.id or "")
            after = [b.id or "" async for b in alice.beliefs.export(scope=["project:pay"])]
            return await alice.ready(), created.id or "", exported, receipt.belief_id, after

    ready, created_id, exported, erased, after = asyncio.run(scenario())
    assert ready == client.get("/readyz").json()
    assert created_id in exported and erased == created_id and created_id not in after


def test_openai_and_anthropic_helpers_point_at_the_proxy() -> None:
    tenure = Tenure("http://tenure.example:8000/", "tnr_k_s", session_id="s-9")
    chat = tenure.openai(scopes=["project:pay", "domain:code"])
    assert str(chat.base_url).rstrip("/") == "http://tenure.example:8000/v1" and chat.api_key == "tnr_k_s"
    assert chat.default_headers["X-Tenure-Scope"] == "project:pay,domain:code"
    assert chat.default_headers["X-Session-Id"] == "s-9"
    messages = tenure.anthropic(scopes=["project:pay"])
    assert str(messages.base_url).rstrip("/") == "http://tenure.example:8000" and messages.api_key == "tnr_k_s"


def test_async_iterators_follow_cursors_within_the_callers_walls(
    api_settings: Settings, client: TestClient, team: Team, other_team: Team
) -> None:
    """``AsyncTenure``'s ``iter_users``/``iter_keys``/``iter_audit`` and ``beliefs.iter`` over real
    HTTP (uvicorn): every page followed, nothing twice, and each caller iterates only what its
    credential reads: another tenant's admin and a member get 403 for the admin listings, and
    neither a colleague nor another tenant's member iterates alice's private belief."""
    private = _sdk(client, team.keys["alice"]).beliefs.create(**belief_body("alice_private_editor", "user:alice"))
    shared = _sdk(client, team.keys["alice"]).beliefs.create(**belief_body("shared_pay_runbook", "project:pay"))
    sync_admin = _sdk(client, team.keys["carol"])

    async def scenario(url: str) -> None:
        carol = AsyncTenure(url, team.keys["carol"], max_retries=0)
        stranger = AsyncTenure(url, other_team.keys["carol"], max_retries=0)
        bob = AsyncTenure(url, team.keys["bob"], max_retries=0)
        outsider = AsyncTenure(url, other_team.keys["alice"], max_retries=0)
        async with carol, stranger, bob, outsider:
            issued = {(await carol.admin.issue_key(team.tenant, "bob", name="second")).key_id}
            for n in range(3):
                await carol.admin.create_user(team.tenant, f"extra{n}", projects=["pay"])
                issued.add((await carol.admin.issue_key(team.tenant, f"extra{n}")).key_id)

            users = [u async for u in carol.admin.iter_users(team.tenant, page_size=2)]
            assert sorted(u.user_id for u in users) == ["alice", "bob", "carol", "extra0", "extra1", "extra2"]
            assert all(isinstance(u, models.UserOut) and u.tenant_id == team.tenant for u in users)

            keys = [k async for k in carol.admin.iter_keys(team.tenant, page_size=2)]
            assert len(keys) == len({k.key_id for k in keys}) == 3 + 4  # make_team's three and ours
            assert issued <= {k.key_id for k in keys} and {k.tenant_id for k in keys} == {team.tenant}

            events = [e async for e in carol.admin.iter_audit(page_size=2, action="user.create")]
            expected = [e.event_id for e in sync_admin.admin.iter_audit(page_size=50, action="user.create")]
            assert [e.event_id for e in events] == expected and len(expected) == 6  # three by make_team
            assert all(isinstance(e, models.AuditEvent) and e.tenant_id == team.tenant for e in events)

            for denied in (
                stranger.admin.iter_users(team.tenant),
                stranger.admin.iter_keys(team.tenant),
                stranger.admin.iter_audit(tenant_id=team.tenant),
                bob.admin.iter_users(team.tenant),
                bob.admin.iter_audit(),
            ):
                with pytest.raises(PermissionDenied):
                    await anext(denied)

            bobs = [b.id async for b in bob.beliefs.iter(page_size=1)]
            assert shared.id in bobs and private.id not in bobs and len(bobs) == len(set(bobs))
            assert [b async for b in outsider.beliefs.iter(page_size=1)] == []

    # a second app on the same indices and Redis (one app's MCP session manager starts only once)
    with serve(create_app(api_settings)) as url:
        asyncio.run(scenario(url))


def test_the_keep_alive_transport_answers_as_httpx_s_own(
    api_settings: Settings, client: TestClient, team: Team, other_team: Team
) -> None:
    """``tenure_client.keepalive.KeepAliveTransport`` over real HTTP (uvicorn): the same recall
    (injected ids and block), beliefs and errors as httpx's default transport, over one socket;
    another tenant's member recalls nothing through it either."""
    name = recallable_name("lean")
    created = _sdk(client, team.keys["alice"]).beliefs.create(**belief_body(name, "project:pay"))

    async def recall_twice(url: str, transport: httpx.AsyncBaseTransport | None) -> list[Any]:
        alice = AsyncTenure(url, team.keys["alice"], max_retries=0, transport=transport)
        outsider = AsyncTenure(url, other_team.keys["alice"], max_retries=0, transport=transport)
        async with alice, outsider:
            seen: list[Any] = []
            for _ in range(2):
                recalled = await alice.recall(name.replace("_", " "), scopes=["project:pay"])
                seen.append((recalled.injected_ids, recalled.injection.text))
            seen.append((await alice.beliefs.get(created.id or "")).canonical_name)
            seen.append((await outsider.recall(name.replace("_", " "))).injected_ids)
            with pytest.raises(NotFound) as missing:
                await alice.beliefs.get("b-nope")
            seen.append((missing.value.code, missing.value.status, bool(missing.value.request_id)))
            return seen

    lean = KeepAliveTransport()
    with serve(create_app(api_settings)) as url:
        by_default = asyncio.run(recall_twice(url, None))
        by_lean = asyncio.run(recall_twice(url, lean))
    assert by_lean == by_default
    assert by_lean[0][0] == [created.id] and by_lean[3] == [] and by_lean[4] == ("not_found", 404, True)


def test_the_sync_keep_alive_transport_answers_as_httpx_s_own(
    api_settings: Settings, client: TestClient, team: Team, other_team: Team
) -> None:
    """``tenure_client.keepalive.KeepAliveSyncTransport`` over real HTTP (uvicorn): the same
    recall (injected ids and block), beliefs, streamed JSONL export and errors as httpx's default
    transport; another tenant's member recalls and exports nothing of alice's through it either."""
    name = recallable_name("lean_sync")
    created = _sdk(client, team.keys["alice"]).beliefs.create(**belief_body(name, "project:pay"))

    def recall_twice(url: str, transport: httpx.BaseTransport | None) -> list[Any]:
        alice = Tenure(url, team.keys["alice"], max_retries=0, transport=transport)
        outsider = Tenure(url, other_team.keys["alice"], max_retries=0, transport=transport)
        with alice, outsider:
            seen: list[Any] = []
            for _ in range(2):
                recalled = alice.recall(name.replace("_", " "), scopes=["project:pay"])
                seen.append((recalled.injected_ids, recalled.injection.text))
            seen.append(alice.beliefs.get(created.id or "").canonical_name)
            seen.append(sorted(b.id or "" for b in alice.beliefs.export()))
            seen.append(outsider.recall(name.replace("_", " ")).injected_ids)
            seen.append(created.id in {b.id for b in outsider.beliefs.export()})
            with pytest.raises(NotFound) as missing:
                alice.beliefs.get("b-nope")
            seen.append((missing.value.code, missing.value.status, bool(missing.value.request_id)))
            return seen

    with serve(create_app(api_settings)) as url:
        by_default = recall_twice(url, None)
        by_lean = recall_twice(url, KeepAliveSyncTransport())
    assert by_lean == by_default
    assert by_lean[0][0] == [created.id] and created.id in by_lean[3]
    assert by_lean[4] == [] and by_lean[5] is False and by_lean[6] == ("not_found", 404, True)


def test_revoke_key_takes_the_key_itself_and_never_sends_its_secret(client: TestClient, team: Team) -> None:
    """As the CLI's ``revoke-key``: given the whole key, the SDK put it into the URL (its secret in
    every proxy's access log on the way) and the server refused the path with a 422."""
    sent: list[str] = []
    client.event_hooks["request"].append(lambda request: sent.append(str(request.url)))
    try:
        revoked = _sdk(client, team.keys["carol"]).admin.revoke_key(team.keys["bob"])
    finally:
        client.event_hooks["request"].pop()
    assert revoked.key_id == team.keys["bob"].split("_")[1] and revoked.revoked_at is not None
    secret = team.keys["bob"].split("_", 2)[2]
    assert sent and not any(secret in url for url in sent), sent
