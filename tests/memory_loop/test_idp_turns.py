"""Whose grants a turn's extraction writes with, by the credential that authenticated the turn,
through the real API, the real Celery worker, OpenSearch and Redis: the memory loop follows the
rule every request of that credential meets (docs/api.md, "Authentication").

- an identity provider's token keeps its own claims; a user record here (provisioned, say, to
  hold a CLI key) only disables it, as on a request;
- an API key or a development token of this service acts with the grants it carried that the user
  still holds, and is refused once the user's record is gone;
- a disabled tenant or user writes nothing, whatever the credential;
- a turn recorded before turns named their credential keeps the rule such turns always had.

Two tenants, each with a user ``dana`` known to the identity provider, so one tenant's records
never decide for the other's."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from joserfc.jwk import RSAKey
from opensearchpy import OpenSearch
from pydantic import SecretStr

from service.api.state import Services
from service.config import AuthSettings, Settings
from service.domain.accounts import Credential
from service.domain.principal import Principal
from service.extraction.queue import TaskQueue
from service.extraction.sidecar import split_sidecar
from service.storage.lookup import BeliefLookup
from service.storage.templates import ACCOUNTS
from service.storage.turns import TurnRecord, TurnStore
from tests.api.conftest import Team, auth, ok, sign_jwt
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn

HS_SECRET = "idp-turns-test-hs256-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def idp_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[RSAKey, Path]:
    """The identity provider's signing key and the JWKS file the service reads its public half from."""
    key = RSAKey.generate_key(2048, {"kid": "idp-1"})
    path = Path(tmp_path_factory.mktemp("idp-jwks")) / "jwks.json"
    path.write_text(json.dumps({"keys": [key.as_dict(private=False)]}))
    return key, path


@pytest.fixture(scope="module")
def idp_app(loop_settings: Settings, loop_app: FastAPI, idp_key: tuple[RSAKey, Path]) -> FastAPI:
    """Another API process of the same deployment (the same indices, Redis, queues and worker as
    the session's app) that also accepts the identity provider's tokens and development tokens."""
    from service.app import create_app

    auth_settings = AuthSettings(
        api_key_pepper=SecretStr("test-pepper"),
        jwks_file=str(idp_key[1]),
        jwt_algorithms=["RS256", "HS256"],
        jwt_hs256_secret=SecretStr(HS_SECRET),
    )
    return create_app(loop_settings.model_copy(update={"auth": auth_settings}))


@pytest.fixture(scope="module")
def idp_api(idp_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(idp_app) as client:
        yield client


def idp_token(key: RSAKey, tenant: str, sub: str, projects: list[str], jti: str | None = None) -> str:
    """A token as the identity provider issues it: its own claims, no development token id
    (``jti``: this id rather than a fresh one)."""
    now = int(time.time())
    claims = {
        "iss": "tenure",
        "aud": "tenure-api",
        "sub": sub,
        "tenant_id": tenant,
        "roles": ["member"],
        "projects": projects,
        "jti": jti or f"idp-{uuid.uuid4().hex}",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
    }
    return sign_jwt({"alg": "RS256", "kid": "idp-1", "typ": "JWT"}, claims, key)


def provision(api: TestClient, operator: dict[str, str], tenant: str, user: str, **grants: Any) -> None:
    ok(api.post(f"/v1/admin/tenants/{tenant}/users", json={"user_id": user, **grants}, headers=operator), 201)


def answer_with(name: str, scope: str) -> str:
    return "ok" + sidecar(new_beliefs=[{**new_belief(name, f"{name} holds."), "scope": [scope]}])


def post_turn(api: TestClient, headers: dict[str, str], answer: str, scope: list[str]) -> str:
    body = {"model": "gpt-4o", "scope": scope, "session_id": "s-idp", "user_message": "ok", "assistant_message": answer}
    return str(ok(api.post("/v1/turns", json=body, headers=headers), 202)["turn_id"])


def ops_of(turn: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["section"], o["outcome"]) for o in turn["result"]["merge"]["ops"]]


def found(services: Services, tenant: str, project: str, name: str) -> bool:
    """Whether a member of ``project`` in ``tenant`` finds a belief by that name."""
    reader = Principal(tenant_id=tenant, user_id="reader", projects=frozenset({project}))
    return bool(BeliefLookup(services.store).by_name_or_alias(reader, name))


def turn_store(services: Services, settings: Settings) -> TurnStore:
    return TurnStore(services.opensearch, settings.opensearch_namespace)


def recorded_turn(
    services: Services,
    settings: Settings,
    tenant: str,
    owner: str,
    projects: list[str],
    answer: str,
    credential: Credential | None,
    credential_id: str | None = None,
    session_id: str = "s-idp",
) -> str:
    """A turn stored as the API records it but not yet sent to the worker (what a backlog, the
    sweep or a parked turn leaves waiting), authenticated by ``credential`` (its id:
    ``credential_id``) with ``projects``; None: recorded before turns named their credential."""
    split = split_sidecar(answer)
    turn_id = f"turn-{uuid.uuid4().hex[:10]}"
    turn_store(services, settings).create(
        TurnRecord(
            tenant_id=tenant,
            turn_id=turn_id,
            owner_id=owner,
            projects=projects,
            credential=credential,
            credential_id=credential_id,
            session_id=session_id,
            scope=[f"project:{projects[0]}"] if projects else ["domain:code"],
            model="gpt-4o",
            sidecar_raw=split.raw,
            parse_status=split.status.value,
        )
    )
    return turn_id


def test_an_identity_providers_turn_writes_with_the_tokens_grants_not_the_account_records(
    api: TestClient,
    idp_api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
    idp_key: tuple[RSAKey, Path],
) -> None:
    """dana's identity provider grants her project alpha; in crew's tenant she also has an account
    record (for a CLI key) granting project beta only. Her requests with the token act in alpha,
    so her turn's beliefs in alpha are written there; her API key's turn gets the record's grants,
    as its requests do. In the other tenant dana's record is disabled: her token is refused there,
    and a turn recorded before writes nothing."""
    key, _ = idp_key
    provision(api, operator_headers, crew.tenant, "dana", projects=["beta"])
    provision(api, operator_headers, other_crew.tenant, "dana", projects=["alpha"])
    dana_key = ok(api.post(f"/v1/admin/tenants/{crew.tenant}/users/dana/keys", json={}, headers=operator_headers), 201)
    token = auth(idp_token(key, crew.tenant, "dana", ["alpha"]))
    assert ok(idp_api.get("/v1/whoami", headers=token))["projects"] == ["alpha"]  # what every request acts with

    name = f"alpha_idp_{uuid.uuid4().hex[:6]}"
    by_token = post_turn(idp_api, token, answer_with(name, "project:alpha"), ["project:alpha"])
    done = wait_turn(idp_api, crew.h("carol"), by_token)
    assert ops_of(done) == [("new_beliefs", "inserted")], done["result"]
    assert found(loop_services, crew.tenant, "alpha", name)
    assert not found(loop_services, other_crew.tenant, "alpha", name)  # the other tenant's alpha is another

    # the same user with the API key her record backs: the record's grants, as on its requests
    keyed = f"alpha_key_{uuid.uuid4().hex[:6]}"
    by_key = post_turn(idp_api, auth(dana_key["key"]), answer_with(keyed, "project:alpha"), ["project:alpha"])
    assert ops_of(wait_turn(idp_api, crew.h("carol"), by_key)) == [("new_beliefs", "skipped")]
    assert not found(loop_services, crew.tenant, "alpha", keyed)

    # and with a development token of this service, issued from her record (beta)
    dev = ok(idp_api.post(f"/v1/admin/tenants/{crew.tenant}/users/dana/tokens", json={}, headers=operator_headers), 201)
    by_dev = post_turn(idp_api, auth(dev["token"]), answer_with(f"beta_dev_{uuid.uuid4().hex[:6]}", "project:beta"), [])
    assert ops_of(wait_turn(idp_api, crew.h("carol"), by_dev)) == [("new_beliefs", "inserted")]

    turns = turn_store(loop_services, loop_settings)
    kinds = [turns.load(crew.tenant, t)[0].credential for t in (by_token, by_key, by_dev)]
    assert kinds == ["idp_token", "api_key", "service_token"]

    # the other tenant: dana's record there is disabled, which refuses her token as any request
    other_users = f"/v1/admin/tenants/{other_crew.tenant}/users"
    waiting = recorded_turn(
        loop_services,
        loop_settings,
        other_crew.tenant,
        "dana",
        ["alpha"],
        answer_with(f"alpha_off_{uuid.uuid4().hex[:6]}", "project:alpha"),
        "idp_token",
    )
    ok(api.post(f"{other_users}/dana/disable", headers=operator_headers))
    refused = idp_api.get("/v1/whoami", headers=auth(idp_token(key, other_crew.tenant, "dana", ["alpha"])))
    assert refused.status_code == 401, refused.text
    TaskQueue(loop_settings).extract(other_crew.tenant, waiting)
    skipped = wait_turn(api, other_crew.h("carol"), waiting)
    assert skipped["extraction_status"] == "skipped", skipped
    # crew's dana is not the other tenant's: her token still writes here
    again = f"alpha_idp_{uuid.uuid4().hex[:6]}"
    later = post_turn(idp_api, token, answer_with(again, "project:alpha"), ["project:alpha"])
    assert ops_of(wait_turn(idp_api, crew.h("carol"), later)) == [("new_beliefs", "inserted")]


def test_a_disabled_tenant_stops_an_identity_providers_waiting_turn_and_only_that_tenants(
    api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
) -> None:
    """Turns of dana's token (project alpha) wait in both tenants, where she has no record; one
    tenant is disabled before they run: its turn writes nothing, the other's is extracted."""
    names = {t.tenant: f"alpha_wait_{uuid.uuid4().hex[:6]}" for t in (crew, other_crew)}
    waiting = {
        team.tenant: recorded_turn(
            loop_services,
            loop_settings,
            team.tenant,
            "dana",
            ["alpha"],
            answer_with(names[team.tenant], "project:alpha"),
            "idp_token",
        )
        for team in (crew, other_crew)
    }
    ok(api.post(f"/v1/admin/tenants/{crew.tenant}/disable", headers=operator_headers))
    queue = TaskQueue(loop_settings)
    for tenant, turn_id in waiting.items():
        queue.extract(tenant, turn_id)
    extracted = wait_turn(api, other_crew.h("carol"), waiting[other_crew.tenant])
    assert ops_of(extracted) == [("new_beliefs", "inserted")], extracted["result"]
    assert found(loop_services, other_crew.tenant, "alpha", names[other_crew.tenant])
    turns = turn_store(loop_services, loop_settings)

    def final() -> TurnRecord:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            turn = turns.load(crew.tenant, waiting[crew.tenant])[0]
            if turn.extraction_status in ("done", "skipped", "failed"):
                return turn
            time.sleep(0.05)
        raise AssertionError("the disabled tenant's turn never finished")

    # the disabled tenant's admin cannot ask any more (refused like every credential): the store
    assert final().extraction_status == "skipped"
    assert not found(loop_services, crew.tenant, "alpha", names[crew.tenant])


def test_an_api_key_or_development_tokens_waiting_turn_is_still_narrowed_to_the_users_grants(
    api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
) -> None:
    """bob's key and alice's development token carried project pay when their turns were recorded;
    pay is taken from both before the turns run: neither writes into pay, as neither credential's
    next request could. The other tenant's bob still holds pay: his turn writes there."""
    users = f"/v1/admin/tenants/{crew.tenant}/users"
    names = {who: f"pay_{who}_{uuid.uuid4().hex[:6]}" for who in ("bob", "alice", "other")}
    answer = {who: answer_with(name, "project:pay") for who, name in names.items()}
    bobs = recorded_turn(loop_services, loop_settings, crew.tenant, "bob", ["pay"], answer["bob"], "api_key")
    alices = recorded_turn(
        loop_services, loop_settings, crew.tenant, "alice", ["pay"], answer["alice"], "service_token"
    )
    others = recorded_turn(loop_services, loop_settings, other_crew.tenant, "bob", ["pay"], answer["other"], "api_key")
    for user in ("bob", "alice"):
        ok(api.patch(f"{users}/{user}/grants", json={"remove_projects": ["pay"]}, headers=operator_headers))
    queue = TaskQueue(loop_settings)
    queue.extract(crew.tenant, bobs)
    queue.extract(crew.tenant, alices)
    queue.extract(other_crew.tenant, others)
    for turn_id in (bobs, alices):
        assert ops_of(wait_turn(api, crew.h("carol"), turn_id)) == [("new_beliefs", "skipped")]
    assert ops_of(wait_turn(api, other_crew.h("carol"), others)) == [("new_beliefs", "inserted")]
    assert not found(loop_services, crew.tenant, "pay", names["bob"])
    assert not found(loop_services, crew.tenant, "pay", names["alice"])
    assert found(loop_services, other_crew.tenant, "pay", names["other"])


def test_an_api_keys_turn_writes_nothing_once_its_users_record_is_gone(
    api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    os_client: OpenSearch,
) -> None:
    """A key whose user record is gone (a restore, a hand edit) is refused on every request, so
    its waiting turn writes nothing; the other tenant's bob, whose record is there, writes."""
    names = {t.tenant: f"pay_gone_{uuid.uuid4().hex[:6]}" for t in (crew, other_crew)}
    waiting = {
        team.tenant: recorded_turn(
            loop_services,
            loop_settings,
            team.tenant,
            "bob",
            ["pay"],
            answer_with(names[team.tenant], "project:pay"),
            "api_key",
        )
        for team in (crew, other_crew)
    }
    accounts = ACCOUNTS.alias(loop_settings.opensearch_namespace)
    os_client.delete(index=accounts, id=f"user:{crew.tenant}:bob", routing=crew.tenant, refresh=True)
    assert api.get("/v1/whoami", headers=crew.h("bob")).status_code == 401
    queue = TaskQueue(loop_settings)
    for tenant, turn_id in waiting.items():
        queue.extract(tenant, turn_id)
    skipped = wait_turn(api, crew.h("carol"), waiting[crew.tenant])
    assert skipped["extraction_status"] == "skipped", skipped
    assert ops_of(wait_turn(api, other_crew.h("carol"), waiting[other_crew.tenant])) == [("new_beliefs", "inserted")]
    assert not found(loop_services, crew.tenant, "pay", names[crew.tenant])
    assert found(loop_services, other_crew.tenant, "pay", names[other_crew.tenant])


def test_a_turn_recorded_before_turns_named_their_credential_keeps_the_rule_it_had(
    api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
) -> None:
    """An old turn does not say which credential made it: as before, its grants are narrowed to
    the user's record when there is one (dana's, beta: her alpha turn writes nothing), and stand
    as recorded without one (the other tenant's dana, known only to the identity provider)."""
    provision(api, operator_headers, crew.tenant, "dana", projects=["beta"])
    names = {t.tenant: f"alpha_old_{uuid.uuid4().hex[:6]}" for t in (crew, other_crew)}
    waiting = {
        team.tenant: recorded_turn(
            loop_services,
            loop_settings,
            team.tenant,
            "dana",
            ["alpha"],
            answer_with(names[team.tenant], "project:alpha"),
            None,
        )
        for team in (crew, other_crew)
    }
    queue = TaskQueue(loop_settings)
    for tenant, turn_id in waiting.items():
        queue.extract(tenant, turn_id)
    assert ops_of(wait_turn(api, crew.h("carol"), waiting[crew.tenant])) == [("new_beliefs", "skipped")]
    assert ops_of(wait_turn(api, other_crew.h("carol"), waiting[other_crew.tenant])) == [("new_beliefs", "inserted")]
    assert not found(loop_services, crew.tenant, "alpha", names[crew.tenant])
    assert found(loop_services, other_crew.tenant, "alpha", names[other_crew.tenant])
