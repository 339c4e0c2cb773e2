"""An alias a person took back (``POST /v1/beliefs/{id}/aliases/remove``) stays taken back: the
memory loop, run by the real Celery worker, does not add it again through an entity update, a
reinforcement or the alias flywheel, nor to the belief's next version; a person may still add it
back through the API."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.conftest import Team, ok
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn, wait_until
from tests.memory_loop.test_extraction_worker import post_turn

CONTENT = "Redis is the cache."


def _aliases(api: TestClient, team: Team, belief_id: str) -> list[str]:
    return list(ok(api.get(f"/v1/beliefs/{belief_id}", headers=team.h("alice")))["aliases"])


def _turn(api: TestClient, team: Team, said: str, **sections: Any) -> dict[str, Any]:
    posted = post_turn(api, team.h("alice"), "ok" + sidecar(**sections), user_message=said)
    return wait_turn(api, team.h("alice"), posted["turn_id"])


def test_the_memory_loop_never_adds_back_an_alias_a_person_removed(
    api: TestClient, crew: Team, worker: WorkerProcess
) -> None:
    body = {
        "type": "entity",
        "canonical_name": "redis_cache",
        "aliases": ["redis", "lru", "kv store"],
        "content": CONTENT,
        "why_it_matters": "Shapes cache answers toward Redis.",
        "scope": ["domain:code"],
    }
    bid = ok(api.post("/v1/beliefs", json=body, headers=crew.h("alice")), 201)["id"]
    taken_back = {"aliases": ["LRU", "kv store"]}
    removed = ok(api.post(f"/v1/beliefs/{bid}/aliases/remove", json=taken_back, headers=crew.h("alice")))
    assert removed["change_log"][-1]["removed_aliases"] == ["lru", "kv store"]

    said = "the lru and the kv store are on the fast path, the hot cache too"
    done = _turn(
        api,
        crew,
        said,
        entity_updates=[{"canonical_name": "redis_cache", "new_aliases": ["lru", "hot cache"]}],
        new_beliefs=[new_belief("redis_cache", CONTENT, type="entity", aliases=["kv store", "cache tier"])],
        possible_alias_candidates=[
            {"surface": "lru", "possible_entities": ["redis_cache"], "confidence": "high"},
            {"surface": "fast path", "possible_entities": ["redis_cache"], "confidence": "high"},
        ],
    )
    ops = {op["section"]: op for op in done["result"]["merge"]["ops"]}
    assert ops["entity_updates"]["outcome"] == "aliases_added" and "taken back" in ops["entity_updates"]["detail"]
    assert ops["new_beliefs"]["outcome"] == "reinforced"
    # the flywheel runs after extraction, both candidates in one task: once "fast path" is there,
    # "lru" was decided too
    aliases = wait_until(lambda: (a := _aliases(api, crew, bid)) and "fast path" in a and a)
    assert {"redis", "hot cache", "cache tier", "fast path"} <= set(aliases)
    assert "lru" not in aliases and "kv store" not in aliases

    # the next version keeps them taken back
    new_id = ok(
        api.post(f"/v1/beliefs/{bid}/supersede", json={"content": "Redis 7 is the cache."}, headers=crew.h("alice")),
        201,
    )["current"]["id"]
    _turn(api, crew, "the kv store", entity_updates=[{"canonical_name": "redis_cache", "new_aliases": ["kv store"]}])
    assert "kv store" not in _aliases(api, crew, new_id)

    # a person may give an alias back; then it is theirs again
    ok(api.post(f"/v1/beliefs/{new_id}/aliases", json={"aliases": ["lru"]}, headers=crew.h("alice")))
    assert "lru" in _aliases(api, crew, new_id)
