"""Recall semantics beyond the paper's cases: whole-unit matching, fuzzy guards, hierarchy, budgets."""

from __future__ import annotations

import pytest

from service.config import Settings
from service.recall.context import ContextBuilder, RecallBudget
from service.recall.render import render_injection
from service.storage.beliefs import BeliefStore
from tests.conftest import principal, recall_builder
from tests.factories import make_belief, put_all


@pytest.fixture(params=["lucene", "vocabulary"])
def builder(store: BeliefStore, settings: Settings, request: pytest.FixtureRequest) -> ContextBuilder:
    """Every behaviour holds for both relevance paths: the Lucene query and the tenant vocabulary."""
    return recall_builder(store, settings, request.param)


def test_partial_multi_word_alias_never_surfaces(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(store, make_belief(tenant, "ana", "eviction_policy", aliases=["allkeys-lru", "point of view"]))
    me = principal(tenant, "ana")
    assert builder.build(me, ["domain:code"], "what about allkeys?").relevant_ids == []
    assert builder.build(me, ["domain:code"], "the lru thing").relevant_ids == []
    assert builder.build(me, ["domain:code"], "we chose allkeys-lru").relevant_ids == ["b-eviction-policy-ana"]
    assert builder.build(me, ["domain:code"], "we chose AllKeys LRU").relevant_ids == ["b-eviction-policy-ana"]
    # a three-word alias is reachable through a three-word shingle, never through two of its words
    assert builder.build(me, ["domain:code"], "from my point of view, fine").relevant_ids == ["b-eviction-policy-ana"]
    assert builder.build(me, ["domain:code"], "the point of it all").relevant_ids == []


def test_word_forms_reach_the_name(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(store, make_belief(tenant, "ana", "redis_cache", type="entity"))
    me = principal(tenant, "ana")
    for query in ("RedisCache settings", "redis_cache settings", "redis-cache settings", "the redis cache"):
        assert builder.build(me, ["domain:code"], query).relevant_ids == ["b-redis-cache-ana"], query


def test_fuzzy_needs_the_prefix_and_allows_one_edit(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(store, make_belief(tenant, "ana", "kubernetes", type="entity", aliases=["k8s", "kubectl"]))
    me = principal(tenant, "ana")
    assert builder.build(me, ["domain:code"], "kubernets rollout").relevant_ids == ["b-kubernetes-ana"]
    assert builder.build(me, ["domain:code"], "k9s rollout").relevant_ids == []  # prefix guard
    assert builder.build(me, ["domain:code"], "kubernteees rollout").relevant_ids == []  # 2+ edits


def test_content_and_why_it_matters_are_not_searched(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(
        store,
        make_belief(
            tenant,
            "ana",
            "frontend_stack",
            content="React with Vue islands and Svelte widgets.",
            why_it_matters="Shapes answers toward Astro.",
        ),
    )
    me = principal(tenant, "ana")
    assert builder.build(me, ["domain:code"], "Svelte widgets and Astro").relevant_ids == []


def test_sub_domain_session_sees_parent_but_not_the_reverse(
    store: BeliefStore, builder: ContextBuilder, tenant: str
) -> None:
    put_all(
        store,
        make_belief(tenant, "ana", "async_style", aliases=["asyncio"], scope=["domain:code/python"]),
        make_belief(tenant, "ana", "type_hints", aliases=["mypy"], scope=["domain:code"]),
    )
    me = principal(tenant, "ana")
    child = builder.build(me, ["domain:code/python"], "asyncio and mypy")
    assert set(child.relevant_ids) == {"b-async-style-ana", "b-type-hints-ana"}
    parent = builder.build(me, ["domain:code"], "asyncio and mypy")
    assert parent.relevant_ids == ["b-type-hints-ana"]


def test_superseded_retracted_and_expertise_never_surface(
    store: BeliefStore, builder: ContextBuilder, tenant: str
) -> None:
    from datetime import UTC, datetime

    put_all(
        store,
        make_belief(tenant, "ana", "lint_old", aliases=["eslint"], epistemic_status="superseded", superseded_by="b-x"),
        make_belief(tenant, "ana", "lint_gone", aliases=["eslint"], retracted_at=datetime.now(UTC)),
        make_belief(tenant, "ana", "ts_expertise", aliases=["eslint"], subtype="expertise"),
    )
    assert builder.build(principal(tenant, "ana"), ["domain:code"], "eslint config").relevant_ids == []


def test_budget_caps_and_pinned_first(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(
        store,
        *[make_belief(tenant, "ana", f"pinned_{i}", pinned=True) for i in range(4)],
        make_belief(tenant, "ana", "redis_cache", aliases=["redis"]),
    )
    me = principal(tenant, "ana")
    full = builder.build(me, ["domain:code"], "redis")
    assert len(full.pinned) == 4 and full.relevant_ids == ["b-redis-cache-ana"] and not full.truncated
    tight = builder.build(me, ["domain:code"], "redis", RecallBudget(max_beliefs=4))
    assert len(tight.pinned) == 4 and tight.relevant_ids == [] and tight.truncated
    fewer = builder.build(me, ["domain:code"], "redis", RecallBudget(max_pinned_facts=1))
    assert len(fewer.pinned) == 1 and fewer.relevant_ids == ["b-redis-cache-ana"]


def test_threshold_drops_weak_evidence(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(store, make_belief(tenant, "ana", "error_handling", aliases=["errors"]))
    me = principal(tenant, "ana")
    assert builder.build(me, ["domain:code"], "errors please").relevant_ids == ["b-error-handling-ana"]
    assert builder.build(me, ["domain:code"], "errors please", RecallBudget(min_score=5.5)).relevant_ids == []


def test_injection_block_hedges_and_directs(store: BeliefStore, builder: ContextBuilder, tenant: str) -> None:
    put_all(
        store,
        make_belief(
            tenant,
            "ana",
            "orm_choice",
            aliases=["prisma"],
            epistemic_status="inferred",
            confidence=0.5,
            why_it_matters="Shapes data-layer code toward Prisma.",
        ),
        make_belief(tenant, "ana", "style", scope=["user:universal"], content="Prefers terse answers."),
    )
    result = builder.build(principal(tenant, "ana"), ["domain:code"], "prisma schema")
    block = render_injection(result)
    assert "<persona>Prefers terse answers.</persona>" in block.beliefs
    assert '"why_it_matters": "Shapes data-layer code toward Prisma."' in block.dynamic
    assert '"hedge": "inferred, not confirmed by the user: hold loosely"' in block.dynamic
    assert '"confidence": 0.5' in block.dynamic


def test_repeated_words_count_once_and_stop_words_never_fuzz(
    store: BeliefStore, builder: ContextBuilder, tenant: str
) -> None:
    put_all(store, make_belief(tenant, "ana", "git_workflow", aliases=["fork", "rebase"]))
    me = principal(tenant, "ana")
    once = builder.build(me, ["domain:code"], "rebase please", explain=True)
    twice = builder.build(me, ["domain:code"], "rebase rebase REBASE please", explain=True)
    assert [e.score for e in once.relevant] == [e.score for e in twice.relevant] == [5.0]
    # "for" is one edit from "fork", but a stop-word is never fuzz-matched
    assert builder.build(me, ["domain:code"], "this is for you and for them").relevant_ids == []
    assert builder.build(me, ["domain:code"], "should I fork it").relevant_ids == ["b-git-workflow-ana"]
