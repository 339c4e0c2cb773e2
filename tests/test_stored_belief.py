"""Stored beliefs decoded without validation give exactly the beliefs full validation gives, and a
document full validation refuses is refused the same way (service/domain/stored_belief.py).

Differential: every document of a generated corpus (benchmarks/recall_bench.py's, as the hot path
reads it and with its change log), and documents the model wrote from hostile input, decode to an
equal belief with the same fields set and the same JSON, almost all of them on the fast path.
Damage: a document with one field (or two) replaced by hostile values, a key removed or added,
loads or is quarantined exactly as under full validation, with the same reason; the planted
documents of the quarantine tests among them.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.recall_bench import Spec, belief_at
from service.domain import stored_belief
from service.domain.belief import Belief, ChangeLogEntry, Provenance
from service.domain.stored_belief import decode_stored
from service.storage.unreadable import why_unreadable

NOW = datetime(2026, 11, 30, 12, 30, 15, 250000, tzinfo=UTC)


def _stored(belief: Belief) -> dict[str, Any]:
    """The source as OpenSearch hands it back (JSON through orjson, as the client decodes it)."""
    document: dict[str, Any] = orjson.loads(orjson.dumps(belief.to_document()))
    return document


def _hot(document: dict[str, Any]) -> dict[str, Any]:
    """The source as recall reads it: the change log is excluded."""
    return {k: v for k, v in document.items() if k != "change_log"}


def _outcome(source: Any) -> tuple[str, Any]:
    try:
        belief = Belief.from_document(source)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        return "refused", type(exc).__name__
    return "loaded", belief


def assert_decodes_alike(source: Any) -> None:
    """decode_stored(source) is from_document(source): the same belief (fields, fields set, JSON
    in order) or the same refusal (exception type, quarantine reason)."""
    kind, expected = _outcome(source)
    if kind == "refused":
        with pytest.raises((ValueError, TypeError, AttributeError, KeyError)) as raised:
            decode_stored(source)
        assert type(raised.value).__name__ == expected
        return
    got = decode_stored(source)
    differ = {k: (v, expected.__dict__.get(k)) for k, v in got.__dict__.items() if v != expected.__dict__.get(k)}
    assert got == expected, differ
    assert got.model_fields_set == expected.model_fields_set
    assert list(got.model_dump(mode="json").items()) == list(expected.model_dump(mode="json").items())
    assert got.to_document() == expected.to_document()
    assert got.lifecycle is expected.lifecycle


def _fast(source: dict[str, Any]) -> bool:
    """Whether ``source`` decodes without validation (decode_stored falls back on any exception)."""
    try:
        stored_belief._construct(source)
    except (stored_belief._NeedsValidation, ValueError):
        return False
    return True


def _rich_beliefs() -> list[Belief]:
    """Beliefs the generated corpus lacks: every optional field, non-ASCII names and text, a
    change log, provenance, an expertise preference, a resolved question, a typed relation."""
    common: dict[str, Any] = {"tenant_id": "t1", "owner_id": "alice", "created_at": NOW, "updated_at": NOW}
    return [
        Belief(
            id="b-ja", type="entity", canonical_name="テスト方針",
            aliases=["セッションストア", "ＡＰＩ", "größenlimit"],
            content="Tests live beside the code.\n\tAlways.", why_it_matters="重要", scope=["project:pay"],
            provenance=Provenance(session_id="s1", turn_id="t9", source_model="gpt-4o", extracted_at=NOW),
            **common,
        ),
        Belief(
            id="b-exp", type="preference", subtype="expertise", expertise_domain="Rust", expertise_depth="deep",
            canonical_name="Redis Cache", aliases=["Redis", "redis-cache", "React.js"], content="Knows Rust.",
            scope=["user:universal"], pinned=True, user_edited=True, reinforcement_count=7,
            last_reinforced_at=NOW - timedelta(days=3, microseconds=1), version=4, compaction_note="merged b-2",
            change_log=[ChangeLogEntry(changed_at=NOW, trigger="reinforced", actor="alice", removed_aliases=["x"])],
            **common,
        ),
        Belief(
            id="b-q", type="open_question", canonical_name="which_queue", content="Kafka or NATS?", pinned=True,
            scope=["domain:code/python", "team:core"], epistemic_status="exploratory", resolved_at=NOW, **common,
        ),
        Belief(
            id="b-rel", type="relation", relation_type="Depends On", participants=["b-q", "b-exp"],
            canonical_name="api_depends_on_db", content="The API depends on the DB.", confidence=1.0,
            scope=["domain:code"], retracted_at=NOW, **common,
        ),
        Belief(
            id="b-old", type="decision", canonical_name="sticky_sessions", content="No sticky sessions <<b>>",
            epistemic_status="superseded", superseded_by="b-new", supersedes="b-older", confidence=0.0,
            scope=["project:pay"], **common,
        ),
    ]  # fmt: skip


def test_a_generated_corpus_decodes_alike_on_the_fast_path() -> None:
    spec, sources = Spec(), []
    for i in range(3000):
        document = _stored(belief_at(i, spec, NOW))
        sources += [_hot(document), document]
    for source in sources:
        assert_decodes_alike(source)
    assert all(_fast(source) for source in sources)  # the generated corpus never needs the slow path


def test_rich_beliefs_decode_alike() -> None:
    for belief in _rich_beliefs():
        for source in (_stored(belief), _hot(_stored(belief))):
            assert_decodes_alike(source)
            read_back = belief.model_copy(update={"change_log": Belief.from_document(source).change_log})
            assert decode_stored(source) == read_back
    hot = [_hot(_stored(b)) for b in _rich_beliefs()]
    assert sum(_fast(source) for source in hot) == len(hot)  # non-ASCII text is checked, not refused


# Hostile values, as the write-property test sends them, plus the shapes a hand edit leaves.
HOSTILE_CHARS = st.sampled_from(
    [" ", "\u3000", "\u2028", "\u00a0", "\t", "\n", "\r", "\x00", "\x1b[31m", "\u202e", "\u2066", "\u200b",
     "\ufeff", "\x85", "<", ">", "<<<", ">>>", "<<<SIDECAR_JSON>>>", "é", "e\u0301", "ß", "テスト", "ＡＰＩ",
     "A", "z", "_", "-", ".", "0", ":", "/", "user:universal", "project:pay", "universal"]
)  # fmt: skip
TEXT = st.one_of(
    st.text(max_size=30),
    st.lists(HOSTILE_CHARS, max_size=20).map("".join),
    st.builds(lambda w, n: (w * n)[:9000], st.sampled_from(["ab_", "Ab", "x ", "é"]), st.integers(1, 3000)),
    st.sampled_from(["", "b-1", "2026-11-30T12:00:00Z", "2026-11-30T12:00:00.5Z", "2026-02-30T12:00:00Z",
                     "2026-11-30T12:00:00+00:00", "2026-11-30", "٢٠٢٦-11-30T12:00:00Z", "decision", "deep",
                     "expertise", "active", "superseded", "b-1\n"]),
)  # fmt: skip
NUMBER = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.0, 1.0, 1.5, -0.0, 2**63]),
)
SCALAR = st.one_of(TEXT, NUMBER, st.booleans(), st.none())
VALUE = st.one_of(
    SCALAR,
    st.lists(SCALAR, max_size=4),
    st.lists(TEXT, max_size=30),
    st.dictionaries(st.sampled_from([*Provenance.model_fields, "extra"]), SCALAR, max_size=3),
)
FIELD = st.sampled_from([*Belief.model_fields, "lifecycle", "content_hash", "_id", "user_id", "extra"])


# without these the model invents a value (a new id, the time of the read): they are replaced, not
# removed, here; test_a_document_without_them_takes_the_slow_path covers their removal
_INVENTED = ("id", "created_at", "updated_at")


@st.composite
def damaged(draw: st.DrawFn) -> dict[str, Any]:
    beliefs = [belief_at(draw(st.integers(0, 5000)), Spec(), NOW), *_rich_beliefs()]
    source = _stored(draw(st.sampled_from(beliefs)))
    if draw(st.booleans()):
        source = _hot(source)
    for _ in range(draw(st.integers(1, 2))):
        field = draw(FIELD)
        if draw(st.integers(0, 5)) == 0 and field not in _INVENTED:
            source.pop(field, None)
        else:
            source[field] = draw(VALUE)
    return source


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_damaged_documents_load_or_quarantine_as_under_full_validation(source: dict[str, Any]) -> None:
    assert_decodes_alike(source)
    assert why_unreadable(source) == _reason_of_full_validation(source)


def _reason_of_full_validation(source: dict[str, Any]) -> str | None:
    from service.storage.unreadable import _reason

    try:
        Belief.from_document(source)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        return _reason(exc)
    return None


# The documents the quarantine tests plant (tests/security/test_quarantine.py and the upgrade
# tests), and a few more a hand edit leaves.
POISON: list[dict[str, Any]] = [
    {"content": ""},
    {"content": "   "},
    {"content": "\u3000\u2028"},
    {"canonical_name": "payments_" + "very_long_" * 18 + "name"},
    {"canonical_name": "___"},
    {"scope": "project:pay"},
    {"scope": []},
    {"scope": ["bogus scope"]},
    {"aliases": ["x" * 101]},
    {"aliases": [f"a{i}" for i in range(26)]},
    {"type": "other"},
    {"confidence": 1.5},
    {"confidence": math.nan},
    {"created_at": "yesterday"},
    {"participants": ["b-1"]},
    {"subtype": "expertise"},
    {"superseded_by": "b-2"},
    {"extra": 1},
    {"id": "bad id"},
    {"version": 0},
]


@pytest.mark.parametrize("damage", POISON, ids=[next(iter(d)) + str(i) for i, d in enumerate(POISON)])
def test_every_poisoned_document_is_refused_with_the_same_reason(damage: dict[str, Any]) -> None:
    good = Belief(
        id="b-p", tenant_id="t1", owner_id="bob", type="decision", canonical_name="payments_database",
        aliases=["payments database", "payments"], content="placeholder", why_it_matters="Shapes payment answers.",
        scope=["project:pay"], pinned=True, created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    for source in ({**_stored(good), **damage}, _hot({**_stored(good), **damage})):
        assert why_unreadable(source) is not None
        assert why_unreadable(source) == _reason_of_full_validation(source)
        assert not _fast(source)
        assert_decodes_alike(source)


def test_non_dict_sources_are_refused_as_before() -> None:
    sources: list[Any] = [None, [], "x", 1]
    for source in sources:
        assert_decodes_alike(source)


def test_a_document_without_what_the_model_would_invent_takes_the_slow_path() -> None:
    source = _hot(_stored(belief_at(1, Spec(), NOW)))
    assert _fast(source)
    for field in _INVENTED:
        assert not _fast({k: v for k, v in source.items() if k != field})


def test_beliefs_decoded_from_alike_documents_share_one_fields_set() -> None:
    """What a recall keeps should cost the collector little: beliefs whose documents have the same
    keys share one fields set, as do their provenances; each still reads as its own keys, and a
    copy with changes has a set of its own, leaving the others' as they were."""
    spec = Spec()
    first, second = (decode_stored(_hot(_stored(belief_at(i, spec, NOW)))) for i in (1, 2))
    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    assert first.provenance.__pydantic_fields_set__ is second.provenance.__pydantic_fields_set__
    assert first.model_fields_set == Belief.from_document(_hot(_stored(belief_at(1, spec, NOW)))).model_fields_set
    keys = set(second.model_fields_set)
    changed = first.model_copy(update={"why_it_matters": "Use the raw driver."})
    assert changed.model_fields_set == keys | {"why_it_matters"}
    assert first.model_fields_set == second.model_fields_set == keys


def test_no_service_code_reads_a_fields_set() -> None:
    """What makes sharing fields sets safe (``_shared_fields_set``): nothing in the service reads
    one, so a field assigned on one decoded belief that adds its name to a shared set changes no
    answer. A use of ``exclude_unset`` or ``model_fields_set`` needs a set of its own per belief."""
    from pathlib import Path

    service = Path(stored_belief.__file__).resolve().parents[1]
    readers = [
        f"{path.relative_to(service.parent)}:{number}"
        for path in sorted(service.rglob("*.py"))
        if path.name != "stored_belief.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(word in line for word in ("exclude_unset", "model_fields_set", "__pydantic_fields_set__", "fields_set"))
    ]
    assert readers == []
