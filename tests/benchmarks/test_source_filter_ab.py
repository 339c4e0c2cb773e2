"""The source-filter A/B changes nothing of a recorded ``_msearch`` but each query's ``_source``,
and sorts searches by the tiers they carry."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.recall_floor import Sent
from benchmarks.source_filter_ab import filtered, tiers_in
from service.storage.queries import SOURCE_EXCLUDES


def _msearch(*queries: dict[str, Any]) -> Sent:
    header = {"index": "ns-beliefs", "routing": "t1"}
    body = "".join(f"{json.dumps(header)}\n{json.dumps(q)}\n" for q in queries).encode()
    return Sent("POST", "/_msearch?filter_path=-took", body)


def test_each_query_gets_the_old_source_filter_and_nothing_else_changes() -> None:
    queries: list[dict[str, Any]] = [
        {"size": 80, "_source": True, "query": {"term": {"tenant_id": "t1"}}},
        {"size": 20, "min_score": 3.0},
    ]
    sent = filtered(_msearch(*queries))
    assert sent.path == "/_msearch?filter_path=-took"
    lines = [json.loads(line) for line in (sent.body or b"").decode().splitlines()]
    assert lines[0::2] == [{"index": "ns-beliefs", "routing": "t1"}] * 2
    assert lines[1::2] == [{**q, "_source": {"excludes": SOURCE_EXCLUDES}} for q in queries]


def test_searches_are_told_apart_by_their_tiers() -> None:
    assert tiers_in(_msearch({"size": 20})) == 1
    assert tiers_in(_msearch({"size": 80}, {"size": 10}, {"size": 5}, {"size": 20})) == 4


def test_a_tier_searched_alone_is_filtered_in_place() -> None:
    query = {"size": 20, "min_score": 3.0, "_source": True}
    lone = Sent("POST", "/ns-beliefs/_search?routing=t1", json.dumps(query).encode())
    assert tiers_in(lone) == 1
    assert tiers_in(Sent("POST", "/ns-beliefs/_search?routing=t1", b'{"size": 2}')) == 0  # a read by id
    sent = filtered(lone)
    assert sent.path == lone.path
    assert json.loads(sent.body or b"") == {**query, "_source": {"excludes": SOURCE_EXCLUDES}}
