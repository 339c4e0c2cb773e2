"""A closed (or missing) index is the store unable to serve, not a wrong request: on a real node,
with indices of this test's own namespace (no other index is touched), a closed beliefs index
makes the API answer 503 (retryable, never a 422 that blames the caller) and leaves a turn's
extraction to the sweep (transient: pending again, the attempt not counted) instead of failing it
for good; once the index is open again both succeed, each tenant writing only its own. A request
the store refuses for what it is (a strict mapping, a bad query) stays the caller's error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from pydantic import SecretStr

from service.config import AuthSettings, Settings
from service.domain.accounts import Credential
from service.domain.principal import Principal
from service.errors import NotFound, StoreUnavailable, ValidationFailed
from service.extraction.pipeline import TRANSIENT_ERRORS
from service.extraction.sidecar import split_sidecar
from service.storage.client import bulk_item, refused_for_good, translate_errors
from service.storage.lookup import BeliefLookup
from service.storage.templates import ACCOUNTS, BELIEFS, FAMILIES, drop_namespace
from service.storage.turns import TurnRecord
from tests.api.conftest import Team, auth, make_team, ok
from tests.memory_loop.conftest import new_belief, sidecar
from workers import resources


@pytest.fixture
def own_settings(settings: Settings) -> Settings:
    """The session's stores under a namespace of this test's own."""
    return settings.model_copy(
        update={
            "opensearch_namespace": f"closed-{uuid.uuid4().hex[:8]}",
            "auth": AuthSettings(api_key_pepper=SecretStr("test-pepper")),
        }
    )


@pytest.fixture
def own_api(own_settings: Settings, os_client: OpenSearch) -> Iterator[TestClient]:
    """An API on that namespace (its start-up puts the templates and creates the indices)."""
    from service.app import create_app

    try:
        with TestClient(create_app(own_settings)) as client:
            yield client
    finally:
        drop_namespace(os_client, own_settings.opensearch_namespace, FAMILIES)


def beliefs_index(os_client: OpenSearch, namespace: str) -> str:
    """The concrete beliefs index of the namespace (the one this test closes)."""
    (index,) = os_client.indices.get_alias(index=BELIEFS.alias(namespace)).keys()
    assert index.startswith(f"{namespace}-beliefs-")
    return str(index)


def waiting_turn(
    res: resources.Resources, team: Team, name: str, owner: str = "bob", credential: Credential | None = None
) -> str:
    """``owner``'s turn (project pay) whose sidecar adds the belief ``name``, recorded with a
    credential of that kind (no id: nothing to check for revocation) and not yet run."""
    split = split_sidecar(
        "ok" + sidecar(new_beliefs=[{**new_belief(name, f"{name} holds."), "scope": ["project:pay"]}])
    )
    turn_id = f"turn-{uuid.uuid4().hex[:10]}"
    res.turns.create(
        TurnRecord(
            tenant_id=team.tenant,
            turn_id=turn_id,
            owner_id=owner,
            projects=["pay"],
            credential=credential,
            session_id="s-closed",
            scope=["project:pay"],
            model="gpt-4o",
            sidecar_raw=split.raw,
            parse_status=split.status.value,
        )
    )
    return turn_id


def test_a_closed_index_is_transient_for_the_api_and_the_extraction(
    own_api: TestClient, own_settings: Settings, os_client: OpenSearch
) -> None:
    ns = own_settings.opensearch_namespace
    services = own_api.app.state.services  # type: ignore[attr-defined]
    operator = auth(services.provisioning.bootstrap().plaintext)
    crew, other = make_team(own_api, operator), make_team(own_api, operator)
    res = resources.build(own_settings)  # the worker's own composition, on this namespace
    index = beliefs_index(os_client, ns)
    names = {team.tenant: f"closed_{uuid.uuid4().hex[:6]}" for team in (crew, other)}
    try:
        turns = {team.tenant: waiting_turn(res, team, names[team.tenant]) for team in (crew, other)}
        os_client.indices.close(index=index)
        try:
            for path, call in (
                ("list", lambda team: own_api.get("/v1/beliefs", headers=team.h("bob"))),
                ("recall", lambda team: own_api.post("/v1/recall", json={"query": "x"}, headers=team.h("bob"))),
            ):
                for team in (crew, other):
                    answer = call(team)
                    assert answer.status_code == 503, (path, answer.text)
                    assert answer.json()["error"]["code"] == "store_unavailable"
                    assert int(answer.headers["Retry-After"]) > 0
            for tenant, turn_id in turns.items():
                with pytest.raises(TRANSIENT_ERRORS):  # the task retries, then leaves it to the sweep
                    res.pipeline.run(tenant, turn_id)
                turn = res.turns.load(tenant, turn_id)[0]
                assert (turn.extraction_status, turn.attempts, turn.error) == ("pending", 0, None)
            # a real bulk item into the closed index: kept for later, not set aside as refused
            bulk = os_client.bulk(body=[{"index": {"_index": BELIEFS.alias(ns), "_id": "probe"}}, {"tenant_id": "x"}])
            assert not refused_for_good(bulk_item(bulk["items"][0]))
        finally:
            os_client.indices.open(index=index, wait_for_active_shards="all")
        for tenant, turn_id in turns.items():
            assert res.pipeline.run(tenant, turn_id).status == "done"
        for team in (crew, other):
            assert ok(own_api.get("/v1/beliefs", headers=team.h("bob")))["items"]
            for owner in (crew, other):
                reader = Principal(tenant_id=team.tenant, user_id="reader", projects=frozenset({"pay"}))
                hits = BeliefLookup(services.store).by_name_or_alias(reader, names[owner.tenant])
                assert bool(hits) == (owner is team)  # each tenant's turn wrote only into its own
    finally:
        res.close()


def test_a_request_the_store_refuses_for_what_it_is_stays_the_callers_error(
    own_api: TestClient, own_settings: Settings, os_client: OpenSearch
) -> None:
    """Not every 400 is a closed index: a strict mapping's refusal and a malformed query are the
    request's (422 from the API), and a missing index where a caller expects one is NotFound."""
    alias = BELIEFS.alias(own_settings.opensearch_namespace)
    with pytest.raises(ValidationFailed), translate_errors("index a probe"):
        os_client.index(index=alias, id="probe", body={"no_such_field": 1})
    with pytest.raises(ValidationFailed), translate_errors("search"):
        os_client.search(index=alias, body={"query": {"no_such_query": {}}})
    missing = f"{own_settings.opensearch_namespace}-nothing"
    with pytest.raises(NotFound), translate_errors("read a record", on_missing="no such index yet"):
        os_client.get(index=missing, id="x")
    with pytest.raises(StoreUnavailable), translate_errors("search"):  # expected to exist: the store's
        os_client.search(index=missing, body={"query": {"match_all": {}}})
    assert refused_for_good({"status": 400, "error": {"type": "mapper_parsing_exception"}})


def test_a_closed_accounts_index_is_not_read_as_accounts_that_do_not_exist(
    own_api: TestClient, own_settings: Settings, os_client: OpenSearch
) -> None:
    """An ``mget`` into a closed index answers 200 with an error per item: read as "no record",
    a disabled identity provider subject's turn was extracted (nothing disabled it), an API key's
    turn was skipped for good (its user "gone"), and a valid key re-checked after an account change
    was refused (401). Each is now the store unavailable: the turns wait for the sweep, the request
    answers 503; once the index is open the records decide again, each tenant by its own."""
    ns = own_settings.opensearch_namespace
    services = own_api.app.state.services  # type: ignore[attr-defined]
    operator = auth(services.provisioning.bootstrap().plaintext)
    crew, other = make_team(own_api, operator), make_team(own_api, operator)
    users = f"/v1/admin/tenants/{crew.tenant}/users"
    ok(own_api.post(users, json={"user_id": "dana", "projects": ["pay"]}, headers=operator), 201)
    ok(own_api.post(f"{users}/dana/disable", headers=operator))
    assert ok(own_api.get("/v1/whoami", headers=other.h("bob")))["user_id"] == "bob"  # cached from here on
    res = resources.build(own_settings)
    (index,) = os_client.indices.get_alias(index=ACCOUNTS.alias(ns)).keys()
    names = {who: f"accounts_{who}_{uuid.uuid4().hex[:6]}" for who in ("dana", "bob")}
    try:
        dana = waiting_turn(res, crew, names["dana"], owner="dana", credential="idp_token")
        bob = waiting_turn(res, other, names["bob"], credential="api_key")
        os_client.indices.close(index=index)
        try:
            for tenant, turn_id in ((crew.tenant, dana), (other.tenant, bob)):
                with pytest.raises(TRANSIENT_ERRORS):
                    res.pipeline.run(tenant, turn_id)
                turn = res.turns.load(tenant, turn_id)[0]
                assert (turn.extraction_status, turn.attempts) == ("pending", 0)
            services.accounts.bump_version(other.tenant)  # an account change: bob's key is checked again
            answer = own_api.get("/v1/whoami", headers=other.h("bob"))
            assert answer.status_code == 503, answer.text
        finally:
            os_client.indices.open(index=index, wait_for_active_shards="all")
        assert res.pipeline.run(crew.tenant, dana).status == "skipped"  # disabled, as every request of hers
        assert res.pipeline.run(other.tenant, bob).status == "done"
        assert ok(own_api.get("/v1/whoami", headers=other.h("bob")))["user_id"] == "bob"
        for team, who, project in ((crew, "dana", "pay"), (other, "bob", "pay")):
            for tenant in (crew.tenant, other.tenant):
                reader = Principal(tenant_id=tenant, user_id="reader", projects=frozenset({project}))
                hits = BeliefLookup(services.store).by_name_or_alias(reader, names[who])
                assert bool(hits) == (who == "bob" and tenant == team.tenant)
    finally:
        res.close()
