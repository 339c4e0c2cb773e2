"""A Japanese team through the OpenAI-compatible proxy: the question is answered with its own
beliefs injected as written, the Japanese answer comes back unchanged, and the sidecar's Japanese
belief is extracted with its name as written and recalled on the next turn."""

from __future__ import annotations

from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from tests.api.conftest import Team, ok
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn
from tests.memory_loop.test_proxy import chat

ANSWER = "セッションストアは Redis です。TTL は 30 分に設定してください。"


def test_a_japanese_turn_injects_answers_and_extracts_as_written(
    api: TestClient, crew: Team, llm: ScriptedLLM, worker: WorkerProcess
) -> None:
    body = {
        "type": "decision",
        "canonical_name": "セッションストア",
        "aliases": ["セッション管理"],
        "content": "セッションストアは Redis に置き、TTL は 30 分。",
        "why_it_matters": "セッション関連の回答は Redis 前提で書く。",
        "scope": ["domain:code"],
    }
    store_id = ok(api.post("/v1/beliefs", json=body, headers=crew.h("alice")), 201)["id"]
    extracted = new_belief(
        "決済プロバイダ",
        "決済プロバイダは Stripe に決定した。",
        why_it_matters="決済の実装例は Stripe で示す。",
        aliases=["決済代行"],
    )
    llm.script(Reply(content=ANSWER + "\n\n" + sidecar(new_beliefs=[extracted])))

    response = ok(chat(api, crew.h("alice"), "セッションストアの設定を教えて"))
    assert response["choices"][0]["message"]["content"] == ANSWER
    assert response["tenure"]["injected_belief_ids"] == [store_id]
    system = llm.requests[-1]["messages"][0]["content"]
    assert "セッション関連の回答は Redis 前提で書く。" in system and "\\u30" not in system

    done = wait_turn(api, crew.h("alice"), response["tenure"]["turn_id"])
    assert done["result"]["merge"]["ops"][0]["outcome"] == "inserted"
    names = {b["canonical_name"]: b for b in ok(api.get("/v1/beliefs", headers=crew.h("alice")))["items"]}
    assert names["決済プロバイダ"]["aliases"] == ["決済代行"]

    llm.script(Reply(content="了解です。"))
    again = ok(chat(api, crew.h("alice"), "決済代行の手数料はいくら？"))
    assert again["tenure"]["injected_belief_ids"] == [names["決済プロバイダ"]["id"]]
