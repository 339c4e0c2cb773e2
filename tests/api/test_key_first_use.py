"""An API key met for the first time in a process is verified on the event loop once its tenant's
accounts version was read there (service/auth/authenticator.py, ``Authenticator.averify``), with
the same outcome as the worker thread's check: the same identity, every refusal (wrong secret,
revoked key, disabled user) still decided and counted by the thread's check, a replayed invalid
key still answered without a store read, and records tagged with a version older than the
request's own verified again. Real OpenSearch and Redis; a second app is a fresh API process of
the same deployment (its caches empty)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.auth.authenticator import UNREAD, VersionRead
from service.storage.templates import ACCOUNTS
from tests.api.conftest import Team, auth, ok, services_of


@pytest.fixture
def thread_checks(second: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The credentials the second app checked on a worker thread (``AuthGuard.verify``)."""
    guard = services_of(second).guard
    checked: list[str] = []
    original = guard.verify

    def counting(token: str, client: str | None, accounts_version: VersionRead = UNREAD) -> Any:
        checked.append(token)
        return original(token, client, accounts_version)

    monkeypatch.setattr(guard, "verify", counting)
    return checked


def _accounts_gets(services: Services) -> int:
    alias = ACCOUNTS.alias(services.settings.opensearch_namespace)
    stats = services.opensearch.indices.stats(index=alias, metric="get")
    return int(stats["_all"]["primaries"]["get"]["total"])


def _whoami(app_client: TestClient, key: str) -> Any:
    return ok(app_client.get("/v1/whoami", headers=auth(key)))


def test_a_keys_first_use_is_verified_on_the_loop_once_its_tenant_was_seen(
    client: TestClient, second: TestClient, team: Team, other_team: Team, thread_checks: list[str]
) -> None:
    assert _whoami(second, team.keys["alice"])["user_id"] == "alice"
    assert thread_checks == [team.keys["alice"]]  # the tenant's version not read here yet
    for user in ("bob", "carol"):  # the same identity as the first process's check gives
        assert _whoami(second, team.keys[user]) == _whoami(client, team.keys[user])
    assert thread_checks == [team.keys["alice"]]
    # another tenant is another version: its first key goes to the thread, its second does not
    _whoami(second, other_team.keys["bob"])
    _whoami(second, other_team.keys["carol"])
    assert thread_checks == [team.keys["alice"], other_team.keys["bob"]]


def test_refusals_at_first_use_are_the_threads_and_a_replay_reads_nothing(
    client: TestClient, second: TestClient, team: Team, operator: dict[str, str], thread_checks: list[str]
) -> None:
    services = services_of(client)
    key = team.keys["bob"]
    wrong = key[:-5] + ("A" * 5 if not key.endswith("AAAAA") else "B" * 5)
    issued = ok(
        client.post(f"/v1/admin/tenants/{team.tenant}/users/bob/keys", json={"name": "x"}, headers=operator), 201
    )
    ok(client.delete(f"/v1/admin/keys/{issued['key_id']}", headers=team.h("carol")))
    ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/carol/disable", headers=operator))
    _whoami(second, team.keys["alice"])  # the tenant's current version read by the second process
    for credential in (wrong, issued["key"], team.keys["carol"]):
        del thread_checks[:]
        refused = second.get("/v1/whoami", headers=auth(credential))
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthenticated"
        assert thread_checks == [credential]  # decided (and counted) by the thread's check
    gets = _accounts_gets(services)
    assert second.get("/v1/whoami", headers=auth(wrong)).status_code == 401  # remembered as invalid
    assert _accounts_gets(services) == gets
    assert _whoami(second, key)["user_id"] == "bob"  # the owner's right secret still passes
    ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/carol/enable", headers=operator))


def test_records_tagged_with_an_older_version_are_verified_again(
    client: TestClient, second: TestClient, team: Team, thread_checks: list[str]
) -> None:
    """bob's grants change after the second process last read the tenant's version: the loop
    loads his new records but can only tag them with that older version, so the request's own
    round trip (the newer version) sends them to the thread's check, which tags them anew."""
    _whoami(second, team.keys["alice"])
    url = f"/v1/admin/tenants/{team.tenant}/users/bob/grants"
    ok(client.patch(url, json={"remove_projects": ["pay"]}, headers=team.h("carol")))
    del thread_checks[:]
    assert _whoami(second, team.keys["bob"])["projects"] == []
    assert thread_checks == [team.keys["bob"]]
    assert _whoami(second, team.keys["bob"])["projects"] == []  # cached now, at the current version
    assert thread_checks == [team.keys["bob"]]
    # any request's round trip tells the process the tenant's version: the next first use is the loop's
    ok(client.patch(url, json={"add_projects": ["pay"]}, headers=team.h("carol")))
    _whoami(second, team.keys["alice"])  # cached, confirmed against the newer version, re-checked
    del thread_checks[:]
    assert _whoami(second, team.keys["carol"])["user_id"] == "carol"
    assert thread_checks == []


def test_turned_off_every_first_use_is_the_threads(
    second: TestClient, team: Team, thread_checks: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services_of(second).authenticator.settings, "verify_keys_on_loop", False)
    for user in ("alice", "bob", "carol"):
        _whoami(second, team.keys[user])
    assert thread_checks == [team.keys[u] for u in ("alice", "bob", "carol")]
