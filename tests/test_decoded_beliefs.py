"""Recall's hits are validated once per stored document version; unloadable ones still quarantine."""

from __future__ import annotations

from typing import Any

import pytest

from service.domain.belief import Belief
from service.storage import unreadable
from service.storage.unreadable import DecodedBeliefs


def _row(source: dict[str, Any], seq_no: int | None = 1) -> dict[str, Any]:
    row: dict[str, Any] = {"_index": "ns-beliefs-000001", "_id": f"t1:{source.get('id')}", "_source": source}
    if seq_no is not None:
        row.update(_seq_no=seq_no, _primary_term=1)
    return row


def _source(name: str = "redis_cache") -> dict[str, Any]:
    belief = Belief.from_record(
        {"id": "b-1", "owner_id": "u1", "type": "decision", "canonical_name": name, "content": "Use Redis.",
         "why_it_matters": "Speed.", "scope": ["domain:code"]},
        tenant_id="t1",
    )  # fmt: skip
    return belief.to_document()


def test_one_stored_version_is_validated_once() -> None:
    cache = DecodedBeliefs()
    first = cache.load(_row(_source()))
    again = cache.load(_row(_source()))
    assert first is not None and again is first
    changed = cache.load(_row(_source("redis_store"), seq_no=2))  # a write: a new version
    assert changed is not None and changed.canonical_name == "redis_store" and changed is not first


def test_hits_without_a_version_are_decoded_afresh() -> None:
    cache = DecodedBeliefs()
    a, b = cache.load(_row(_source(), seq_no=None)), cache.load(_row(_source(), seq_no=None))
    assert a is not None and b is not None and a is not b and len(cache) == 0


def test_an_unloadable_document_is_quarantined_every_time_and_never_kept() -> None:
    cache = DecodedBeliefs()
    broken = {**_source(), "id": "b-2", "content": ""}  # stored before the rule existed
    for _ in range(2):
        loaded = cache.load_all([_row(broken), _row(_source())])
        assert [b.id for b in loaded] == ["b-1"] and loaded.quarantined == ["b-2"]
    assert len(cache) == 1  # only the loadable one


def test_the_cache_is_bounded() -> None:
    cache = DecodedBeliefs(max_entries=2)
    for seq in range(5):
        cache.load(_row(_source(), seq_no=seq))
    assert len(cache) == 2


def test_forget_drops_every_version_of_the_erased_documents_only() -> None:
    cache = DecodedBeliefs()
    for seq in (1, 2):
        cache.load(_row(_source(), seq_no=seq))
    kept = {**_source(), "id": "b-kept"}
    cache.load(_row(kept))
    assert cache.forget(["t1:b-1", "t2:b-kept"]) == 2  # another tenant's id is another document
    assert len(cache) == 1 and cache.load(_row(kept)) is not None and cache.hits == 1


def test_entries_decoded_long_ago_leave_from_the_least_recently_used_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """An erased belief is never hit again: it drifts to the least recently used end, and a batch
    of hits drops what was decoded more than DECODED_MAX_AGE_S ago there, so its text leaves the
    process although nothing pushes it out of the bound."""
    clock = [1000.0]
    monkeypatch.setattr(unreadable.time, "monotonic", lambda: clock[0])
    cache = DecodedBeliefs()
    erased = {**_source(), "id": "b-erased"}
    cache.load(_row(erased))
    clock[0] += 10
    cache.load_all([_row(_source())])
    clock[0] += unreadable.DECODED_MAX_AGE_S - 5  # the erased one is past the age, b-1 not yet
    cache.load_all([_row(_source())])
    assert len(cache) == 1 and cache.load(_row(_source())) is not None and cache.misses == 2
