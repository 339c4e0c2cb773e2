"""Issue 10 findings on credentials and budgets, replayed over HTTP against the real stack:

- a JWT revocation is keyed on issuer + tenant + subject + jti (revoking tenant B's token never
  revokes tenant A's token with the same jti);
- ``tenant_id``/``sub`` claims must be slugs (``*``, ``t:x``, newlines are refused);
- failed authentication is limited per client address and per key id (429), and a credential
  that can never become valid is answered from a negative cache, without the key lookup;
- rate limits are per credential and per tenant (more keys buy no more requests);
- ``POST /v1/turns`` with a colleague's turn id is a 409, not a retryable 503;
- no error carries OpenSearch's text or internal document ids.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch

from service.app import create_app
from service.config import Settings
from service.storage.templates import ACCOUNTS
from tests.api.conftest import HS_SECRET, Team, auth, belief_body, ok, services_of, sign_jwt


def _token(tenant: str, sub: str, jti: str, **extra: Any) -> str:
    now = int(time.time())
    claims = {
        "iss": "tenure",
        "aud": "tenure-api",
        "sub": sub,
        "tenant_id": tenant,
        "roles": ["member"],
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "jti": jti,
        **extra,
    }
    return sign_jwt({"alg": "HS256", "typ": "JWT"}, claims, HS_SECRET.encode())


def test_revoking_a_token_of_one_tenant_leaves_the_same_jti_of_another_tenant_valid(
    client: TestClient, team: Team, other_team: Team
) -> None:
    jti = f"shared-{uuid.uuid4().hex}"
    ours, theirs = _token(team.tenant, "alice", jti), _token(other_team.tenant, "alice", jti)
    assert ok(client.get("/v1/whoami", headers=auth(ours)))["tenant_id"] == team.tenant
    ok(client.post("/v1/admin/tokens/revoke", json={"token": theirs}, headers=other_team.h("carol")))
    assert client.get("/v1/whoami", headers=auth(theirs)).status_code == 401
    assert ok(client.get("/v1/whoami", headers=auth(ours)))["tenant_id"] == team.tenant
    # and the same jti of another subject of the same tenant stays valid too
    bobs = _token(other_team.tenant, "bob", jti)
    assert ok(client.get("/v1/whoami", headers=auth(bobs)))["user_id"] == "bob"


@pytest.mark.parametrize(
    ("tenant", "sub"),
    [("*", "alice"), ("t:x", "alice"), ("ok\nforged", "alice"), (None, "*"), (None, "a b"), (None, "Alice")],
)
def test_token_claims_must_be_slugs(client: TestClient, team: Team, tenant: str | None, sub: str) -> None:
    token = _token(tenant or team.tenant, sub, uuid.uuid4().hex)
    response = client.get("/v1/whoami", headers=auth(token))
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "unauthenticated"


def _with_api(settings: Settings, **api: Any) -> Settings:
    return settings.model_copy(update={"api": settings.api.model_copy(update=api)})


@pytest.fixture
def strict(api_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """The same deployment with a small failed-authentication budget: burst 3, 0.2/s. A fresh
    namespace-wide guard per test: each test gets its own app (and in-process blocks)."""
    settings = _with_api(api_settings, failed_auth_per_s=0.2, failed_auth_burst=3)
    with TestClient(create_app(settings), client=(f"10.9.{uuid.uuid4().int % 250}.7", 5000)) as test_client:
        yield test_client


def test_failed_authentication_is_limited_per_client_address(strict: TestClient, team: Team) -> None:
    for _ in range(3):
        wrong = f"tnr_{uuid.uuid4().hex[:16]}_{'x' * 43}"
        assert strict.get("/v1/whoami", headers=auth(wrong)).status_code == 401
    refused = strict.get("/v1/whoami", headers=auth(f"tnr_{uuid.uuid4().hex[:16]}_{'y' * 43}"))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limited" and int(refused.headers["Retry-After"]) >= 1
    # the address is blocked, whatever it sends next (without verifying it)
    assert strict.get("/v1/whoami", headers=team.h("alice")).status_code == 429
    # a request without credentials is not a failed authentication
    assert strict.get("/v1/whoami").status_code == 401


def test_failed_authentication_is_limited_per_key_id(api_settings: Settings, os_client: OpenSearch, team: Team) -> None:
    """Guessing the secret of one key id from two addresses (two API processes sharing Redis): once
    the key id's budget is spent, the second address is refused for that key id at its first try,
    while its other requests pass."""
    # one token per 100 s: starting the second app takes seconds on a loaded box, and at 0.2/s a
    # token came back before its first try (failed under load: 401 instead of 429)
    settings = _with_api(api_settings, failed_auth_per_s=0.01, failed_auth_burst=3)
    key_id = team.keys["bob"].split("_")[1]
    with TestClient(create_app(settings), client=(f"10.8.1.{uuid.uuid4().int % 250}", 1)) as first:
        for i in range(3):
            assert first.get("/v1/whoami", headers=auth(f"tnr_{key_id}_{'z' * 42}{i}")).status_code == 401
    with TestClient(create_app(settings), client=(f"10.8.2.{uuid.uuid4().int % 250}", 1)) as second:
        response = second.get("/v1/whoami", headers=auth(f"tnr_{key_id}_{'w' * 43}"))
        assert response.status_code == 429, response.text
        assert response.json()["error"]["code"] == "rate_limited"
        # the second address itself is not blocked: another key from it passes
        assert ok(second.get("/v1/whoami", headers=team.h("alice")))["user_id"] == "alice"


def _account_gets(os_client: OpenSearch, namespace: str) -> int:
    stats = os_client.indices.stats(index=ACCOUNTS.alias(namespace), metric="get")
    return int(stats["_all"]["total"]["get"]["total"])


def test_a_refused_credential_is_answered_from_the_negative_cache(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings
) -> None:
    key_id = team.keys["alice"].split("_")[1]
    forged = f"tnr_{key_id}_{'q' * 43}"  # a real key id, a wrong secret
    assert client.get("/v1/whoami", headers=auth(forged)).status_code == 401
    before = _account_gets(os_client, api_settings.opensearch_namespace)
    for _ in range(10):
        response = client.get("/v1/whoami", headers=auth(forged))
        assert response.status_code == 401 and response.json()["error"]["message"] == "invalid or revoked API key"
    assert _account_gets(os_client, api_settings.opensearch_namespace) == before
    assert ok(client.get("/v1/whoami", headers=team.h("alice")))["user_id"] == "alice"


def test_rate_limit_is_per_tenant_as_well_as_per_credential(
    api_settings: Settings, os_client: OpenSearch, client: TestClient, team: Team, other_team: Team
) -> None:
    settings = _with_api(api_settings, tenant_rate_limit_per_s=0.1, tenant_rate_limit_burst=4)
    with TestClient(create_app(settings)) as limited:
        # four credentials of one tenant (one each would be far under its own budget) ...
        extra = ok(
            client.post(
                f"/v1/admin/tenants/{team.tenant}/users/carol/keys", json={"name": "second"}, headers=team.h("carol")
            ),
            201,
        )["key"]
        for headers in (team.h("alice"), team.h("bob"), team.h("carol"), auth(extra)):
            ok(limited.get("/v1/whoami", headers=headers))
        # ... spend the tenant's budget: a fifth key buys nothing
        response = limited.get("/v1/whoami", headers=team.h("alice"))
        assert response.status_code == 429, response.text
        assert "tenant" in response.json()["error"]["message"]
        assert response.json()["error"]["details"]["bucket"] == "tenant"
        # another tenant has its own budget
        ok(limited.get("/v1/whoami", headers=other_team.h("alice")))


def test_posting_a_turn_under_a_colleagues_turn_id_is_a_conflict(client: TestClient, team: Team) -> None:
    turn_id = f"turn-{uuid.uuid4().hex}"
    body = {"turn_id": turn_id, "model": "gpt-4o", "user_message": "hi", "assistant_message": "hello"}
    ok(client.post("/v1/turns", json=body, headers=team.h("alice")), 202)
    response = client.post("/v1/turns", json=body, headers=team.h("bob"))
    assert response.status_code == 409, response.text
    assert "Retry-After" not in response.headers
    error = response.json()["error"]
    assert error["code"] == "conflict" and turn_id in error["message"]
    # alice posting her own turn again is idempotent, and bob still cannot read it
    assert ok(client.post("/v1/turns", json=body, headers=team.h("alice")))["turn_id"] == turn_id
    assert client.get(f"/v1/turns/{turn_id}", headers=team.h("bob")).status_code == 404


def test_errors_never_carry_opensearch_text_or_internal_ids(client: TestClient, team: Team) -> None:
    record = {**belief_body("dup_probe"), "id": "b-dup-probe"}
    ok(client.post("/v1/beliefs/import", json=[record], headers=team.h("alice")))
    again = ok(client.post("/v1/beliefs/import", json=[record], headers=team.h("alice")))
    failure = again["failed"]["b-dup-probe"]
    assert failure["code"] == "conflict"
    assert f"{team.tenant}:" not in failure["message"] and "version conflict" not in failure["message"]
    created = client.post("/v1/beliefs", json=record, headers=team.h("alice"))
    assert created.status_code == 409 and f"{team.tenant}:" not in created.text


def test_a_token_not_valid_yet_is_accepted_once_its_nbf_has_passed(client: TestClient, team: Team) -> None:
    """A token whose ``nbf`` (or ``iat``) lies beyond the leeway will become valid: refused now,
    it must not be remembered in the negative cache as a credential that never becomes valid
    (it was refused for the cache's 60 s after its ``nbf``, a clock skew of a few seconds
    between an identity provider and the API turned into a minute of 401s)."""
    leeway = services_of(client).settings.auth.jwt_leeway_s
    for claim in ("nbf", "iat"):
        soon = int(time.time()) + leeway + 2
        token = _token(team.tenant, "alice", uuid.uuid4().hex, **{claim: soon})
        assert client.get("/v1/whoami", headers=auth(token)).status_code == 401
        time.sleep(max(0.0, soon - leeway - time.time()) + 1.1)
        assert ok(client.get("/v1/whoami", headers=auth(token)))["user_id"] == "alice", claim


@pytest.mark.parametrize("exp", ["fractional", "beyond redis"])
def test_a_token_with_any_numeric_exp_can_be_revoked(client: TestClient, team: Team, exp: str) -> None:
    """``exp`` is a NumericDate, any JSON number (RFC 7519 2): a token whose ``exp`` has a
    fraction was accepted but its revocation answered 422 "this token has no jti/exp claim"; one
    whose ``exp`` lies past what Redis can expire answered 503 "Redis is unreachable" forever."""
    value = time.time() + 600.25 if exp == "fractional" else 10**20
    token = _token(team.tenant, "alice", uuid.uuid4().hex, exp=value)
    assert ok(client.get("/v1/whoami", headers=auth(token)))["user_id"] == "alice"
    revoked = ok(client.post("/v1/admin/tokens/revoke", json={"token": token}, headers=team.h("carol")))
    assert revoked["revoked"] is True
    assert client.get("/v1/whoami", headers=auth(token)).status_code == 401


def test_revoking_a_token_that_does_not_verify_is_the_bodys_fault_not_the_callers(
    client: TestClient, team: Team
) -> None:
    """The caller's own key is fine: a token in the body that does not verify (expired, forged,
    an API key pasted by mistake) answered 401 ``unauthenticated`` with ``WWW-Authenticate``, which
    clients take for their own credential failing (the CLI told the admin to check their key)."""
    expired = _token(team.tenant, "alice", uuid.uuid4().hex, exp=int(time.time()) - 3600)
    for token in (expired, "a.b.c", team.keys["bob"]):
        response = client.post("/v1/admin/tokens/revoke", json={"token": token}, headers=team.h("carol"))
        assert response.status_code == 422, response.text
        assert response.json()["error"]["details"][0]["loc"] == ["body", "token"]
        assert "WWW-Authenticate" not in response.headers
    assert ok(client.get("/v1/whoami", headers=team.h("carol")))["user_id"] == "carol"


def test_token_claims_with_a_trailing_newline_are_no_slugs(client: TestClient, team: Team) -> None:
    """Python's ``$`` also matches before a final newline: ``alice\\n`` passed the slug check of
    ``sub`` and ``tenant_id`` and reached cache keys, Redis keys and audit records; and a subject
    ``alice\\n`` has no account record, so a disabled alice's token with it was not refused."""
    ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/alice/disable", headers=team.h("carol")))
    for tenant, sub in ((team.tenant, "alice\n"), (f"{team.tenant}\n", "alice")):
        response = client.get("/v1/whoami", headers=auth(_token(tenant, sub, uuid.uuid4().hex)))
        assert response.status_code == 401, response.text


def test_a_key_sent_in_a_path_is_not_written_to_the_access_log(
    client: TestClient, team: Team, caplog: pytest.LogCaptureFixture
) -> None:
    """``revoke-key`` takes a key id or the key itself (the CLI cuts the id out); a client that
    put the whole key into ``DELETE /v1/admin/keys/{key_id}`` had its secret in the access log."""
    key = team.keys["bob"]
    secret = key.split("_", 2)[2]
    with caplog.at_level(logging.INFO, logger="tenure.access"):
        assert client.delete(f"/v1/admin/keys/{key}", headers=team.h("carol")).status_code == 422
        assert client.get(f"/v1/beliefs/{key}", headers=team.h("bob")).status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "tenure.access"]
    assert len(lines) == 2 and all(key.split("_")[1] in line for line in lines), lines
    assert not any(secret in line for line in lines), lines
