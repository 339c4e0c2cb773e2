"""The belief model: loads the paper's seed as is, normalises, and rejects bad input precisely."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from evals.cases import PAPER_DIR
from service.domain.belief import Belief, ChangeLogEntry, Lifecycle, normalize_canonical_name, roll_over
from tests.factories import make_belief

SEED: list[dict[str, Any]] = json.loads((PAPER_DIR / "beliefs.seed.json").read_text())


def base(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "tenant_id": "acme",
        "owner_id": "ana",
        "type": "preference",
        "canonical_name": "language_typescript",
        "aliases": ["TypeScript", "TS"],
        "content": "Writes TypeScript in strict mode.",
        "why_it_matters": "Shapes code examples toward strict TypeScript.",
        "scope": ["domain:code"],
    }
    data.update(overrides)
    return data


def errors_of(**overrides: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        Belief.model_validate(base(**overrides))
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors()]


def test_the_whole_seed_loads_as_is() -> None:
    beliefs = [Belief.from_record(r, tenant_id="paper") for r in SEED]
    assert len(beliefs) == 29
    by_id = {b.id: b for b in beliefs}
    assert by_id["b-other-user-leak-check"].owner_id == "other-user"
    assert by_id["b-mongo-raw-driver"].aliases == ["mongodb", "mongo", "moongoose"]
    assert by_id["b-linting-v0"].lifecycle is Lifecycle.SUPERSEDED
    assert by_id["b-hosting-resolved"].lifecycle is Lifecycle.RESOLVED
    assert {b.tenant_id for b in beliefs} == {"paper"}


def test_tenant_in_a_record_is_ignored_in_favour_of_the_callers() -> None:
    record = {**SEED[0], "tenant_id": "someone-else"}
    assert Belief.from_record(record, tenant_id="mine").tenant_id == "mine"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Redis Cache", "redis_cache"),
        ("redisCache", "redis_cache"),
        ("  ci-pipeline ", "ci_pipeline"),
        ("MongoDB__raw", "mongo_db_raw"),
        ("HTTPServer v2", "httpserver_v2"),
        ("k8sCluster", "k8s_cluster"),
        # any script: NFKC, lower-cased, Latin snake_cased, CJK kept as written
        ("テスト方針", "テスト方針"),
        ("数据库选型", "数据库选型"),
        ("Größenlimit", "größenlimit"),
        ("Überwachung", "überwachung"),
        ("configuración regional", "configuración_regional"),
        ("configuraciónRegional", "configuración_regional"),
        ("ＡＰＩ　Ｇａｔｅｗａｙ", "api_gateway"),
        ("ｻｰﾊﾞｰ設定", "サーバー設定"),
        ("Cafe\u0301 au lait", "café_au_lait"),
        ("テスト・方針", "テスト_方針"),
        ("데이터베이스 선택", "데이터베이스_선택"),
        ("हिन्दी नाम", "हिन्दी_नाम"),
    ],
)
def test_canonical_names_become_snake_case(raw: str, expected: str) -> None:
    assert normalize_canonical_name(raw) == expected


@pytest.mark.parametrize(
    "raw", ["Redis Cache", "テスト・方針", "Größenlimit", "İstanbul Ofisi", "ǅungla", "ＡＰＩ", "Cafe\u0301", "ﬁle"]
)
def test_normalising_a_canonical_name_twice_changes_nothing(raw: str) -> None:
    once = normalize_canonical_name(raw)
    assert normalize_canonical_name(once) == once


def test_every_english_name_of_the_paper_keeps_its_exact_form() -> None:
    for record in SEED:
        assert normalize_canonical_name(record["canonical_name"]) == record["canonical_name"]


def test_cjk_and_accented_names_and_aliases_are_accepted_as_written() -> None:
    belief = Belief.model_validate(
        base(canonical_name="テスト方針", aliases=["セッションストア", "ＲＥＤＩＳ", "Überwachung", "ｻｰﾊﾞｰ"])
    )
    assert belief.canonical_name == "テスト方針"
    assert belief.aliases == ["セッションストア", "redis", "überwachung", "サーバー"]


def test_name_length_is_checked_on_the_normalised_value() -> None:
    # 120 ideographs are within the limit; "a - " * 40 is 160 raw characters but 79 normalised
    assert Belief.model_validate(base(canonical_name="数" * 120)).canonical_name == "数" * 120
    assert Belief.model_validate(base(canonical_name="a - " * 40)).canonical_name == "_".join("a" * 40)
    assert any(
        loc == "canonical_name" and "once normalised" in msg for loc, msg in errors_of(canonical_name="数" * 121)
    )
    # NFKC expands U+FDFA to 18 characters: 7 of them are 126 once normalised
    assert any(loc == "canonical_name" for loc, _ in errors_of(canonical_name="\ufdfa" * 7))


def test_alias_length_is_checked_on_the_normalised_value() -> None:
    # runs of (full-width) spaces collapse: 152 raw characters, 3 normalised
    assert Belief.model_validate(base(aliases=["ｘ" + "\u3000 " * 75 + "y"])).aliases == ["x y"]
    too_long = errors_of(aliases=["設" * 101])
    assert any(loc == "aliases" and "longer than 100" in msg and "設" in msg for loc, msg in too_long), too_long


def test_aliases_are_normalised_and_deduplicated() -> None:
    belief = Belief.model_validate(base(aliases=[" TS ", "ts", "Type  Script", ""]))
    assert belief.aliases == ["ts", "type script"]


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"confidence": 1.5}, "confidence", "less than or equal to 1"),
        ({"type": "opinion"}, "type", "Input should be"),
        ({"scope": ["galaxy:far"]}, "scope", "invalid scope label"),
        ({"scope": []}, "scope", "at least 1"),
        ({"aliases": [f"a{i}" for i in range(26)]}, "aliases", "at most 25 aliases"),
        ({"canonical_name": "!!!"}, "canonical_name", "at least one letter or digit"),
        ({"canonical_name": "・・　！"}, "canonical_name", "at least one letter or digit"),
        ({"content": ""}, "content", "at least 1 character"),
        ({"type": "entity", "subtype": "style"}, "", "subtype"),
        ({"type": "relation"}, "", "at least two participants"),
        ({"id": "bad id with spaces"}, "id", "pattern"),
        ({"colour": "blue"}, "colour", "Extra inputs are not permitted"),
    ],
)
def test_invalid_input_gets_a_precise_error(overrides: dict[str, Any], field: str, fragment: str) -> None:
    errors = errors_of(**overrides)
    assert any(loc == field and fragment in msg for loc, msg in errors), errors


def test_document_round_trip_keeps_everything() -> None:
    belief = Belief.from_record(SEED[5], tenant_id="paper")
    doc = belief.to_document()
    assert doc["lifecycle"] == "live" and len(doc["content_hash"]) == 64
    assert Belief.from_document(doc) == belief


def test_removed_aliases_survive_the_change_log_rollover() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    entries = [ChangeLogEntry(changed_at=at, trigger="created")]
    entries.append(ChangeLogEntry(changed_at=at, trigger="aliases removed", removed_aliases=["lru"]))
    for round_ in range(3):  # the first removal is dropped by the first rollover, the rest later
        entries += [ChangeLogEntry(changed_at=at, trigger="reinforced") for _ in range(10)]
        entries.append(ChangeLogEntry(changed_at=at, trigger="aliases removed", removed_aliases=[f"x{round_}"]))
        entries = roll_over(entries, cap=6)
    assert len(entries) == 6 and entries[1].trigger == "change log rolled over"
    belief = make_belief("t", "u", "redis_cache", aliases=["redis", "x1"])
    belief.change_log = entries
    assert belief.removed_aliases() == ["lru", "x0", "x2"]  # x1 was given back: no longer refused
