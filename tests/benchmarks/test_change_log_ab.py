"""The change-log A/B gives each copied belief a history the model itself would load."""

from __future__ import annotations

import pytest

from benchmarks.change_log_ab import CREATED, REINFORCED, entries_for, history, make_logged_copy, parse_args
from service.domain.belief import MAX_CHANGE_LOG, Belief
from service.storage.beliefs import BeliefStore
from service.storage.vocabulary import UNITS_FIELD
from tests.factories import make_belief, put_all


def test_the_history_is_one_created_entry_then_reinforcements_the_model_loads() -> None:
    document = make_belief("t1", "ana", "session_store", reinforcement_count=4).to_document()
    document["change_log"] = history(document, entries_for(document, "reinforced"))
    belief = Belief.from_document(document)
    assert [e.trigger for e in belief.change_log] == [CREATED] + [REINFORCED] * 4
    turns = [e.changed_by_turn for e in belief.change_log]
    assert len(set(turns)) == 5 and all(t and len(t) == len("turn-") + 32 for t in turns)
    assert history(document, 5) == document["change_log"]  # stable: both copies of a run agree


def test_entry_counts() -> None:
    assert entries_for({"reinforcement_count": 0}, "reinforced") == 1
    assert entries_for({"reinforcement_count": 500}, "reinforced") == MAX_CHANGE_LOG
    assert entries_for({"reinforcement_count": 3}, "200") == 200
    with pytest.raises(SystemExit):
        parse_args(["--opensearch-url", "x", "--redis-url", "y", "--entries", str(MAX_CHANGE_LOG + 1)])


def test_the_copy_keeps_every_document_and_its_routing_with_the_history(store: BeliefStore, tenant: str) -> None:
    put_all(store, *(make_belief(tenant, "ana", f"name_{i}", id=f"b{i}") for i in range(5)))
    (source,) = store.client.indices.get_alias(name=store.alias)
    copy = f"{source}-change-log-ab"
    try:
        made = make_logged_copy(store.client, source, copy, "3")
        assert made["docs"][copy] == made["docs"][source] >= 5
        found = store.client.search(index=copy, body={"query": {"term": {"tenant_id": tenant}}, "size": 10})
        hits = found["hits"]["hits"]
        assert sorted(hit["_source"]["id"] for hit in hits) == [f"b{i}" for i in range(5)]
        assert all(hit["_routing"] == tenant for hit in hits)
        loaded = [Belief.from_document({k: v for k, v in hit["_source"].items() if k != UNITS_FIELD}) for hit in hits]
        assert all(len(b.change_log) == 3 for b in loaded)
        # the units too (doc values only): the same vocabulary on both copies
        units = {"docvalue_fields": [UNITS_FIELD], "query": {"terms": {"id": ["b0", "b1"]}}, "sort": ["id"]}
        on = [
            [h["fields"][UNITS_FIELD] for h in store.client.search(index=i, body=units)["hits"]["hits"]]
            for i in (source, copy)
        ]
        assert on[0] == on[1] and all(on[0])
    finally:
        store.client.indices.delete(index=copy, ignore=[404])


def test_the_apart_copy_keeps_each_history_in_a_log_document_its_belief_names(store: BeliefStore, tenant: str) -> None:
    put_all(store, *(make_belief(tenant, "ana", f"apart_{i}", id=f"a{i}") for i in range(3)))
    (source,) = store.client.indices.get_alias(name=store.alias)
    copy = f"{source}-change-log-apart"
    try:
        made = make_logged_copy(store.client, source, copy, "4", "apart")
        assert made["docs"][f"{copy}-logs"] == made["docs"][copy] >= 3
        found = store.client.search(index=copy, body={"query": {"term": {"tenant_id": tenant}}, "size": 10})
        for hit in found["hits"]["hits"]:
            assert "change_log" not in hit["_source"]
            ref = hit["_source"]["change_log_ref"]
            log = store.client.get(index=f"{copy}-logs", id=f"{tenant}:{ref}", routing=tenant)["_source"]
            assert log["belief_id"] == hit["_source"]["id"] and len(log["entries"]) == 4
    finally:
        store.client.indices.delete(index=f"{copy},{copy}-logs", ignore=[404])
