"""CJK and accented text round-trips unchanged through the places a person or a model reads it:
sidecar extraction, alias candidates, the duplicate fingerprint, the injection render. No ``\\u``
escapes where a person reads, no cut through a character or grapheme."""

from __future__ import annotations

import json

from service.domain.belief import Belief, content_fingerprint
from service.extraction.sidecar import ParseStatus
from service.extraction.validator import validate_sidecar
from service.recall.context import RecallResult, TierEntry
from service.recall.query import clean_query
from service.recall.render import render_injection


def _belief(**extra: object) -> Belief:
    data: dict[str, object] = {
        "tenant_id": "t",
        "owner_id": "u",
        "type": "decision",
        "canonical_name": "決済プロバイダ",
        "aliases": ["決済代行", "Stripe"],
        "content": "決済プロバイダは Stripe に決定した。",
        "why_it_matters": "決済の実装例は Stripe の API で示す。",
        "scope": ["domain:code"],
    }
    return Belief.model_validate({**data, **extra})


def test_a_japanese_sidecar_is_accepted_with_names_and_aliases_as_written() -> None:
    sidecar = {
        "turn_signal": "substantive",
        "topic_label": "決済" * 60,
        "new_beliefs": [
            {
                "type": "decision",
                "canonical_name": "決済プロバイダ",
                "content": "決済プロバイダは Stripe に決定した。",
                "why_it_matters": "決済の実装例は Stripe で示す。",
                "scope": ["domain:code"],
                "confidence": 0.9,
                "aliases": ["決済代行", "ｽﾄﾗｲﾌﾟ"],
            }
        ],
        "entity_updates": [{"canonical_name": "セッションストア", "new_aliases": ["セッション管理"]}],
        "possible_alias_candidates": [
            {"surface": "決済代行", "possible_entities": ["決済プロバイダ"], "confidence": "high"}
        ],
    }
    out = validate_sidecar(json.dumps(sidecar, ensure_ascii=False), ParseStatus.PARSED)
    assert out.accepted and not out.skipped, out.skipped
    belief = out.new_beliefs[0]
    assert (belief.canonical_name, belief.aliases) == ("決済プロバイダ", ["決済代行", "ストライプ"])
    assert belief.content == "決済プロバイダは Stripe に決定した。"
    assert out.entity_updates[0].canonical_name == "セッションストア"
    assert out.entity_updates[0].new_aliases == ["セッション管理"]
    assert out.alias_candidates[0].possible_entities == ["決済プロバイダ"]
    assert out.topic_label is not None and set(out.topic_label) == {"決", "済"}


def test_duplicate_fingerprint_ignores_width_optional_spaces_and_the_closing_full_stop() -> None:
    same = [
        "決済プロバイダは Stripe に決定した。",
        "決済プロバイダはＳｔｒｉｐｅに決定した",
        "決済プロバイダは stripe に決定した",
    ]
    assert len({content_fingerprint(text) for text in same}) == 1
    assert content_fingerprint("決済プロバイダは PayPal に決定した。") != content_fingerprint(same[0])
    # English as always: case and whitespace only
    assert content_fingerprint("Uses Postgres 16.") == content_fingerprint("uses  postgres 16")
    assert content_fingerprint("a b") != content_fingerprint("ab")


def _render(belief: Belief, max_chars: int = 400) -> str:
    result = RecallResult(
        scopes=["domain:code"],
        query=clean_query("決済プロバイダは？"),
        persona=None,
        pinned=[],
        relevant=[TierEntry(belief=belief, score=14.0)],
        questions=[],
    )
    return render_injection(result, max_chars_per_belief=max_chars).text


def test_the_injection_block_carries_cjk_text_as_written() -> None:
    text = _render(_belief())
    assert "決済プロバイダは Stripe に決定した。" in text and "決済の実装例は Stripe の API で示す。" in text
    assert "\\u" not in text


def test_a_long_belief_is_clipped_between_graphemes_in_the_injection() -> None:
    content = "か\u3099" * 300  # kana + combining voiced sound mark: one grapheme each
    text = _render(_belief(content=content), max_chars=101)
    shown = json.loads(text.rsplit("<relevant_beliefs>", 1)[1].split("</relevant_beliefs>", 1)[0])[0]["content"]
    assert shown.endswith("か\u3099…") and len(shown) == 101
