"""The analysis cache keeps each analysis as one bytes object: what goes in comes out, in every
script; its size is exact; and the collector has nothing in it to walk (service/process.py)."""

from __future__ import annotations

import gc
import sys

import pytest

from service.recall.analysis_cache import ENTRY_BYTES, Analysis, AnalysisCache, decode, encode


def _shingled(words: list[str]) -> tuple[tuple[str, ...], ...]:
    return tuple(
        tuple(sorted({words[i], " ".join(words[i : i + 2]), " ".join(words[i : i + 3])})) for i in range(len(words))
    )


SCRIPTS = {
    "ascii": ["redis", "eviction", "policy", "for", "the", "session", "store", "uses", "allkeys", "lru"],
    "latin-1": ["café", "crème", "brûlée", "über", "straße"],
    "bmp": ["東京", "データベース", "設計", "レディス", "설정"],
    "astral": ["🙂", "rocket", "🚀", "deploy", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"],
    # what a hostile message can leave in a token: a lone surrogate, separators, control characters
    "hostile": ["lone\udcffsurrogate", "rec\x1esep", "unit\x1fsep", "nul\x00byte", "line\u2028sep", ""],
}


def _analysis(words: list[str]) -> Analysis:
    return (
        {"canonical_name.phrase": _shingled(words), "aliases": tuple((w,) for w in words)},
        {"aliases": tuple((w,) for w in words[:3])},
        {},
    )


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_an_analysis_comes_back_as_it_went_in(script: str) -> None:
    analysis = _analysis(SCRIPTS[script])
    assert decode(encode(analysis)) == analysis
    assert decode(encode(list(analysis))) == analysis  # as VocabularyStore answers it: a list


def test_an_entry_is_its_bytes_and_the_collector_has_nothing_to_walk_in_it() -> None:
    cache = AnalysisCache(max_entries=10, max_age_s=60)
    bound = cache.bind("t1", "alice", 1, b"fingerprint")
    assert bound is not None
    analysis = _analysis(SCRIPTS["ascii"] * 12)  # a long message: 120 positions
    bound.put("a long message", analysis)
    (entry,) = cache._entries.values()  # noqa: SLF001 - what the cache holds
    assert not gc.is_tracked(entry.value)  # one bytes object: not a tuple the next collection walks
    assert cache.estimated_bytes == ENTRY_BYTES + sys.getsizeof(encode(analysis))
    assert bound.get("a long message") == analysis


def test_the_byte_bound_counts_the_bytes_held() -> None:
    analysis = _analysis(SCRIPTS["bmp"])
    size = ENTRY_BYTES + sys.getsizeof(encode(analysis))
    cache = AnalysisCache(max_entries=100, max_age_s=60, max_bytes=2 * size)
    bound = cache.bind("t1", "alice", 1, b"fingerprint")
    assert bound is not None
    for text in ("one", "two", "three"):
        bound.put(text, analysis)
    assert len(cache) == 2 and cache.estimated_bytes == 2 * size
    assert bound.get("one") is None and bound.get("three") == analysis  # the least recently used went
