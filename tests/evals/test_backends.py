"""Ablation index variants derive from the production templates without changing them."""

from __future__ import annotations

import pytest

from evals.backends import SPECS, default_backends, variant_index_body, vector_available
from evals.cases import paper_case_set
from evals.report import load_categories
from service.storage.templates import BELIEFS, expected_mapping, load_json


def test_standard_analyzer_variant_swaps_only_the_name_analyzers() -> None:
    body = variant_index_body("eval-x", "standard-analyzer")
    props = body["mappings"]["properties"]
    for name in ("canonical_name", "aliases"):
        fields = [props[name], *props[name]["fields"].values()]
        texts = [f for f in fields if f["type"] == "text"]
        assert texts
        assert all(f["analyzer"] == "standard" and "search_analyzer" not in f for f in texts)
        assert all(f["similarity"] == "boolean" for f in texts)
    assert props["content"] == {"type": "text", "index": False}
    assert body["aliases"] == {BELIEFS.alias("eval-x"): {"is_write_index": True}}
    assert (
        body["settings"]["number_of_shards"]
        == load_json("index/tenure-beliefs.json")["template"]["settings"]["number_of_shards"]
    )
    # the production template is untouched
    prod = load_json("component/tenure-analysis.json")["template"]["mappings"]["properties"]
    assert prod["aliases"]["analyzer"] == "tenure_whole_name"
    assert expected_mapping(BELIEFS)["properties"]["aliases"]["search_analyzer"] == "tenure_query_words"


def test_content_searched_variant_indexes_content() -> None:
    props = variant_index_body("eval-x", "content-searched")["mappings"]["properties"]
    assert props["content"] == {"type": "text", "analyzer": "english"}
    assert props["aliases"]["analyzer"] == "tenure_whole_name"


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown index variant"):
        variant_index_body("eval-x", "nope")


def test_default_backends() -> None:
    names = default_backends()
    assert names[0] == "bm25"
    assert set(names) <= set(SPECS)
    assert ("vector" in names) == vector_available()


def test_paper_categories_follow_the_notes_appendix() -> None:
    case_set = paper_case_set()
    categories = load_categories(case_set, None)
    static = [categories[c.case_id] for c in case_set.static]
    counts = {c: static.count(c) for c in set(static)}
    assert counts["Alias resolution"] == 21
    assert counts["Fuzzy matching and prefix guards"] == 7
    assert sum(counts.values()) == 60
    assert all(s.case_id in categories for s in case_set.sessions)
