"""What a member's turn may write, through ``POST /v1/turns`` and the real Celery worker: the
sidecar is written by a model the member can steer, so it gets no more than the member's own
credentials would get from the beliefs API."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.config import Settings
from service.domain.belief import Belief
from service.domain.principal import Principal
from service.extraction.queue import TaskQueue
from service.extraction.sidecar import split_sidecar
from service.storage.lookup import BeliefLookup
from service.storage.turns import TurnRecord, TurnStore
from tests.api.conftest import Team, ok
from tests.factories import make_belief, put_all
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn, wait_until


def post_turn(
    api: TestClient, headers: dict[str, str], answer: str, scope: list[str], said: str = "ok"
) -> dict[str, Any]:
    body = {
        "model": "gpt-4o",
        "scope": scope,
        "session_id": "s-priv",
        "user_message": said,
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


def test_a_turn_does_not_re_alias_or_resolve_a_belief_its_author_may_not_change(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    """bob holds project pay only. alice's beliefs there also live in team core or in her own
    domain:code, so the API refuses bob's aliases and resolve (403); his turn's entity_updates, the
    same statement with new aliases, alias candidates and resolved questions changed them anyway,
    and the aliases then pulled them into team core's sessions, or alice's own. Now each alias is
    an alias-candidate review item for an admin and the question stays open."""
    put_all(
        loop_services.store,
        decision(crew, "deploy_window", "b-window", "Deploys happen on Tuesdays.", ["project:pay", "team:core"]),
        decision(
            crew, "payment_gateway", "b-gateway", "Stripe is the payment gateway.", ["project:pay", "domain:code"]
        ),
        decision(
            crew,
            "rollback_plan",
            "b-rollback",
            "How do we roll back a deploy?",
            ["project:pay", "team:core"],
            type="open_question",
            pinned=True,
        ),
    )
    for path, body in [
        ("b-window/aliases", {"aliases": ["release slot"]}),
        ("b-gateway/aliases", {"aliases": ["card processor"]}),
        ("b-rollback/resolve", {}),
    ]:
        refused = api.post(f"/v1/beliefs/{path}", json=body, headers=crew.h("bob"))
        assert refused.status_code == 403, refused.text
    answer = "ok" + sidecar(
        entity_updates=[{"canonical_name": "deploy_window", "new_aliases": ["release slot"]}],
        new_beliefs=[
            {
                **new_belief("payment_gateway", "Stripe is the payment gateway.", aliases=["card processor"]),
                "scope": ["project:pay"],
            }
        ],
        resolved_open_questions=["b-rollback"],
        possible_alias_candidates=[
            {"surface": "ship day", "possible_entities": ["deploy_window"], "confidence": "high"},
            {"surface": "psp", "possible_entities": ["payment_gateway"], "confidence": "high"},
        ],
    )
    turn = post_turn(api, crew.h("bob"), answer, ["project:pay"], said="is ship day fixed, and which psp do we use?")
    done = wait_turn(api, crew.h("bob"), turn["turn_id"])
    assert ops_of(done) == [
        ("entity_updates", "queued"),
        ("new_beliefs", "reinforced"),
        ("resolved_open_questions", "skipped"),
    ], done["result"]
    queued = wait_until(
        lambda: (
            (r := ok(api.get("/v1/admin/reviews", params={"kind": "alias_candidate"}, headers=crew.h("carol"))))
            and len(r) == 4
            and r
        )
    )
    assert sorted((r["belief_id"], r["surface"]) for r in queued) == [
        ("b-gateway", "card processor"),
        ("b-gateway", "psp"),
        ("b-window", "release slot"),
        ("b-window", "ship day"),
    ]
    alice = Principal(tenant_id=crew.tenant, user_id="alice", projects=frozenset({"pay"}), teams=frozenset({"core"}))
    assert loop_services.store.get(alice, "b-window").aliases == []
    gateway = loop_services.store.get(alice, "b-gateway")
    # one more statement of it is still counted: no text of bob's enters the belief
    assert gateway.aliases == [] and gateway.reinforcement_count == 1
    assert loop_services.store.get(alice, "b-rollback").resolved_at is None
    # alice may change her own beliefs: the same entity update from her turn is applied
    update = {"canonical_name": "deploy_window", "new_aliases": ["release slot"]}
    mine = post_turn(api, crew.h("alice"), "ok" + sidecar(entity_updates=[update]), ["project:pay"])
    assert ops_of(wait_turn(api, crew.h("alice"), mine["turn_id"])) == [("entity_updates", "aliases_added")]
    assert loop_services.store.get(alice, "b-window").aliases == ["release slot"]


def decision(team: Team, name: str, belief_id: str, content: str, scope: str | list[str], **extra: Any) -> Belief:
    """alice's decision (or ``type=...``) in ``scope``."""
    scopes = [scope] if isinstance(scope, str) else scope
    fields: dict[str, Any] = {"id": belief_id, "type": "decision", "content": content, "scope": scopes, **extra}
    return make_belief(team.tenant, "alice", name, **fields)


def test_a_statement_in_one_project_is_not_filed_against_another_projects_belief(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    """alice works in project pay and team core. team core already has a ``deploy_process`` (and
    a ``release_train``); the same names stated in a project pay session are pay's own beliefs:
    neither a conflict against core's belief (whose acceptance would write pay's statement into a
    belief team core reads) nor a reinforcement of it (which pay's members never see)."""
    put_all(
        loop_services.store,
        decision(crew, "deploy_process", "b-core-deploy", "Core deploys with ArgoCD.", "team:core"),
        decision(crew, "release_train", "b-core-train", "Releases ship every Monday.", "team:core"),
    )
    stated = [
        {**new_belief("deploy_process", "Pay deploys with Helm."), "scope": ["project:pay"]},
        {**new_belief("release_train", "Releases ship every Monday."), "scope": ["project:pay"]},
    ]
    turn = post_turn(api, crew.h("alice"), "Noted." + sidecar(new_beliefs=stated), ["project:pay"])
    done = wait_turn(api, crew.h("alice"), turn["turn_id"])
    assert ops_of(done) == [("new_beliefs", "inserted"), ("new_beliefs", "inserted")], done["result"]
    bob = Principal(tenant_id=crew.tenant, user_id="bob", projects=frozenset({"pay"}))
    lookup = BeliefLookup(loop_services.store)
    assert [b.content for b in lookup.by_name_or_alias(bob, "deploy_process")] == ["Pay deploys with Helm."]
    assert [b.content for b in lookup.by_name_or_alias(bob, "release_train")] == ["Releases ship every Monday."]
    core_member = Principal(tenant_id=crew.tenant, user_id="alice", teams=frozenset({"core"}))
    core = loop_services.store.get(core_member, "b-core-train")
    assert core.reinforcement_count == 0
    assert ok(api.get("/v1/reviews", headers=crew.h("alice"))) == []


def test_an_entity_update_goes_to_the_belief_of_the_sessions_scope(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    """Two ``deploy_process`` beliefs alice can see, team core's (older) and project pay's: new
    aliases named in a project pay session are pay's vocabulary, not core's; with no belief of that
    name in the session's scopes and several elsewhere, none is guessed."""
    put_all(
        loop_services.store,
        decision(crew, "deploy_process", "b-core-deploy", "Core deploys with ArgoCD.", "team:core"),
        decision(crew, "deploy_process", "b-pay-deploy", "Pay deploys with Helm.", "project:pay"),
    )
    update = {"canonical_name": "deploy_process", "new_aliases": ["helm chart"]}
    turn = post_turn(api, crew.h("alice"), "ok" + sidecar(entity_updates=[update]), ["project:pay"])
    done = wait_turn(api, crew.h("alice"), turn["turn_id"])
    assert [(o["outcome"], o.get("belief_id")) for o in done["result"]["merge"]["ops"]] == [
        ("aliases_added", "b-pay-deploy")
    ]
    alice = Principal(tenant_id=crew.tenant, user_id="alice", projects=frozenset({"pay"}), teams=frozenset({"core"}))
    assert loop_services.store.get(alice, "b-pay-deploy").aliases == ["helm chart"]
    assert loop_services.store.get(alice, "b-core-deploy").aliases == []
    elsewhere = post_turn(api, crew.h("alice"), "ok" + sidecar(entity_updates=[update]), ["domain:code"])
    done = wait_turn(api, crew.h("alice"), elsewhere["turn_id"])
    assert [o["outcome"] for o in done["result"]["merge"]["ops"]] == ["not_found"]
    assert loop_services.store.get(alice, "b-core-deploy").aliases == []


def recorded_turn(loop_services: Services, loop_settings: Settings, team: Team, owner: str, answer: str) -> str:
    """A turn of ``owner`` (who held project pay when it was recorded), stored but not yet sent to
    the worker: what a backlog, the sweep or a parked turn leaves waiting."""
    split = split_sidecar(answer)
    turn_id = f"turn-{uuid.uuid4().hex[:10]}"
    TurnStore(loop_services.opensearch, loop_settings.opensearch_namespace).create(
        TurnRecord(
            tenant_id=team.tenant,
            turn_id=turn_id,
            owner_id=owner,
            projects=["pay"],
            session_id="s-priv",
            scope=["project:pay"],
            model="gpt-4o",
            sidecar_raw=split.raw,
            parse_status=split.status.value,
        )
    )
    return turn_id


def test_extraction_writes_with_the_authors_grants_as_they_are_when_it_runs(
    api: TestClient,
    crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
) -> None:
    """Revoking a grant, or disabling a user, is enforced at once on every request; a turn
    recorded before and extracted after must not write into the revoked project, nor write at all
    for a disabled user."""
    answer = "ok" + sidecar(new_beliefs=[{**new_belief("pay_keys", "Keys rotate daily."), "scope": ["project:pay"]}])
    bobs = recorded_turn(loop_services, loop_settings, crew, "bob", answer)
    alices = recorded_turn(loop_services, loop_settings, crew, "alice", answer.replace("pay_keys", "pay_vault"))
    users = f"/v1/admin/tenants/{crew.tenant}/users"
    ok(api.patch(f"{users}/bob/grants", json={"remove_projects": ["pay"]}, headers=operator_headers))
    ok(api.post(f"{users}/alice/disable", headers=operator_headers))
    queue = TaskQueue(loop_settings)
    queue.extract(crew.tenant, bobs)
    queue.extract(crew.tenant, alices)
    done = wait_turn(api, crew.h("carol"), bobs)
    assert ops_of(done) == [("new_beliefs", "skipped")], done["result"]
    skipped = wait_turn(api, crew.h("carol"), alices)
    assert skipped["extraction_status"] == "skipped", skipped
    lookup = BeliefLookup(loop_services.store)
    pay = Principal(tenant_id=crew.tenant, user_id="carol", projects=frozenset({"pay"}))
    assert lookup.by_name_or_alias(pay, "pay_keys") == []
    assert lookup.by_name_or_alias(pay, "pay_vault") == []
