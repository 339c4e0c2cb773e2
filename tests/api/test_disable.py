"""Disabling and re-enabling users (tenant admins) and tenants (operators) over HTTP: every key and
token stops working, other users and tenants are untouched, each change is audited, and other
processes follow within the cache bound."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.auth.authenticator import Authenticator
from service.config import Settings
from service.errors import Unauthenticated
from service.storage.accounts import AccountStore
from service.storage.client import build_client
from tests.api.conftest import HS_SECRET, Team, auth, ok, sign_jwt


def _refused(response: Any) -> None:
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "unauthenticated"


def _dev_token(client: TestClient, team: Team, user: str) -> str:
    url = f"/v1/admin/tenants/{team.tenant}/users/{user}/tokens"
    return str(ok(client.post(url, json={}, headers=team.h("carol")), 201)["token"])


def _actions(client: TestClient, services: Services, tenant: str, headers: dict[str, str]) -> list[tuple[str, Any]]:
    services.audit.refresh()
    items = ok(client.get("/v1/admin/audit", params={"tenant_id": tenant}, headers=headers))["items"]
    return [(e["action"], e["details"].get("user_id")) for e in items]


def test_tenant_admin_disables_and_reenables_a_user(client: TestClient, team: Team, services: Services) -> None:
    users = f"/v1/admin/tenants/{team.tenant}/users"
    bob_token = _dev_token(client, team, "bob")
    ok(client.get("/v1/whoami", headers=team.h("bob")))  # bob's key is cached in this process now
    ok(client.get("/v1/whoami", headers=auth(bob_token)))

    disabled = ok(client.post(f"{users}/bob/disable", headers=team.h("carol")))
    assert disabled["user_id"] == "bob" and disabled["disabled"] is True
    # Both credential kinds are refused at once in the process that handled the change.
    _refused(client.get("/v1/whoami", headers=team.h("bob")))
    _refused(client.get("/v1/beliefs", headers=auth(bob_token)))
    ok(client.get("/v1/whoami", headers=team.h("alice")))  # nobody else is affected
    assert ok(client.get(f"{users}/bob", headers=team.h("carol")))["disabled"] is True
    # No new credentials for a disabled user; disabling twice changes nothing.
    for path in ("keys", "tokens"):
        refused = client.post(f"{users}/bob/{path}", json={}, headers=team.h("carol"))
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "conflict"
    assert ok(client.post(f"{users}/bob/disable", headers=team.h("carol")))["disabled"] is True

    assert ok(client.post(f"{users}/bob/enable", headers=team.h("carol")))["disabled"] is False
    assert ok(client.get("/v1/whoami", headers=team.h("bob")))["user_id"] == "bob"
    ok(client.get("/v1/whoami", headers=auth(bob_token)))

    actions = _actions(client, services, team.tenant, team.h("carol"))
    assert actions.count(("user.disable", "bob")) == 1 and actions.count(("user.enable", "bob")) == 1
    params = {"action": "user.disable"}
    (event,) = ok(client.get("/v1/admin/audit", params=params, headers=team.h("carol")))["items"]
    assert event["actor_id"] == "carol" and event["credential_id"] == team.keys["carol"].split("_")[1]


def test_who_may_disable_a_user(client: TestClient, team: Team, other_team: Team, operator: dict[str, str]) -> None:
    users = f"/v1/admin/tenants/{team.tenant}/users"
    member = client.post(f"{users}/bob/disable", headers=team.h("alice"))
    assert member.status_code == 403 and member.json()["error"]["code"] == "forbidden"
    assert client.post(f"{users}/bob/disable", headers=other_team.h("carol")).status_code == 403
    assert client.post(f"{users}/bob/enable", headers=other_team.h("carol")).status_code == 403
    ok(client.get("/v1/whoami", headers=team.h("bob")))
    own = client.post(f"{users}/carol/disable", headers=team.h("carol"))
    assert own.status_code == 409 and "your own user" in own.json()["error"]["message"]
    missing = client.post(f"{users}/nobody/disable", headers=team.h("carol"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    bad = client.post(f"/v1/admin/tenants/{team.tenant}/users/Not A Slug/disable", headers=team.h("carol"))
    assert bad.status_code == 422
    # An operator may disable a user of any tenant.
    assert ok(client.post(f"{users}/alice/disable", headers=operator))["disabled"] is True
    _refused(client.get("/v1/whoami", headers=team.h("alice")))
    ok(client.get("/v1/whoami", headers=other_team.h("alice")))  # same name, other tenant


def test_operator_disables_and_reenables_a_tenant(
    client: TestClient, team: Team, other_team: Team, operator: dict[str, str], services: Services
) -> None:
    token = _dev_token(client, team, "alice")
    tenant = f"/v1/admin/tenants/{team.tenant}"
    assert ok(client.post(f"{tenant}/disable", headers=operator))["disabled"] is True
    for user in ("alice", "bob", "carol"):
        _refused(client.get("/v1/whoami", headers=team.h(user)))
    _refused(client.get("/v1/whoami", headers=auth(token)))
    for user in ("alice", "bob", "carol"):  # the other tenant is untouched
        ok(client.get("/v1/whoami", headers=other_team.h(user)))
    assert ok(client.get(tenant, headers=operator))["disabled"] is True
    # new credentials for its users would only fail at use: refused up front, as for a disabled user
    for path, body in (("keys", {"name": "late"}), ("tokens", {})):
        issued = client.post(f"{tenant}/users/alice/{path}", json=body, headers=operator)
        assert issued.status_code == 409 and "disabled" in issued.text, (path, issued.text)

    assert ok(client.post(f"{tenant}/enable", headers=operator))["disabled"] is False
    for user in ("alice", "bob", "carol"):
        ok(client.get("/v1/whoami", headers=team.h(user)))
    ok(client.get("/v1/whoami", headers=auth(token)))
    actions = [a for a, _ in _actions(client, services, team.tenant, operator)]
    assert actions.count("tenant.disable") == 1 and actions.count("tenant.enable") == 1
    assert "tenant.disable" not in [a for a, _ in _actions(client, services, other_team.tenant, operator)]


def test_only_operators_disable_tenants(
    client: TestClient, team: Team, other_team: Team, operator: dict[str, str]
) -> None:
    for headers in (team.h("carol"), team.h("alice"), other_team.h("carol")):
        refused = client.post(f"/v1/admin/tenants/{team.tenant}/disable", headers=headers)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    ok(client.get("/v1/whoami", headers=team.h("alice")))
    system = client.post("/v1/admin/tenants/system/disable", headers=operator)
    assert system.status_code == 409 and system.json()["error"]["code"] == "conflict"
    ok(client.get("/v1/whoami", headers=operator))
    assert client.post("/v1/admin/tenants/no-such-tenant/disable", headers=operator).status_code == 404


@pytest.mark.parametrize("scope", ["user", "tenant"])
def test_disabling_reaches_other_processes_within_cache_bound(
    client: TestClient, team: Team, operator: dict[str, str], services: Services, api_settings: Settings, scope: str
) -> None:
    """Another process (its own authenticator and cache) refuses the key and the JWT of a disabled
    account within ``api_key_cache_s``, and accepts them again after re-enabling."""
    settings = api_settings.auth.model_copy(update={"api_key_cache_s": 0.5})
    other = Authenticator(settings, services.accounts, services.verifier, services.redis, "other-process")
    key, token = team.keys["bob"], _dev_token(client, team, "bob")
    assert other.authenticate(key).principal.user_id == "bob"
    assert other.authenticate(token).principal.user_id == "bob"
    path = f"/v1/admin/tenants/{team.tenant}" + ("/users/bob" if scope == "user" else "")
    ok(client.post(f"{path}/disable", headers=operator))
    time.sleep(0.6)
    for credential in (key, token):
        with pytest.raises(Unauthenticated):
            other.authenticate(credential)
    ok(client.post(f"{path}/enable", headers=operator))
    time.sleep(0.6)
    assert other.authenticate(key).principal.user_id == "bob"
    assert other.authenticate(token).principal.user_id == "bob"


def test_jwt_of_an_unprovisioned_subject_is_not_blocked(client: TestClient, team: Team) -> None:
    """Users known only to the identity provider have no account record, so nothing disables them."""
    claims = {"tenant_id": team.tenant, "sub": "zed", "iss": "tenure", "aud": "tenure-api"}
    now = int(time.time())
    token = sign_jwt({"alg": "HS256"}, {**claims, "exp": now + 60}, HS_SECRET.encode())
    assert ok(client.get("/v1/whoami", headers=auth(token)))["user_id"] == "zed"


def test_store_outage_keeps_the_last_known_status(
    client: TestClient, team: Team, services: Services, api_settings: Settings
) -> None:
    """With OpenSearch unreachable, a JWT is judged by the last status seen (a disabled user stays
    refused); with none known it passes, so the proxy can answer without the store."""
    settings = api_settings.auth.model_copy(update={"api_key_cache_s": 0.3})
    other = Authenticator(settings, services.accounts, services.verifier, services.redis, "other-process")
    bob, alice = _dev_token(client, team, "bob"), _dev_token(client, team, "alice")
    ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/disable", headers=team.h("carol")))
    with pytest.raises(Unauthenticated):
        other.authenticate(bob)
    dead = api_settings.model_copy(update={"opensearch_url": "http://127.0.0.1:9", "opensearch_timeout_s": 0.5})
    dead_client = build_client(dead)
    other.accounts = AccountStore(dead_client, dead.opensearch_namespace, services.accounts.versions)
    time.sleep(0.4)  # the cached status has expired: the next check asks the (dead) store
    try:
        with pytest.raises(Unauthenticated):
            other.authenticate(bob)
        assert other.authenticate(alice).principal.user_id == "alice"
    finally:
        dead_client.close()


def test_nobody_takes_their_own_admin_role(client: TestClient, team: Team, operator: dict[str, str]) -> None:
    """As nobody disables themselves: a tenant admin removing their own admin role locked the
    tenant out of its administration (only an operator could give it back). Another admin may."""
    url = f"/v1/admin/tenants/{team.tenant}/users/carol/grants"
    refused = client.patch(url, json={"remove_roles": ["admin"]}, headers=team.h("carol"))
    assert refused.status_code == 409, refused.text
    assert "admin" in ok(client.get("/v1/whoami", headers=team.h("carol")))["roles"]
    ok(client.patch(url, json={"remove_projects": ["pay"]}, headers=team.h("carol")))  # other changes go through
    assert ok(client.patch(url, json={"remove_roles": ["admin"]}, headers=operator))["roles"] == ["member"]
