"""POST /v1/recall sends the injection block once (API change of 2026-11-30, docs/api.md).

The route builds its JSON by hand (no model instance per hit, no re-validation); these tests hold
it to the published model: every answer validates as ``RecallOut`` and dumps back to the same JSON,
and the two parts cut from ``injection.text`` are the parts the old format sent.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service.api.routes.recall import RecallOut
from service.recall.render import InjectionBlock
from tests.api.conftest import Team, belief_body, ok


def _recall(client: TestClient, team: Team, **extra: Any) -> dict[str, Any]:
    body = {"scopes": ["domain:code"], "query": "how do we size the ledger_cache?", **extra}
    return ok(client.post("/v1/recall", json=body, headers=team.h("alice")))


def _cut(injection: dict[str, Any]) -> tuple[str, str]:
    text = injection["text"]
    return text[: injection["beliefs_end"]], text[injection["dynamic_start"] :]


def test_the_answer_is_the_published_model_and_the_block_is_sent_once(client: TestClient, team: Team) -> None:
    for name, extra in (("ledger_cache", {}), ("ledger_pin", {"pinned": True})):
        body = belief_body(name, "domain:code", content=f"About {name}: ünïcödé テスト.", **extra)
        ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    lean = _recall(client, team)
    assert RecallOut.model_validate(lean).model_dump(mode="json") == lean
    injection = lean["injection"]
    assert injection["beliefs"] is None and injection["dynamic"] is None  # not sent twice
    beliefs, dynamic = _cut(injection)
    assert "ledger_pin" in beliefs and "ledger_cache" in dynamic
    assert injection["text"] == f"{beliefs}\n\n{dynamic}"

    full = _recall(client, team, injection_parts=True)
    assert RecallOut.model_validate(full).model_dump(mode="json") == full
    assert (full["injection"]["beliefs"], full["injection"]["dynamic"]) == (beliefs, dynamic)
    assert {k: v for k, v in full.items() if k not in ("injection", "receipt_id")} == {
        k: v for k, v in lean.items() if k not in ("injection", "receipt_id")
    }


def test_offsets_cut_the_parts_back_whichever_is_empty() -> None:
    for beliefs, dynamic in (("stable", "dynamic ü"), ("", "dynamic"), ("stable テスト", ""), ("", "")):
        block = InjectionBlock(beliefs=beliefs, dynamic=dynamic)
        assert block.text[: block.beliefs_end] == beliefs
        assert block.text[block.dynamic_start :] == dynamic
