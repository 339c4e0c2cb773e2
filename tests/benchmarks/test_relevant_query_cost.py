"""benchmarks/relevant_query_cost.py: the shapes it replays a recorded relevant-tier search in."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from benchmarks.recall_floor import Sent
from benchmarks.relevant_query_cost import MSEARCH_FILTER_PATH, SHAPES, requests_of, shaped

BODY = {
    "size": 20,
    "min_score": 3.0,
    "_source": True,
    "seq_no_primary_term": True,
    "query": {
        "bool": {"should": [{"bool": {"should": [{"term": {"aliases": {"value": "redis"}}}], "_name": "aliases"}}]}
    },
    "sort": ["_score", {"id": "asc"}],
}


def _msearch(*bodies: dict[str, object]) -> Sent:
    lines = []
    for body in bodies:
        lines += [json.dumps({"index": "ns-beliefs", "routing": "t1"}), json.dumps(body)]
    return Sent("POST", "/_msearch?filter_path=-took", ("\n".join(lines) + "\n").encode())


def test_only_a_relevant_tier_alone_is_replayed() -> None:
    assert requests_of(_msearch(BODY, BODY)) is None  # the filter tiers too
    assert requests_of(Sent("POST", "/ns-beliefs/_mtermvectors", b"{}")) is None
    assert requests_of(Sent("POST", "/ns-beliefs/_search?routing=t1", b'{"size": 2}')) is None  # a read by id
    lone = Sent("POST", "/ns-beliefs/_search?routing=t1&filter_path=-took", json.dumps(BODY).encode())
    for sent in (_msearch(BODY), lone):  # recorded from older code, and as recall sends it now
        shapes = requests_of(sent)
        assert shapes is not None and set(shapes) == set(SHAPES)
        method, path, body, _ = shapes["msearch"]
        assert path == "/_msearch?" + urlencode({"filter_path": MSEARCH_FILTER_PATH})
        assert (body or b"").decode().splitlines() == [
            json.dumps({"index": "ns-beliefs", "routing": "t1"}),
            json.dumps(BODY),
        ]
        assert shapes["search"][1] == "/ns-beliefs/_search?routing=t1"
        assert json.loads(shapes["search"][2] or b"") == BODY
        assert shapes["floor"][:2] == ("GET", "/")


def test_each_shape_drops_only_its_part() -> None:
    bare = shaped("bare", BODY)
    assert "_name" not in json.dumps(bare) and bare["_source"] is False and bare["sort"] == ["_score"]
    assert shaped("no_names", BODY)["_source"] is True and "_name" not in json.dumps(shaped("no_names", BODY))
    assert shaped("score_sort", BODY)["sort"] == ["_score"] and "_name" in json.dumps(shaped("score_sort", BODY))
    assert shaped("no_seqno", BODY)["seq_no_primary_term"] is False
    assert shaped("search", BODY) == BODY and BODY["_source"] is True  # the recorded body is left as it was
