"""Credentials: JWTs (HS256 dev, RS256/ES256 via JWKS) and API keys, good and bad."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.auth.tokens import TokenVerifier
from service.config import AuthSettings, Settings
from service.console.sessions import SessionStore
from service.errors import Unauthenticated
from tests.api.conftest import HS_SECRET, SigningKeys, Team, auth, belief_body, ok, sign_jwt


def _claims(team: Team, **over: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {
        "iss": "tenure",
        "aud": "tenure-api",
        "sub": "alice",
        "tenant_id": team.tenant,
        "roles": ["member"],
        "projects": ["pay"],
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }
    claims.update(over)
    return claims


def _sign(alg: str, key: Any, claims: dict[str, Any], kid: str | None = None) -> str:
    header = {"alg": alg, "typ": "JWT", **({"kid": kid} if kid else {})}
    return sign_jwt(header, claims, key)


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def _whoami(client: TestClient, token: str) -> Any:
    return client.get("/v1/whoami", headers=auth(token))


def _rejected(response: Any) -> None:
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["error"]["code"] == "unauthenticated"
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_hs256_dev_token_maps_claims_to_principal(client: TestClient, team: Team) -> None:
    me = ok(_whoami(client, _sign("HS256", HS_SECRET.encode(), _claims(team))))
    assert me == {
        "tenant_id": team.tenant,
        "user_id": "alice",
        "roles": ["member"],
        "projects": ["pay"],
        "teams": [],
        "credential": "jwt",
        "credential_id": None,
    }


def test_rs256_and_es256_verified_against_jwks(client: TestClient, team: Team, signing_keys: SigningKeys) -> None:
    rs = _sign("RS256", signing_keys.rsa, _claims(team, roles=["member", "admin"]), kid="rsa-1")
    assert ok(_whoami(client, rs))["roles"] == ["admin", "member"]
    es = _sign("ES256", signing_keys.ec, _claims(team, sub="bob"), kid="ec-1")
    assert ok(_whoami(client, es))["user_id"] == "bob"


@pytest.mark.parametrize(
    ("case", "over"),
    [
        ("expired", {"exp": int(time.time()) - 3600}),
        ("not yet valid", {"nbf": int(time.time()) + 3600}),
        ("wrong audience", {"aud": "someone-else"}),
        ("wrong issuer", {"iss": "evil"}),
        ("no tenant", {"tenant_id": None}),
    ],
)
def test_bad_claims_rejected(client: TestClient, team: Team, case: str, over: dict[str, Any]) -> None:
    claims = {k: v for k, v in _claims(team, **over).items() if v is not None}
    _rejected(_whoami(client, _sign("HS256", HS_SECRET.encode(), claims)))


def test_alg_none_rejected(client: TestClient, team: Team) -> None:
    token = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(_claims(team))}."
    _rejected(_whoami(client, token))


def test_tampered_signature_and_payload_rejected(client: TestClient, team: Team, signing_keys: SigningKeys) -> None:
    token = _sign("RS256", signing_keys.rsa, _claims(team), kid="rsa-1")
    head, payload, sig = token.split(".")
    flipped = sig[:-4] + ("AAAA" if sig[-4:] != "AAAA" else "BBBB")
    _rejected(_whoami(client, f"{head}.{payload}.{flipped}"))
    escalated = _b64(_claims(team, roles=["admin"], projects=["pay", "secret"]))
    _rejected(_whoami(client, f"{head}.{escalated}.{sig}"))


def test_wrong_key_rejected(client: TestClient, team: Team) -> None:
    _rejected(_whoami(client, _sign("HS256", b"not-the-secret-but-long-enough-000000", _claims(team))))


def test_hs_rs_confusion_rejected(client: TestClient, team: Team, signing_keys: SigningKeys) -> None:
    """An HS256 token 'signed' with the public RSA key (PEM or JWK JSON) must not verify."""
    public_pem = signing_keys.rsa.as_pem(private=False)
    public_jwk = json.dumps(signing_keys.rsa.as_dict(private=False)).encode()
    for material in (public_pem, public_jwk):
        signing_input = f"{_b64({'alg': 'HS256', 'kid': 'rsa-1'})}.{_b64(_claims(team))}"
        mac = hmac.new(material, signing_input.encode(), hashlib.sha256).digest()
        sig = base64.urlsafe_b64encode(mac).decode().rstrip("=")
        _rejected(_whoami(client, f"{signing_input}.{sig}"))
    # and an RS256 header on an HMAC signature
    hs = _sign("HS256", HS_SECRET.encode(), _claims(team))
    _, payload, sig = hs.split(".")
    _rejected(_whoami(client, f"{_b64({'alg': 'RS256', 'kid': 'rsa-1'})}.{payload}.{sig}"))


def test_hs256_refused_when_not_configured(signing_keys: SigningKeys) -> None:
    verifier = TokenVerifier(AuthSettings(jwks_file=str(signing_keys.jwks_path)))
    token = _sign("HS256", b"whatever-secret-0123456789-0123456789", {"sub": "x", "tenant_id": "t"})
    with pytest.raises(Unauthenticated):
        verifier.verify(token)


@pytest.mark.parametrize("header", [None, "Bearer ", "Basic abc", "Bearer tnr_nothex_x", "Bearer garbage.token.here"])
def test_missing_or_malformed_credentials(client: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    response = client.get("/v1/whoami", headers=headers)
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "unauthenticated"


def test_api_key_is_prefixed_hashed_and_tracks_last_use(client: TestClient, team: Team, services: Services) -> None:
    key = team.keys["alice"]
    assert key.startswith("tnr_")
    key_id = key.split("_")[1]
    record = services.accounts.get_key(key_id)
    assert key not in json.dumps(record.model_dump(mode="json"))  # only the hash is stored
    assert ok(client.get("/v1/whoami", headers=auth(key)))["credential_id"] == key_id
    deadline = time.monotonic() + 10  # written off the request path, by a background thread
    while services.accounts.get_key(key_id).last_used_at is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert services.accounts.get_key(key_id).last_used_at is not None


def test_wrong_secret_for_existing_key_id_rejected(client: TestClient, team: Team) -> None:
    key = team.keys["alice"]
    forged = key[:-5] + ("A" * 5 if not key.endswith("AAAAA") else "B" * 5)
    _rejected(client.get("/v1/whoami", headers=auth(forged)))


def test_revoked_key_rejected_at_once(client: TestClient, team: Team, operator: dict[str, str]) -> None:
    key = team.keys["bob"]
    ok(client.get("/v1/whoami", headers=auth(key)))  # cached now
    key_id = key.split("_")[1]
    revoked = ok(client.delete(f"/v1/admin/keys/{key_id}", headers=team.h("carol")))
    assert revoked["revoked_at"] is not None
    _rejected(client.get("/v1/whoami", headers=auth(key)))
    assert client.get(f"/v1/admin/tenants/{team.tenant}/keys", headers=operator).status_code == 200


def test_revocation_reaches_other_processes_within_cache_bound(
    client: TestClient, team: Team, services: Services, api_settings: Settings
) -> None:
    """A second authenticator (another process) caching the key stops accepting it within
    ``api_key_cache_s``."""
    from service.auth.authenticator import Authenticator

    settings = api_settings.auth.model_copy(update={"api_key_cache_s": 0.5})
    other = Authenticator(settings, services.accounts, services.verifier, services.redis, "other-process")
    key = team.keys["alice"]
    assert other.authenticate(key).principal.user_id == "alice"
    ok(client.delete(f"/v1/admin/keys/{key.split('_')[1]}", headers=team.h("alice")))  # own key
    time.sleep(0.6)
    with pytest.raises(Unauthenticated):
        other.authenticate(key)


def test_key_grants_narrow_and_follow_user_grants(client: TestClient, team: Team, operator: dict[str, str]) -> None:
    narrow = ok(
        client.post(
            f"/v1/admin/tenants/{team.tenant}/users/alice/keys", json={"projects": []}, headers=team.h("carol")
        ),
        201,
    )
    assert ok(client.get("/v1/whoami", headers=auth(narrow["key"])))["projects"] == []
    too_wide = client.post(
        f"/v1/admin/tenants/{team.tenant}/users/bob/keys", json={"teams": ["core"]}, headers=team.h("carol")
    )
    assert too_wide.status_code == 422
    # Taking a grant from the user narrows the user's existing keys too (after the cache bound).
    ok(
        client.patch(
            f"/v1/admin/tenants/{team.tenant}/users/bob/grants", json={"remove_projects": ["pay"]}, headers=operator
        )
    )
    fresh = ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/keys", json={}, headers=operator), 201)
    assert ok(client.get("/v1/whoami", headers=auth(fresh["key"])))["projects"] == []


def test_dev_token_endpoint(client: TestClient, team: Team) -> None:
    issued = ok(
        client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/tokens", json={"ttl_s": 120}, headers=team.h("carol")),
        201,
    )
    me = ok(client.get("/v1/whoami", headers=auth(issued["token"])))
    assert (me["tenant_id"], me["user_id"], me["projects"]) == (team.tenant, "bob", ["pay"])
    member = client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/tokens", json={}, headers=team.h("alice"))
    assert member.status_code == 403


def test_dev_token_grants_follow_the_user_grants_at_once(
    client: TestClient, team: Team, operator: dict[str, str]
) -> None:
    """A development token copies its user's grants when issued; a grant taken back applies to it
    at once, as to the user's API keys, not when the token expires (up to 30 days later)."""
    pinned = belief_body("settlement_window", scope="project:pay", pinned=True)
    shared = ok(client.post("/v1/beliefs", json=pinned, headers=team.h("alice")), 201)["id"]
    token = ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/tokens", json={}, headers=team.h("carol")), 201)[
        "token"
    ]
    recall = {"scopes": ["project:pay"], "query": "settlement window"}

    def recalled() -> list[str]:
        return list(ok(client.post("/v1/recall", json=recall, headers=auth(token)))["injected_ids"])

    assert ok(client.get("/v1/whoami", headers=auth(token)))["projects"] == ["pay"]
    assert shared in recalled()
    grants = f"/v1/admin/tenants/{team.tenant}/users/bob/grants"
    ok(client.patch(grants, json={"remove_projects": ["pay"]}, headers=operator))
    assert ok(client.get("/v1/whoami", headers=auth(token)))["projects"] == []
    assert shared not in recalled()
    # given back, the grant counts again; the token never holds more than it was issued with
    ok(client.patch(grants, json={"add_projects": ["pay", "ops"]}, headers=operator))
    assert ok(client.get("/v1/whoami", headers=auth(token)))["projects"] == ["pay"]
    assert shared in recalled()


def test_a_console_session_of_a_dev_token_follows_the_user_grants(
    client: TestClient, team: Team, operator: dict[str, str], services: Services
) -> None:
    """A console session keeps the token's claims, not its grants at sign-in, and narrows them on
    every request: a grant taken back applies at once, one given back counts again."""
    token = ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/tokens", json={}, headers=team.h("carol")), 201)[
        "token"
    ]
    sessions = SessionStore(services.redis, "test-console-grants", idle_s=60, max_s=600)
    session = sessions.open(services.authenticator.authenticate(token))

    def projects_now() -> frozenset[str]:
        return services.authenticator.revalidate(session.identity()).principal.projects

    assert projects_now() == {"pay"}
    grants = f"/v1/admin/tenants/{team.tenant}/users/bob/grants"
    ok(client.patch(grants, json={"remove_projects": ["pay"]}, headers=operator))
    assert projects_now() == frozenset()
    ok(client.patch(grants, json={"add_projects": ["pay"]}, headers=operator))
    assert projects_now() == {"pay"}


def test_dev_token_revocation(client: TestClient, team: Team) -> None:
    url = f"/v1/admin/tenants/{team.tenant}/users/bob/tokens"
    first = ok(client.post(url, json={}, headers=team.h("carol")), 201)["token"]
    second = ok(client.post(url, json={}, headers=team.h("carol")), 201)["token"]
    ok(client.get("/v1/whoami", headers=auth(first)))
    # another member may not revoke bob's token; bob himself and the tenant admin may
    denied = client.post("/v1/admin/tokens/revoke", json={"token": first}, headers=team.h("alice"))
    assert denied.status_code == 403
    revoked = ok(client.post("/v1/admin/tokens/revoke", json={"token": first}, headers=auth(first)))
    assert revoked["revoked"] is True and revoked["jti"].startswith("dev-")
    _rejected(client.get("/v1/whoami", headers=auth(first)))
    ok(client.get("/v1/whoami", headers=auth(second)))  # only that token
    ok(client.post("/v1/admin/tokens/revoke", json={"token": second}, headers=team.h("carol")))
    _rejected(client.get("/v1/whoami", headers=auth(second)))
    forged = client.post("/v1/admin/tokens/revoke", json={"token": "a.b.c"}, headers=team.h("carol"))
    assert forged.status_code == 422  # the body's token is at fault, not the caller's credential
