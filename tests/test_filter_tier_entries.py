"""The filter tiers as two tier-cache entries (issue 16), on a real node: a user's persona is kept
once for all their scope lists, the pinned facts and open questions once per scope list. What each
recall sends, and answers identical to an uncached recall's, documents skipped as unloadable
included, in tier order."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opensearchpy import OpenSearch

from service.domain.belief import Belief
from service.recall.tier_cache import TierCache
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore, RecallHits, TierMemo
from service.storage.client import routed_id
from tests.conftest import principal
from tests.factories import make_belief, put_all

LIMITS: dict[str, Any] = {"max_relevant": 20, "max_pinned": 10, "max_questions": 5, "min_score": 3.0}
MESSAGE = "linting biome house style"


def _world(tenant: str) -> list[Belief]:
    return [
        make_belief(tenant, "ana", "answer_style", id="style", scope=["user:universal"], content="Short answers."),
        make_belief(tenant, "bob", "bob_style", id="bob-style", scope=["user:universal"], content="Long answers."),
        make_belief(tenant, "ana", "linting_biome", id="biome", aliases=["biome"], pinned=True),
        make_belief(tenant, "ana", "house_style", id="house", pinned=True, scope=["domain:writing"]),
        make_belief(
            tenant, "ana", "which_tone", id="tone", type="open_question", pinned=True, scope=["domain:writing"]
        ),
    ]


def _plant_unloadable(os_client: OpenSearch, store: BeliefStore, belief: Belief) -> None:
    """A stored document recall's tiers find but cannot load (an empty content, stored before
    the rule existed): the recall skips it and reports its id."""
    document = {**belief.to_document(), "content": ""}
    os_client.index(
        index=store.alias, id=routed_id(belief.tenant_id, belief.id), routing=belief.tenant_id, body=document
    )
    os_client.indices.refresh(index=store.alias)


class Searches:
    """How many searches each request to the node carried (a ``_search``: one; an ``_msearch``:
    its header and body lines over two), recorded around the real transport."""

    def __init__(self, os_client: OpenSearch, monkeypatch: pytest.MonkeyPatch):
        self.per_request: list[int] = []
        real = os_client.transport.perform_request

        def recording(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body")
            text = body.decode() if isinstance(body, bytes) else body if isinstance(body, str) else json.dumps(body)
            if url.endswith("/_msearch"):
                self.per_request.append(len([line for line in text.splitlines() if line.strip()]) // 2)
            elif url.endswith("/_search"):
                self.per_request.append(1)
            return real(method, url, *args, **kwargs)

        monkeypatch.setattr(os_client.transport, "perform_request", recording)

    def taken(self) -> list[int]:
        taken, self.per_request = self.per_request, []
        return taken


def _recall(store: BeliefStore, tenant: str, user: str, scopes: list[str], memo: TierMemo | None) -> RecallHits:
    return store.recall_candidates(principal(tenant, user), ScopeView.session(scopes), MESSAGE, **LIMITS, memo=memo)


def _answer(hits: RecallHits) -> tuple[list[str], ...]:
    return (
        [b.id for b in hits.persona],
        [b.id for b in hits.pinned],
        [b.id for b in hits.questions],
        [h.belief.id for h in hits.relevant],
        hits.quarantined,
    )


@pytest.fixture
def world(store: BeliefStore, tenant: str) -> BeliefStore:
    put_all(store, *_world(tenant))
    return store


def test_a_new_scope_list_searches_only_its_own_filter_tiers(
    world: BeliefStore, os_client: OpenSearch, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = TierCache(max_entries=100, max_age_s=60).bind(tenant, 1)
    sent = Searches(os_client, monkeypatch)
    code = _recall(world, tenant, "ana", ["domain:code"], memo)
    assert sent.taken() == [4]  # persona, pinned, questions, relevant
    writing = _recall(world, tenant, "ana", ["domain:writing"], memo)
    assert sent.taken() == [3]  # the persona is ana's whatever the scopes: kept
    assert _recall(world, tenant, "ana", ["domain:code"], memo) and sent.taken() == [1]  # the relevant tier only
    assert _recall(world, tenant, "ana", ["domain:writing"], memo) and sent.taken() == [1]
    assert _answer(code) == _answer(_recall(world, tenant, "ana", ["domain:code"], None))
    assert _answer(writing) == _answer(_recall(world, tenant, "ana", ["domain:writing"], None))
    assert _answer(code)[:3] == (["style"], ["biome"], [])
    assert _answer(writing)[:3] == (["style"], ["house"], ["tone"])


def test_two_users_never_share_a_persona_entry(
    world: BeliefStore, os_client: OpenSearch, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = TierCache(max_entries=100, max_age_s=60).bind(tenant, 1)
    sent = Searches(os_client, monkeypatch)
    for _ in range(2):  # the second round from the cache
        assert [b.id for b in _recall(world, tenant, "ana", ["domain:code"], memo).persona] == ["style"]
        assert [b.id for b in _recall(world, tenant, "bob", ["domain:code"], memo).persona] == ["bob-style"]
        assert [b.id for b in _recall(world, tenant, "bob", ["domain:writing"], memo).persona] == ["bob-style"]
    assert sent.taken() == [4, 4, 3, 1, 1, 1]


def test_skipped_documents_keep_their_tier_order_from_two_entries(
    world: BeliefStore, os_client: OpenSearch, tenant: str
) -> None:
    """One unloadable document in the persona, one in the writing scope's pinned facts: a recall
    that takes the persona from the cache and searches the scoped tiers reports both, in the
    order an uncached recall does."""
    _plant_unloadable(
        os_client, world, make_belief(tenant, "ana", "broken_style", id="a-broken-style", scope=["user:universal"])
    )
    _plant_unloadable(
        os_client,
        world,
        make_belief(tenant, "ana", "broken_pin", id="0-broken-pin", pinned=True, scope=["domain:writing"]),
    )
    expected = _answer(_recall(world, tenant, "ana", ["domain:writing"], None))
    assert expected[4] == ["a-broken-style", "0-broken-pin"]
    memo = TierCache(max_entries=100, max_age_s=60).bind(tenant, 1)
    assert _recall(world, tenant, "ana", ["domain:code"], memo).quarantined == ["a-broken-style"]
    assert (
        _answer(_recall(world, tenant, "ana", ["domain:writing"], memo)) == expected
    )  # persona cached, scoped searched
    assert _answer(_recall(world, tenant, "ana", ["domain:writing"], memo)) == expected  # both cached
