"""What a member's turn may write, through ``POST /v1/turns`` and the real Celery worker: the
sidecar is written by a model the member can steer, so it gets no more than the member's own
credentials would get from the beliefs API."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.domain.principal import Principal
from tests.api.conftest import Team, ok
from tests.factories import make_belief, put_all
from tests.memory_loop.conftest import WorkerProcess, sidecar, wait_turn


def post_turn(api: TestClient, headers: dict[str, str], answer: str, scope: list[str]) -> dict[str, Any]:
    body = {
        "model": "gpt-4o",
        "scope": scope,
        "session_id": "s-priv",
        "user_message": "ok",
        "assistant_message": answer,
    }
    return dict(ok(api.post("/v1/turns", json=body, headers=headers), 202))


def ops_of(turn: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["section"], o["outcome"]) for o in turn["result"]["merge"]["ops"]]


def test_a_turn_cannot_supersede_a_belief_in_a_scope_its_author_holds_no_grant_to(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    # alice's decision is shared with project pay and team core; bob holds pay only, so he sees it
    # but may not write into team core: the API refuses his supersede
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "deploy_window",
            id="b-deploy-window",
            type="decision",
            content="Deploys happen on Tuesdays.",
            scope=["project:pay", "team:core"],
        ),
    )
    refused = api.post(
        "/v1/beliefs/b-deploy-window/supersede", json={"content": "Deploy any time."}, headers=crew.h("bob")
    )
    assert refused.status_code == 403, refused.text
    update = {"belief_id": "b-deploy-window", "change": "superseded", "new_content": "Deploy any time."}
    turn = post_turn(api, crew.h("bob"), "Sure." + sidecar(belief_updates=[update]), ["project:pay"])
    done = wait_turn(api, crew.h("bob"), turn["turn_id"])
    assert done["extraction_status"] == "done", done
    # not applied: a proposal for an admin, like a supersede of a user-edited belief
    assert ops_of(done) == [("belief_updates", "conflict_queued")], done["result"]
    alice = Principal(tenant_id=crew.tenant, user_id="alice", projects=frozenset({"pay"}), teams=frozenset({"core"}))
    kept = loop_services.store.get(alice, "b-deploy-window")
    assert kept.is_live and kept.content == "Deploys happen on Tuesdays."
    assert kept.superseded_by is None
    # alice holds both grants: the same update from her turn is applied
    turn = post_turn(api, crew.h("alice"), "Sure." + sidecar(belief_updates=[update]), ["project:pay"])
    assert ops_of(wait_turn(api, crew.h("alice"), turn["turn_id"])) == [("belief_updates", "superseded")]
