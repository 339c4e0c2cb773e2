"""Recall's OpenSearch answers (issue 16, item 4), on a real node: the tiers' answers come whole
(an exclusion ``filter_path`` cost the node more CPU than recall saved reading its fewer bytes),
as does the whole stored source (a ``_source`` filter cost OpenSearch more than its bytes saved),
which no longer holds the change log; the by-id read of the relation hop keeps only ids and sources
(``filter_path``) and leaves out the derived fields; an item without hits or with an error keeps its
place; the beliefs read are the stored ones, change log aside, also from a document that still keeps
its log inline (written before the log moved out). A tier searched alone is a plain ``_search``,
and fails as its ``_msearch`` item would."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from opensearchpy import OpenSearch

from service.config import Settings
from service.domain.belief import Belief, ChangeLogEntry
from service.errors import StoreUnavailable, ValidationFailed
from service.recall.tier_cache import TierCache
from service.storage import calls, queries
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore
from service.storage.calls import Call
from tests.conftest import principal, recall_builder
from tests.factories import make_belief, put_all

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def _world(tenant: str) -> list[Belief]:
    logged = ChangeLogEntry(changed_at=NOW, trigger="reinforced", actor="ana", note="x" * 400)
    return [
        make_belief(tenant, "ana", "redis_cache", id="redis", aliases=["redis"], type="entity", change_log=[logged]),
        make_belief(tenant, "ana", "linting_biome", id="biome", aliases=["biome"], pinned=True, change_log=[logged]),
        make_belief(
            tenant,
            "ana",
            "cache_uses_redis",
            id="rel",
            type="relation",
            participants=["redis", "biome"],
            aliases=["cache relation"],
        ),
    ]


def _sent_by(os_client: OpenSearch) -> tuple[list[tuple[str, dict[str, Any], Any]], Any]:
    """A list that will hold (url, params, answer) of each request, and the recording replacement
    for the client's ``perform_request`` that fills it."""
    answers: list[tuple[str, dict[str, Any], Any]] = []
    real = os_client.transport.perform_request

    def recording(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        answer = real(method, url, *args, **kwargs)
        answers.append((url, kwargs.get("params") or {}, answer))
        return answer

    return answers, recording


def test_recall_reads_the_stored_beliefs_from_its_answers(
    store: BeliefStore, os_client: OpenSearch, settings: Settings, tenant: str
) -> None:
    world = _world(tenant)
    put_all(store, *world)
    ana = principal(tenant, "ana")
    answers, recording = _sent_by(os_client)
    os_client.transport.perform_request = recording  # type: ignore[method-assign]
    try:
        result = recall_builder(store, settings, "lucene").build(ana, ["domain:code"], "cache relation")
    finally:
        del os_client.transport.perform_request
    # the relation hit brought both participants in through the by-id read
    assert [e.belief.id for e in result.pinned] == ["biome"]
    assert {e.belief.id for e in result.relevant} == {"rel", "redis"}
    paths = {url.rsplit("/", 1)[-1]: _text(params.get("filter_path")) for url, params, _ in answers}
    assert paths == {"_msearch": None, "_search": queries.BY_IDS_FILTER_PATH}
    for _, _, answer in answers:
        items = answer.get("responses", [answer])
        for item in items:
            for hit in queries.found_hits(item):
                assert "change_log" not in hit["_source"]
    by_id = [answer for url, _, answer in answers if url.endswith("/_search")]
    for hit in queries.found_hits(by_id[0]):
        assert not {"change_log", "change_log_ref", "lifecycle", "content_hash"} & set(hit["_source"])
    # what recall read is the stored belief, change log aside
    for entry in [*result.pinned, *result.relevant]:
        stored = store.get(ana, entry.belief.id)
        assert entry.belief == stored.model_copy(update={"change_log": []})


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value  # opensearch-py encodes params


def test_msearch_items_keep_their_place(store: BeliefStore, os_client: OpenSearch, tenant: str) -> None:
    put_all(store, *_world(tenant))
    ana = principal(tenant, "ana")
    from service.storage import access

    filters = access.for_principal(ana, ScopeView.everything())
    some = queries.by_ids_body(filters, ["redis", "biome"], live_only=True, include_change_log=False)
    none = queries.by_ids_body(filters, ["nothing-here"], live_only=True, include_change_log=False)
    lines: list[dict[str, Any]] = []
    for index, body in ((store.alias, none), ("no-such-index", some), (store.alias, some)):
        lines += [{"index": index, "routing": filters.routing}, body]
    answer = os_client.msearch(body=lines)
    empty, failed, found = answer["responses"]
    assert queries.found_hits(empty) == [] and empty["status"] == 200
    assert failed["status"] == 404 and "error" in failed
    assert sorted(hit["_source"]["id"] for hit in queries.found_hits(found)) == ["biome", "redis"]


def test_get_many_reads_without_change_logs_in_the_order_asked(store: BeliefStore, tenant: str) -> None:
    put_all(store, *_world(tenant))
    ana = principal(tenant, "ana")
    got = store.get_many(ana, ["rel", "nothing-here", "redis", "biome"])
    assert [b.id for b in got] == ["rel", "redis", "biome"]
    assert all(b.change_log == [] for b in got)
    assert store.get(ana, "redis").change_log  # the by-id read that may write back keeps it
    assert store.get_many(ana, ["nothing-here"]) == []
    assert store.get_many(principal(tenant, "ben"), ["redis"]) == []  # another user's: not visible


def test_a_document_with_its_log_inline_is_recalled_without_it(
    store: BeliefStore, os_client: OpenSearch, settings: Settings, tenant: str
) -> None:
    """Recall's tiers read whole sources: a log still inline is dropped before decoding, so the
    belief is the one the ``_source`` filter gave, even when that old log would not load."""
    from service.storage.client import routed_id

    world = _world(tenant)
    broken = make_belief(tenant, "ana", "broken_log_kafka", id="kafka", aliases=["kafka"], type="entity")
    for belief in world[:2]:  # as written before the log moved out: the log inline
        os_client.index(index=store.alias, id=routed_id(tenant, belief.id), routing=tenant, body=belief.to_document())
    document = {**broken.to_document(), "change_log": [{"trigger": 7, "changed_at": "not a time"}]}
    os_client.index(index=store.alias, id=routed_id(tenant, broken.id), routing=tenant, body=document, refresh=True)
    ana = principal(tenant, "ana")
    for relevance in ("vocabulary", "lucene"):
        result = recall_builder(store, settings, relevance).build(ana, ["domain:code"], "redis and kafka")
        assert [e.belief.id for e in result.pinned] == ["biome"], relevance
        assert {e.belief.id for e in result.relevant} == {"redis", "kafka"}, relevance
        assert all(e.belief.change_log == [] for e in [*result.pinned, *result.relevant])
        assert result.pinned[0].belief == world[1].model_copy(update={"change_log": []})


def test_a_tier_searched_alone_is_a_plain_search_with_the_same_hits(
    store: BeliefStore, os_client: OpenSearch, tenant: str
) -> None:
    """The filter tiers cached, the relevant tier goes alone as a routed ``_search`` (not a
    one-item ``_msearch``), answered whole as the ``_msearch`` items are, with the same scored
    beliefs."""
    put_all(store, *_world(tenant))
    ana = principal(tenant, "ana")
    view = ScopeView.session(["domain:code"])
    limits: dict[str, Any] = {"max_relevant": 20, "max_pinned": 10, "max_questions": 5, "min_score": 3.0}
    memo = TierCache(max_entries=100, max_age_s=60).bind(tenant, 1)
    answers, recording = _sent_by(os_client)
    os_client.transport.perform_request = recording  # type: ignore[method-assign]
    try:
        both = store.recall_candidates(ana, view, "cache relation", **limits, memo=memo)
        alone = store.recall_candidates(ana, view, "cache relation", **limits, memo=memo)
    finally:
        del os_client.transport.perform_request
    kinds = [(url.rsplit("/", 1)[-1], _text(params.get("filter_path"))) for url, params, _ in answers]
    assert kinds[0] == ("_msearch", None)  # the four tiers, the first time
    searched = [i for i, (kind, path) in enumerate(kinds) if kind == "_search" and path is None]
    assert len(searched) == 1 and searched[0] > 0
    alone_answer = answers[searched[0]][2]
    assert "_shards" in alone_answer and "responses" not in alone_answer  # a plain search's answer
    assert [(h.belief, h.score, h.clauses) for h in alone.relevant] == [
        (h.belief, h.score, h.clauses) for h in both.relevant
    ]
    assert {h.belief.id for h in alone.relevant} == {"rel"} and alone.pinned == both.pinned


def test_a_lone_search_fails_as_its_msearch_item_would(os_client: OpenSearch) -> None:
    """A 404 (no such index) of a search standing in for an ``_msearch`` item is the store's
    failure (503), as the item's was (``client.item_error``), and so it is for any other read
    (``translate_errors``: an index missing where one is expected); a 400 stays the caller's."""

    def reads(body: dict[str, Any], as_item: bool) -> Any:
        params = {"index": "tenure-no-such-index", "body": body}
        return (yield Call("search", params, "recall beliefs", as_msearch_item=as_item))

    with pytest.raises(StoreUnavailable, match="recall beliefs"):
        calls.run(os_client, reads({"size": 1}, True))
    with pytest.raises(StoreUnavailable, match="closed or missing"):
        calls.run(os_client, reads({"size": 1}, False))
    with pytest.raises(ValidationFailed):
        calls.run(os_client, reads({"size": "many"}, True))
