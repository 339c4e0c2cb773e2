"""The index-order A/B sends each recorded search unchanged but for the index it names."""

from __future__ import annotations

import json

from benchmarks.index_order_ab import _ids, _on_index, make_sorted_copy
from benchmarks.recall_floor import Sent
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS, index_sort
from tests.factories import make_belief, put_all


def test_an_msearch_is_sent_to_the_other_index_with_its_routing_and_queries_unchanged() -> None:
    queries = [{"size": 20, "query": {"term": {"tenant_id": "t1"}}}, {"size": 5, "query": {"match_all": {}}}]
    lines = [{"index": "ns-beliefs", "routing": "t1"}, queries[0], {"index": "ns-beliefs", "routing": "t1"}, queries[1]]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    moved = _on_index(Sent("POST", "/_msearch?filter_path=-took", body), "copy")
    assert moved.path == "/_msearch?filter_path=-took"
    sent = [json.loads(line) for line in (moved.body or b"").decode().splitlines()]
    assert sent[0::2] == [{"index": "copy", "routing": "t1"}] * 2
    assert sent[1::2] == queries


def test_a_search_is_sent_to_the_other_index_with_its_parameters() -> None:
    moved = _on_index(Sent("POST", "/ns-beliefs/_search?routing=t1&filter_path=hits.hits._id", b"{}"), "copy")
    assert moved == Sent("POST", "/copy/_search?routing=t1&filter_path=hits.hits._id", b"{}")
    assert moved.kind == "_search"


def test_hits_are_compared_by_id_in_order_per_item() -> None:
    answer = {"responses": [{"hits": {"hits": [{"_id": "b"}, {"_id": "a"}]}}, {"status": 404, "error": {}}]}
    assert _ids(json.dumps(answer).encode()) == [["b", "a"], []]
    assert _ids(json.dumps({"hits": {"hits": [{"_id": "x"}]}}).encode()) == [["x"]]
    assert _ids(json.dumps({"hits": {"hits": [{"sort": [1], "fields": {}}]}}).encode()) == [
        [json.dumps({"fields": {}, "sort": [1]})]
    ]


def test_the_sorted_copy_has_the_template_sort_and_every_document(store: BeliefStore, tenant: str) -> None:
    put_all(store, *(make_belief(tenant, "ana", f"name_{i}", id=f"b{i}") for i in range(5)))
    (source,) = store.client.indices.get_alias(name=store.alias)
    copy = f"{source}-order-ab"
    try:
        timings = make_sorted_copy(store.client, source, copy)
        assert set(timings) == {"copy_s", "merge_s"}
        live = store.client.indices.get_settings(index=copy, name="index.sort.field")
        assert live[copy]["settings"]["index"]["sort"]["field"] in (index_sort(BELIEFS), *index_sort(BELIEFS))
        found = store.client.search(index=copy, body={"query": {"term": {"tenant_id": tenant}}, "size": 10})
        assert sorted(hit["_source"]["id"] for hit in found["hits"]["hits"]) == [f"b{i}" for i in range(5)]
        assert all(hit["_routing"] == tenant for hit in found["hits"]["hits"])  # routing kept
    finally:
        store.client.indices.delete(index=copy, ignore=[404])
