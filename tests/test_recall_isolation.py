"""Isolation across tenants, users and grants, on every query path of the storage/recall layer.

Two tenants, each with two users, hold beliefs with IDENTICAL ids, names and aliases. Every path
(get, get_many, each recall tier, relation expansion) must only ever return the caller's own
personal beliefs and the shared beliefs of projects/teams the caller is granted.
"""

from __future__ import annotations

import pytest

from service.config import Settings
from service.domain.belief import Belief
from service.errors import NotFound
from service.recall.context import ContextBuilder
from service.storage.beliefs import BeliefStore
from tests.conftest import principal, recall_builder
from tests.factories import make_belief, put_all

TENANTS = ("iso-tenant-a", "iso-tenant-b")
USERS = ("ana", "ben")


def world(tenant: str) -> list[Belief]:
    out: list[Belief] = []
    for user in USERS:
        out += [
            make_belief(
                tenant,
                user,
                "redis_cache",
                id=f"redis-{user}",
                aliases=["redis", "cache layer"],
                type="entity",
                pinned=False,
            ),
            make_belief(tenant, user, "linting_biome", id=f"biome-{user}", aliases=["biome"], pinned=True),
            make_belief(
                tenant, user, "auth_strategy", id=f"auth-q-{user}", type="open_question", aliases=["jwt"], pinned=True
            ),
            make_belief(
                tenant,
                user,
                "response_length",
                id=f"persona-{user}",
                scope=["user:universal"],
                content=f"{user} prefers direct answers without preamble.",
            ),
            make_belief(
                tenant, user, "prose_style", id=f"prose-{user}", scope=["domain:writing"], pinned=True, user_edited=True
            ),
        ]
    out += [
        make_belief(
            tenant,
            "ana",
            "deploy_pipeline",
            id="proj-deploy",
            aliases=["deploy pipeline", "argo"],
            scope=["project:apollo"],
            type="decision",
        ),
        make_belief(
            tenant, "ana", "oncall_rotation", id="team-oncall", aliases=["oncall"], scope=["team:platform"], pinned=True
        ),
        make_belief(
            tenant,
            "ana",
            "apollo_redis_link",
            id="rel-apollo",
            type="relation",
            aliases=["apollo cache"],
            participants=["proj-deploy", "redis-ana"],
            scope=["project:apollo"],
        ),
    ]
    return out


@pytest.fixture(scope="module")
def loaded(store: BeliefStore) -> BeliefStore:
    for tenant in TENANTS:
        put_all(store, *world(tenant))
    return store


@pytest.fixture(scope="module", params=["lucene", "vocabulary"])
def builder(loaded: BeliefStore, settings: Settings, request: pytest.FixtureRequest) -> ContextBuilder:
    return recall_builder(loaded, settings, request.param)


def all_ids(result: object) -> set[str]:
    return set(result.injected_ids)  # type: ignore[attr-defined]


@pytest.mark.parametrize("tenant", TENANTS)
@pytest.mark.parametrize("user", USERS)
def test_recall_sees_only_own_personal_beliefs(builder: ContextBuilder, tenant: str, user: str) -> None:
    me = principal(tenant, user)
    result = builder.build(me, ["domain:code"], "what are we doing with redis and biome and jwt?")
    assert result.relevant_ids == [f"redis-{user}"]
    assert result.pinned_ids == [f"prose-{user}", f"biome-{user}"]  # user-edited cross-scope first
    assert result.question_ids == [f"auth-q-{user}"]
    assert result.persona is not None and result.persona.startswith(user)
    assert all(b.belief.tenant_id == tenant for b in result.pinned + result.relevant + result.questions)


@pytest.mark.parametrize("tenant", TENANTS)
def test_shared_beliefs_need_a_grant(builder: ContextBuilder, tenant: str) -> None:
    scopes = ["domain:code", "project:apollo", "team:platform"]
    granted = principal(tenant, "ben", projects=("apollo",), teams=("platform",))
    ungranted = principal(tenant, "ben")
    got = builder.build(granted, scopes, "how does the deploy pipeline work with oncall")
    assert got.relevant_ids == ["proj-deploy"]
    assert "team-oncall" in got.pinned_ids
    denied = builder.build(ungranted, scopes, "how does the deploy pipeline work with oncall")
    assert "proj-deploy" not in all_ids(denied) and "team-oncall" not in all_ids(denied)


def test_grant_in_one_tenant_opens_nothing_in_another(builder: ContextBuilder) -> None:
    outsider = principal("iso-tenant-c", "ana", projects=("apollo",), teams=("platform",))
    result = builder.build(
        outsider, ["domain:code", "project:apollo", "team:platform"], "redis deploy pipeline oncall biome"
    )
    assert all_ids(result) == set() and result.persona is None


@pytest.mark.parametrize("tenant", TENANTS)
def test_relation_expansion_stays_inside_the_callers_view(builder: ContextBuilder, tenant: str) -> None:
    # ana: the relation links her own redis belief and the shared project decision -> both join
    ana = builder.build(
        principal(tenant, "ana", projects=("apollo",)), ["domain:code", "project:apollo"], "apollo cache"
    )
    assert ana.relevant_ids[0] == "rel-apollo"
    assert set(ana.relevant_ids) == {"rel-apollo", "proj-deploy", "redis-ana"}
    assert {e.via_relation for e in ana.relevant[1:]} == {"rel-apollo"}
    # ben sees the relation (granted), but ana's personal redis belief must not leak through it
    ben = builder.build(
        principal(tenant, "ben", projects=("apollo",)), ["domain:code", "project:apollo"], "apollo cache"
    )
    assert set(ben.relevant_ids) == {"rel-apollo", "proj-deploy"}


@pytest.mark.parametrize("tenant", TENANTS)
@pytest.mark.parametrize("user", USERS)
def test_get_is_404_for_anything_not_visible(loaded: BeliefStore, tenant: str, user: str) -> None:
    me = principal(tenant, user)
    other = "ben" if user == "ana" else "ana"
    assert loaded.get(me, f"redis-{user}").owner_id == user
    assert loaded.get(me, f"redis-{user}").tenant_id == tenant
    with pytest.raises(NotFound):
        loaded.get(me, f"redis-{other}")
    with pytest.raises(NotFound):
        loaded.get(me, "proj-deploy")  # shared, but not granted
    assert loaded.get(principal(tenant, user, projects=("apollo",)), "proj-deploy").scope == ["project:apollo"]


@pytest.mark.parametrize("tenant", TENANTS)
def test_get_many_filters_silently(loaded: BeliefStore, tenant: str) -> None:
    me = principal(tenant, "ana")
    got = loaded.get_many(me, ["redis-ana", "redis-ben", "proj-deploy", "missing"])
    assert [b.id for b in got] == ["redis-ana"]


def test_tenant_wide_reads_need_the_admin_role(loaded: BeliefStore) -> None:
    member = principal(TENANTS[0], "ana")
    admin = principal(TENANTS[0], "ana", admin=True)
    with pytest.raises(NotFound):
        loaded.get(member, "redis-ben", tenant_wide=True)
    assert loaded.get(admin, "redis-ben", tenant_wide=True).owner_id == "ben"
    with pytest.raises(NotFound):
        loaded.get(principal("iso-tenant-c", "root", admin=True), "redis-ben", tenant_wide=True)
