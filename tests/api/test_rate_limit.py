"""Per-credential rate limiting: a Redis token bucket per API key or JWT subject, 429
``rate_limited`` with ``Retry-After`` in the one error shape, atomic across concurrent callers,
and failing open for reads (logged) but closed for writes when Redis is unreachable."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from tenure_client import AsyncTenure

from loadtest.http import sdk_call
from service.api.state import Services
from service.app import create_app
from service.auth.authenticator import Identity
from service.auth.ratelimit import RateLimiter
from service.config import Settings
from service.domain.principal import Principal, Role
from service.errors import RateLimited
from service.lean_redis import LeanRedis, LeanScript, event_loop_redis
from service.loops import LoopBound
from service.storage.audit import AuditQuery
from service.telemetry import metrics
from service.write_versions import TenantVersions
from tests.api.conftest import Team, auth, belief_body, ok

# A slow refill (one token every 4 s): on a loaded 2-core CI box one request can take more than
# half a second, and at 2 tokens/s that refilled the bucket between the requests a test counts.
PER_S, BURST = 0.25, 3


def _with_api(settings: Settings, **api: Any) -> Settings:
    return settings.model_copy(update={"api": settings.api.model_copy(update=api)})


@pytest.fixture(scope="module")
def limited(api_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """The same deployment (same indices and Redis) with a small budget: one request per 4 s, burst 3."""
    settings = _with_api(api_settings, rate_limit_per_s=PER_S, rate_limit_burst=BURST)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _spend(client: TestClient, headers: dict[str, str], n: int = BURST) -> None:
    for _ in range(n):
        ok(client.get("/v1/whoami", headers=headers))


def _limited(response: Any) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details", "request_id"}
    error: dict[str, Any] = body["error"]
    assert error["code"] == "rate_limited" and error["request_id"] == response.headers["X-Request-ID"]
    assert int(response.headers["Retry-After"]) >= 1
    assert 0 < error["details"]["retry_after_ms"] <= 1000 / PER_S
    return error


def test_each_credential_has_its_own_bucket(
    limited: TestClient, team: Team, other_team: Team, services: Services, api_settings: Settings
) -> None:
    _spend(limited, team.h("alice"))
    _limited(limited.get("/v1/whoami", headers=team.h("alice")))
    _limited(limited.post("/v1/recall", json={"scopes": [], "query": "x"}, headers=team.h("alice")))
    # Other users, and the same user name in another tenant, are untouched.
    _spend(limited, team.h("bob"), 1)
    _spend(limited, other_team.h("alice"), 1)
    # Refill at PER_S tokens a second: one token after 1/PER_S seconds, not two.
    time.sleep(1 / PER_S + 0.1)
    ok(limited.get("/v1/whoami", headers=team.h("alice")))
    _limited(limited.get("/v1/whoami", headers=team.h("alice")))
    # An idle bucket expires once it would be full again.
    bucket = f"{api_settings.opensearch_namespace}:rl:key:{team.keys['alice'].split('_')[1]}"
    assert 0 < services.redis.pttl(bucket) <= (BURST / PER_S + 1) * 1000


def test_a_refused_caller_starts_no_early_recall_until_its_retry_after(
    limited: TestClient, team: Team, services: Services
) -> None:
    """A recall may start beside its round trip (service/api/recall_ahead.py); once the limiter
    has refused a credential, none does until its ``Retry-After`` has passed: a caller over its
    limit costs at most one discarded recall per window, not one per request."""
    ahead = metrics.RECALL_AHEAD
    before = ahead.labels("used")._value.get(), ahead.labels("discarded")._value.get()
    _spend(limited, team.h("bob"))  # the tenant's write version seen by these round trips
    body = {"scopes": ["project:pay"], "query": "anything sized"}
    _limited(limited.post("/v1/recall", json=body, headers=team.h("bob")))  # started, then refused
    after_first = ahead.labels("used")._value.get(), ahead.labels("discarded")._value.get()
    assert (after_first[0] - before[0], after_first[1] - before[1]) == (0, 1)
    for _ in range(3):
        _limited(limited.post("/v1/recall", json=body, headers=team.h("bob")))
    assert (ahead.labels("used")._value.get(), ahead.labels("discarded")._value.get()) == after_first
    # another credential of the tenant is not held back by bob's refusal
    _spend(limited, team.h("carol"), 1)
    ok(limited.post("/v1/recall", json=body, headers=team.h("carol")))
    assert ahead.labels("used")._value.get() == after_first[0] + 1


def test_the_load_generator_counts_each_429_through_the_sdk(limited: TestClient, team: Team) -> None:
    """The load test sends its requests through the SDK with retries off: a 429 is one recorded
    answer with its Retry-After, not a retried (and hidden) one (with retries the SDK would wait
    the Retry-After and come back with the refilled token's 200)."""

    async def outcomes() -> list[tuple[int | None, str, str | None]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limited.app)) as http:
            sdk = AsyncTenure("http://testserver", team.keys["alice"], http_client=http, max_retries=0)
            answers = [await sdk_call(sdk.whoami(), 200) for _ in range(BURST + 1)]
        return [(a.status, a.kind, a.retry_after) for a in answers]

    answers = asyncio.run(outcomes())
    assert answers[:BURST] == [(200, "200", None)] * BURST
    status, kind, retry_after = answers[BURST]
    assert (status, kind) == (429, "429") and retry_after is not None and int(retry_after) >= 1


def test_tokens_of_one_subject_share_a_bucket(client: TestClient, limited: TestClient, team: Team) -> None:
    url = f"/v1/admin/tenants/{team.tenant}/users/bob/tokens"
    first, second = (ok(client.post(url, json={}, headers=team.h("carol")), 201)["token"] for _ in range(2))
    _spend(limited, auth(first))
    _limited(limited.get("/v1/whoami", headers=auth(second)))  # a fresh token buys nothing
    ok(limited.get("/v1/whoami", headers=team.h("bob")))  # bob's API key is another credential


def test_one_request_is_one_token_however_many_dependencies_need_the_credential(
    limited: TestClient, team: Team
) -> None:
    """The audit route resolves the credential through AdminPrincipal -> CurrentPrincipal ->
    CurrentIdentity: still one charge per request."""
    for _ in range(BURST):
        ok(limited.get("/v1/admin/audit", headers=team.h("carol")))
    _limited(limited.get("/v1/admin/audit", headers=team.h("carol")))


def test_unauthenticated_requests_are_not_charged(limited: TestClient, team: Team) -> None:
    for _ in range(BURST + 2):
        assert limited.get("/v1/whoami").status_code == 401
    _spend(limited, team.h("alice"))


def test_concurrent_requests_never_overspend(services: Services) -> None:
    """The bucket update is atomic: 60 simultaneous charges against a burst of 10 (refill
    negligible) admit exactly 10. A read-then-write without the script would admit more."""
    limiter = RateLimiter(services.redis, f"rl-{uuid.uuid4().hex[:8]}", per_s=0.001, burst=10)
    identity = Identity(Principal(tenant_id="t-rl", user_id="u"), "api_key", uuid.uuid4().hex[:16])

    def attempt(_: int) -> bool:
        try:
            limiter.charge(identity, read_only=True)
        except RateLimited:
            return False
        return True

    with ThreadPoolExecutor(max_workers=20) as pool:
        admitted = sum(pool.map(attempt, range(60)))
    assert admitted == 10


def test_zero_rate_turns_the_limiter_off(services: Services) -> None:
    namespace = f"rl-{uuid.uuid4().hex[:8]}"
    limiter = RateLimiter(services.redis, namespace, per_s=0, burst=1)
    identity = Identity(Principal(tenant_id="t-rl", user_id="u"), "jwt", None)
    for _ in range(5):
        assert limiter.charge(identity, read_only=False) == TenantVersions(0, 0)  # the tenant's versions, never written
    assert services.redis.keys(f"{namespace}:*") == []  # no bucket kept (the version is only read)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def redis_down(api_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """The deployment with Redis unreachable (nothing listens on the port); OpenSearch is up."""
    settings = _with_api(api_settings, rate_limit_per_s=PER_S, rate_limit_burst=BURST).model_copy(
        update={"redis_url": f"redis://127.0.0.1:{_closed_port()}/0"}
    )
    app: FastAPI = create_app(settings)
    with TestClient(app) as test_client:
        yield test_client


def test_redis_down_lets_reads_through_and_logs_but_refuses_writes(
    redis_down: TestClient, team: Team, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.auth.ratelimit"):
        for _ in range(BURST + 2):  # more than the budget: nothing is counted while Redis is away
            assert ok(redis_down.get("/v1/whoami", headers=team.h("alice")))["user_id"] == "alice"
    assert any("rate limiter unavailable" in r.getMessage() for r in caplog.records)
    write = redis_down.post("/v1/beliefs", json={"type": "preference"}, headers=team.h("alice"))
    assert write.status_code == 503, write.text
    error = write.json()["error"]
    assert error["code"] == "store_unavailable" and "rate limit" in error["message"]
    assert int(write.headers["Retry-After"]) >= 1


def test_openapi_documents_the_429(app: FastAPI) -> None:
    responses = app.openapi()["paths"]["/v1/beliefs"]["get"]["responses"]
    assert "429" in responses and "ErrorOut" in str(responses["429"])


def test_redis_down_still_serves_recall_and_records_its_receipt_directly(
    redis_down: TestClient, client: TestClient, team: Team, services: Services
) -> None:
    ok(client.post("/v1/beliefs", json=belief_body("kafka_topics"), headers=team.h("alice")), 201)
    body = {"scopes": ["domain:code"], "query": "how are kafka topics named?", "session_id": "redis-down"}
    recalled = ok(redis_down.post("/v1/recall", json=body, headers=team.h("alice")))
    assert [b["canonical_name"] for b in recalled["tiers"]["relevant"]] == ["kafka_topics"]
    services.audit.refresh()  # written synchronously: no outbox to drain
    admin = Principal(tenant_id=team.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    events, _ = services.audit.search(admin, AuditQuery(session_id="redis-down"), size=5, after=None)
    assert [e.event_id for e in events] == [recalled["receipt_id"]]


def test_one_round_trip_survives_a_flushed_script_cache(services: Services) -> None:
    """The bucket script runs by SHA in the request's one pipeline; after a Redis restart or a
    SCRIPT FLUSH it is loaded again on NOSCRIPT and the charge still counts exactly once."""
    namespace = f"rl-{uuid.uuid4().hex[:8]}"
    limiter = RateLimiter(services.redis, namespace, per_s=0.001, burst=2)
    identity = Identity(Principal(tenant_id="t-flush", user_id="u"), "jwt", None)
    services.redis.script_flush()
    assert limiter.charge(identity, read_only=True) == TenantVersions(0, 0)
    assert limiter.charge(identity, read_only=True) == TenantVersions(0, 0)
    with pytest.raises(RateLimited):
        limiter.charge(identity, read_only=True)


def test_the_event_loop_charges_through_the_lean_client_and_survives_a_flushed_script_cache(
    services: Services,
) -> None:
    """The API's loop talks to Redis through ``LeanRedis`` (rate limit and receipts); its charge is
    the same one round trip, loaded again on NOSCRIPT after a SCRIPT FLUSH, counted once."""
    assert isinstance(services.limiter.async_redis and services.limiter.async_redis.client, LeanRedis)
    assert isinstance(services.receipts.outbox._aadd and services.receipts.outbox._aadd.client, LeanScript)
    namespace = f"rl-{uuid.uuid4().hex[:8]}"
    identity = Identity(Principal(tenant_id="t-flush-async", user_id="u"), "jwt", None)

    async def charges() -> list[TenantVersions]:
        client = event_loop_redis(services.settings.redis_url)
        limiter = RateLimiter(services.redis, namespace, per_s=0.001, burst=2, async_redis=LoopBound.here(client))
        try:
            services.redis.script_flush()
            answers = [await limiter.acharge(identity, read_only=True) for _ in range(2)]
            with pytest.raises(RateLimited):
                await limiter.acharge(identity, read_only=True)
            return answers
        finally:
            await client.aclose()  # type: ignore[union-attr]  # redis>=5 (the stubs are 4.x)

    assert asyncio.run(charges()) == [TenantVersions(0, 0), TenantVersions(0, 0)]
