"""benchmarks/analysis_request_cost.py against the suite's real node: its ``_analyze`` shape makes
exactly the analyses of the ``_mtermvectors`` request recall sends (same tokens at the same
positions, field by field), for English, long, Japanese and Korean messages; and the measurement
reports every shape."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from benchmarks.analysis_request_cost import SHAPES, Requests, shapes_of
from benchmarks.analysis_request_cost import measure as measure_shapes
from benchmarks.relevant_query_cost import Node
from service.config import Settings
from service.recall.vocabulary import VocabularyMatcher
from service.storage.beliefs import BeliefStore
from service.storage.local_analysis import Positions
from tests.conftest import principal

MESSAGES = [
    "how should the ledger_sync job retry after a timeout?",
    " ".join(f"word{i} ledger sync retry" for i in range(20)),  # more than the fuzzy head's 32 words
    "台帳同期ジョブのリトライ方針について",
    "결제 API 재시도 정책은 어떻게 되나요",
]


def _recall_request(store: BeliefStore, settings: Settings, text: str) -> tuple[str, bytes]:
    """The ``_mtermvectors`` request recall sends for ``text``, as recorded (path, body)."""
    matcher = VocabularyMatcher.for_store(store, settings.recall)
    plan = matcher._plan(text, store.vocabulary.mapping().search_analyzers)
    call = next(store.vocabulary.analyze(principal("t-analysis-cost", "alice"), plan.requests))
    return f"/{call.params['index']}/_mtermvectors", json.dumps(call.params["body"]).encode()


def _grouped(tokens: list[dict[str, Any]]) -> Positions:
    at: dict[int, list[str]] = {}
    for token in tokens:
        at.setdefault(int(token["position"]), []).append(token["token"])
    return tuple(tuple(sorted(at[p])) for p in sorted(at))


@pytest.mark.parametrize("text", MESSAGES)
def test_the_analyze_shape_makes_the_analyses_of_the_recorded_request(
    opensearch_url: str, store: BeliefStore, settings: Settings, text: str
) -> None:
    path, body = _recall_request(store, settings, text)
    shapes = shapes_of(path, body)
    node = Node(opensearch_url, os.getpid())
    vectors = json.loads(node.send(*shapes["mtermvectors"][0])[1])["docs"]
    expected = [
        _grouped(
            [
                {"token": term, "position": t["position"]}
                for term, info in doc.get("term_vectors", {}).get(field, {}).get("terms", {}).items()
                for t in info["tokens"]
            ]
        )
        for doc, sent in zip(vectors, json.loads(body)["docs"], strict=True)
        for field in sent["per_field_analyzer"]
    ]
    analysed = [_grouped(json.loads(node.send(*request)[1]).get("tokens", [])) for request in shapes["analyze"]]
    assert analysed == expected and any(expected)
    assert shapes["analyze_one"] == shapes["analyze"][:1]


def test_every_shape_is_measured(opensearch_url: str, store: BeliefStore, settings: Settings) -> None:
    messages: list[dict[str, Requests]] = [shapes_of(*_recall_request(store, settings, t)) for t in MESSAGES[:2]]
    figures = measure_shapes(Node(opensearch_url, os.getpid()), messages, rounds=2)
    assert figures["messages"] == 2
    for shape in SHAPES:
        assert len(figures[shape]["node_cpu_ms_by_round"]) == 2
    assert figures["mtermvectors"]["requests_per_message"] == 1.0
    assert figures["analyze"]["requests_per_message"] > 1
