"""The analysis cache's size estimate: an upper bound of what an entry holds, exact for ASCII."""

from __future__ import annotations

import sys
from itertools import chain

import pytest

from service.recall.analysis_cache import (
    ENTRY_BYTES,
    FIELD_BYTES,
    POSITION_BYTES,
    TOKEN_BYTES,
    Analysis,
    estimated_bytes,
)


def _measured(analysis: Analysis) -> int:
    """The estimate's structure with each string sized by ``sys.getsizeof`` itself."""
    size = ENTRY_BYTES
    for fields in analysis:
        for positions in fields.values():
            tokens = sum(map(len, positions))
            size += FIELD_BYTES + POSITION_BYTES * len(positions) + TOKEN_BYTES * tokens
            size += sum(map(sys.getsizeof, chain.from_iterable(positions)))
    return size


def _shingled(words: list[str]) -> tuple[tuple[str, ...], ...]:
    return tuple(
        tuple(sorted({words[i], " ".join(words[i : i + 2]), " ".join(words[i : i + 3])})) for i in range(len(words))
    )


ASCII = ["redis", "eviction", "policy", "for", "the", "session", "store", "uses", "allkeys", "lru"]
SCRIPTS = {
    "latin-1": ["café", "crème", "brûlée", "über", "straße"],
    "bmp": ["東京", "データベース", "設計", "レディス", "설정"],
    "astral": ["🙂", "rocket", "🚀", "deploy", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"],
    "mixed": ["plain", "ascii", "then", "ünïcode", "and", "日本語", "and", "🚀"],
}


def test_an_ascii_analysis_is_sized_exactly() -> None:
    analysis: Analysis = (
        {"canonical_name.phrase": _shingled(ASCII), "aliases": tuple((w,) for w in ASCII)},
        {"aliases": tuple((w,) for w in ASCII[:3])},
    )
    assert estimated_bytes(analysis) == _measured(analysis)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_other_scripts_are_never_under_estimated(script: str) -> None:
    words = SCRIPTS[script]
    analysis: Analysis = ({"aliases.shingle": _shingled(words), "aliases": tuple((w,) for w in words)},)
    measured = _measured(analysis)
    # a bound, not a guess: at most the header difference and the widest character's bytes over
    assert measured <= estimated_bytes(analysis) <= 2 * measured


def test_an_empty_analysis_is_the_entry_alone() -> None:
    assert estimated_bytes(({},)) == ENTRY_BYTES
    assert estimated_bytes(({"aliases": ()},)) == ENTRY_BYTES + FIELD_BYTES
