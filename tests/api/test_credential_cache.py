"""The version-validated credential cache (service/auth/authenticator.py), with real Redis and
OpenSearch: two API processes (two apps sharing the indices and Redis), two tenants of three users.

A change made through one app (revoke, disable, grant change) is enforced by the other at its very
next request, though it had the credential cached; a warm credential is served without loading
anything; one tenant's account changes leave another tenant's cached credentials alone; without
Redis the old time bound applies; the cache is bounded.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import pytest
import redis
from fastapi.testclient import TestClient

from service import redis_keys
from service.api.state import Services
from service.app import create_app
from service.auth.authenticator import Authenticator, Verified
from service.auth.last_used import LastUsedRecorder
from service.config import Settings
from service.errors import Unauthenticated
from service.storage.accounts import AccountStore
from service.write_versions import TenantAccountsVersions
from tests.api.conftest import Team, auth, ok, services_of


def _authenticator(app_client: TestClient) -> Authenticator:
    return services_of(app_client).authenticator


def _warm(app_client: TestClient, key: str) -> Verified:
    """Use ``key`` on ``app_client`` until it is cached there; its cache entry."""
    ok(app_client.get("/v1/whoami", headers=auth(key)))
    verified = _authenticator(app_client).cached(key)
    assert verified is not None
    return verified


def _refused(response: object) -> None:
    assert getattr(response, "status_code", None) == 401, getattr(response, "text", response)


def _dev_token(client: TestClient, team: Team, user: str) -> str:
    url = f"/v1/admin/tenants/{team.tenant}/users/{user}/tokens"
    return str(ok(client.post(url, json={}, headers=team.h("carol")), 201)["token"])


# Every way the authenticator reads a credential's records from the accounts index.
_CREDENTIAL_READS = ("get_key", "key_and_owner", "key_reads", "key_and_owner_reads")


def _count_credential_reads(app_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the credential reads ``app_client``'s authenticator makes from now on (each
    still goes to the store). Counted on the app's own store, not from the index's statistics,
    which also count what other processes of the namespace read meanwhile (the memory loop's
    worker checks the keys of the turns it extracts)."""
    store = _authenticator(app_client).accounts
    reads: list[str] = []
    for name in _CREDENTIAL_READS:
        real = getattr(store, name)

        def counted(*args: object, _real: Callable[..., object] = real, _name: str = name) -> object:
            reads.append(_name)
            return _real(*args)

        monkeypatch.setattr(store, name, counted)
    return reads


def test_warm_key_costs_no_store_request(
    client: TestClient, second: TestClient, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _warm(second, team.keys["alice"])
    _warm(second, team.keys["bob"])
    reads = _count_credential_reads(second, monkeypatch)
    for _ in range(20):
        for user in ("alice", "bob"):
            assert ok(second.get("/v1/whoami", headers=team.h(user)))["user_id"] == user
    assert _authenticator(second).cached(team.keys["alice"]) is first  # never re-loaded
    assert reads == []
    # The count does see a load: a key this process has not cached yet is read from the store.
    ok(second.get("/v1/whoami", headers=team.h("carol")))
    assert reads


def test_revoked_key_is_refused_at_once_by_another_process(
    client: TestClient, second: TestClient, team: Team, other_team: Team, services: Services
) -> None:
    for key in (team.keys["alice"], team.keys["bob"], other_team.keys["alice"]):
        _warm(second, key)
    elsewhere = _authenticator(second).cached(other_team.keys["alice"])
    key_id = team.keys["alice"].split("_")[1]
    ok(client.delete(f"/v1/admin/keys/{key_id}", headers=team.h("carol")))  # through the first process
    _refused(second.get("/v1/whoami", headers=team.h("alice")))  # the second's very next request
    _refused(second.get("/v1/whoami", headers=team.h("alice")))
    assert ok(second.get("/v1/whoami", headers=team.h("bob")))["user_id"] == "bob"  # re-checked, still fine
    # The other tenant's accounts did not change: its cached key is still the one verified before.
    assert ok(second.get("/v1/whoami", headers=other_team.h("alice")))["tenant_id"] == other_team.tenant
    assert _authenticator(second).cached(other_team.keys["alice"]) is elsewhere


@pytest.mark.parametrize("scope", ["user", "tenant"])
def test_disabling_is_enforced_at_once_by_another_process(
    client: TestClient, second: TestClient, team: Team, other_team: Team, operator: dict[str, str], scope: str
) -> None:
    token = _dev_token(client, team, "bob")
    _warm(second, team.keys["bob"])
    _warm(second, team.keys["alice"])
    ok(second.get("/v1/whoami", headers=auth(token)))  # the JWT subject's status is cached too
    elsewhere = _warm(second, other_team.keys["bob"])
    path = f"/v1/admin/tenants/{team.tenant}" + ("/users/bob" if scope == "user" else "")
    ok(client.post(f"{path}/disable", headers=operator))
    for credential in (team.keys["bob"], token):
        _refused(second.get("/v1/whoami", headers=auth(credential)))
    alice = second.get("/v1/whoami", headers=team.h("alice"))
    if scope == "user":
        assert ok(alice)["user_id"] == "alice"
    else:
        _refused(alice)
    assert ok(second.get("/v1/whoami", headers=other_team.h("bob")))["tenant_id"] == other_team.tenant
    assert _authenticator(second).cached(other_team.keys["bob"]) is elsewhere
    ok(client.post(f"{path}/enable", headers=operator))
    for credential in (team.keys["bob"], token, team.keys["alice"]):  # re-enabling is immediate too
        ok(second.get("/v1/whoami", headers=auth(credential)))


def test_grant_change_is_visible_at_once_in_another_process(client: TestClient, second: TestClient, team: Team) -> None:
    assert ok(second.get("/v1/whoami", headers=team.h("alice")))["projects"] == ["pay"]
    url = f"/v1/admin/tenants/{team.tenant}/users/alice/grants"
    ok(client.patch(url, json={"remove_projects": ["pay"]}, headers=team.h("carol")))
    assert ok(second.get("/v1/whoami", headers=team.h("alice")))["projects"] == []
    ok(client.patch(url, json={"add_projects": ["pay", "ops"]}, headers=team.h("carol")))
    # back at once, and only "pay": a key keeps the grants it was issued with, narrowed by its user's
    assert ok(second.get("/v1/whoami", headers=team.h("alice")))["projects"] == ["pay"]


def test_console_style_revalidation_sees_a_revoke_at_once(client: TestClient, second: TestClient, team: Team) -> None:
    """:meth:`Authenticator.authenticate` and ``revalidate`` (no request round trip) read the
    version themselves."""
    other = _authenticator(second)
    identity = other.authenticate(team.keys["bob"])
    assert other.revalidate(identity).principal.user_id == "bob"
    ok(client.delete(f"/v1/admin/keys/{team.keys['bob'].split('_')[1]}", headers=team.h("bob")))
    with pytest.raises(Unauthenticated):
        other.revalidate(identity)
    with pytest.raises(Unauthenticated):
        other.authenticate(team.keys["bob"])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_redis_the_time_bound_applies(
    client: TestClient, team: Team, services: Services, api_settings: Settings
) -> None:
    """A process that cannot reach Redis trusts a verified key for ``api_key_cache_s`` only, as
    before the versions: the revoke (made where Redis works) reaches it within that bound."""
    dead = redis.Redis.from_url(f"redis://127.0.0.1:{_closed_port()}/0", socket_connect_timeout=0.2)
    settings = api_settings.auth.model_copy(update={"api_key_cache_s": 1.0})
    ns = api_settings.opensearch_namespace
    accounts = AccountStore(services.opensearch, ns, TenantAccountsVersions(dead, ns))
    cut_off = Authenticator(settings, accounts, services.verifier, dead, ns)
    key = team.keys["alice"]
    verified = cut_off.verify(key)
    assert verified.accounts_version is None
    assert cut_off.confirm(verified, None)
    ok(client.delete(f"/v1/admin/keys/{key.split('_')[1]}", headers=team.h("alice")))
    assert cut_off.authenticate(key).principal.user_id == "alice"  # within the bound, unseen
    time.sleep(1.1)
    assert not cut_off.confirm(verified, None)
    with pytest.raises(Unauthenticated):
        cut_off.authenticate(key)
    # Once Redis answers again, an entry verified without a version is re-checked at once.
    assert not services.authenticator.confirm(verified, 0)
    dead.close()


def test_the_cache_is_bounded(client: TestClient, team: Team, services: Services, api_settings: Settings) -> None:
    settings = api_settings.auth.model_copy(update={"credential_cache_entries": 2, "credential_cache_max_age_s": 1.0})
    small = Authenticator(settings, services.accounts, services.verifier, services.redis, "bounded")
    for user in ("alice", "bob", "carol"):
        assert small.authenticate(team.keys[user]).principal.user_id == user
    assert small.cached_keys() == 2
    assert small.cached(team.keys["alice"]) is None  # the least recently used went
    assert small.cached(team.keys["carol"]) is not None
    assert small.authenticate(team.keys["alice"]).principal.user_id == "alice"  # re-loaded
    time.sleep(1.1)  # the maximum age: re-loaded even though nothing changed
    assert small.cached(team.keys["carol"]) is None
    verified = small.verify(team.keys["carol"])
    assert small.confirm(verified, verified.accounts_version)


def test_last_used_costs_a_warm_key_no_redis_call(client: TestClient, team: Team, services: Services) -> None:
    """A warm key asks for ``last_used_at`` at most once per interval per process: with the
    cross-process gate deleted, further requests within the interval do not set it again."""
    key = team.keys["bob"]
    gate = redis_keys.key_used(services.settings.opensearch_namespace, key.split("_")[1])
    ok(client.get("/v1/whoami", headers=auth(key)))
    deadline = time.monotonic() + 10
    while not services.redis.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert services.redis.exists(gate)
    services.redis.delete(gate)
    for _ in range(5):
        ok(client.get("/v1/whoami", headers=auth(key)))
    time.sleep(services.settings.auth.last_used_flush_s + 0.5)  # the bookkeeping thread would have set it by now
    assert not services.redis.exists(gate)


def test_last_used_is_recorded_in_batches_one_writer_per_key(team: Team, services: Services) -> None:
    """The asks of one window go out together (one pipeline, one bulk update); a second process
    asking within the interval is not elected and writes nothing; a key deleted meanwhile is
    skipped without failing the others."""
    from service.domain.accounts import ApiKeyRecord

    # keys of their own: no request of another test can note them (and hold their gates)
    keys = [f"klastused{time.monotonic_ns()}{i}" for i in range(3)]
    for key_id in keys:
        record = ApiKeyRecord(key_id=key_id, tenant_id=team.tenant, user_id="alice", key_hash="h", created_by="t")
        services.accounts.create_key(record)
    batches: list[dict[str, datetime]] = []

    class Counting(AccountStore):
        def touch_keys(self, used: Mapping[str, datetime]) -> None:
            batches.append(dict(used))
            super().touch_keys(used)

    accounts = Counting(services.accounts.client, services.settings.opensearch_namespace, services.accounts.versions)
    ns = services.settings.opensearch_namespace
    first = LastUsedRecorder(services.redis, accounts, ns, interval_s=60, flush_s=0.3)
    when = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    for key_id in [*keys, "kdeleted00000000"]:
        first.note(key_id, when)
    deadline = time.monotonic() + 10
    while not batches and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert len(batches) == 1 and sorted(batches[0]) == sorted([*keys, "kdeleted00000000"])
    assert all(services.accounts.get_key(key_id).last_used_at == when for key_id in keys)
    # another process, same interval: every gate is held, nothing is written again
    second = LastUsedRecorder(services.redis, accounts, ns, interval_s=60, flush_s=0.3)
    assert second.record({key_id: datetime(2026, 12, 1, 13, 0, tzinfo=UTC) for key_id in keys}) == []
    assert len(batches) == 1
    assert all(services.accounts.get_key(key_id).last_used_at == when for key_id in keys)


def test_every_account_write_bumps_the_tenant_version(services: Services) -> None:
    """Each writer of AccountStore moves the version of the tenant it wrote, and only that one
    (tests/test_structure.py checks that no write goes around the bump)."""
    from service.domain.accounts import ApiKeyRecord, TenantRecord, UserRecord

    accounts, versions = services.accounts, services.accounts.versions
    tenant_id, other = f"t-bump-{time.monotonic_ns()}", f"t-bump-other-{time.monotonic_ns()}"
    before_other = versions.current(other)

    def bumps(write: Callable[[], object]) -> int:
        before = versions.current(tenant_id)
        write()
        after = versions.current(tenant_id)
        assert before is not None and after is not None
        return after - before

    assert bumps(lambda: accounts.create_tenant(TenantRecord(tenant_id=tenant_id, name="b", created_by="t"))) > 0
    assert bumps(lambda: accounts.create_user(UserRecord(tenant_id=tenant_id, user_id="u", created_by="t"))) > 0
    key = ApiKeyRecord(key_id=f"k{time.monotonic_ns()}", tenant_id=tenant_id, user_id="u", key_hash="h", created_by="t")
    assert bumps(lambda: accounts.create_key(key)) > 0
    tenant, *tseq = accounts.get_tenant_versioned(tenant_id)
    assert bumps(lambda: accounts.replace_tenant(tenant, (tseq[0], tseq[1]))) > 0
    user, *useq = accounts.get_user_versioned(tenant_id, "u")
    assert bumps(lambda: accounts.replace_user(user, (useq[0], useq[1]))) > 0
    stored, *kseq = accounts.get_key_versioned(key.key_id)
    assert bumps(lambda: accounts.replace_key(stored, (kseq[0], kseq[1]))) > 0
    assert bumps(lambda: accounts.touch_keys({key.key_id: stored.created_at})) == 0  # bookkeeping only
    assert versions.current(other) == before_other


def test_without_the_cache_each_request_loads_its_key_once(
    api_settings: Settings, team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A maximum age of 0 trusts nothing cached: every request loads its key (one mget of key,
    user and tenant: the process knows whose key it is), once, not again after the round trip."""
    settings = api_settings.model_copy(
        update={"auth": api_settings.auth.model_copy(update={"credential_cache_max_age_s": 0.0})}
    )
    with TestClient(create_app(settings)) as uncached:
        ok(uncached.get("/v1/whoami", headers=team.h("alice")))
        reads = _count_credential_reads(uncached, monkeypatch)
        for _ in range(5):
            ok(uncached.get("/v1/whoami", headers=team.h("alice")))
        assert len(reads) == 5, reads
        assert set(reads) <= {"key_and_owner", "key_and_owner_reads"}, reads  # never the key's GET again
