"""The paper's merge rules (§4.5) on a real store: confidence floor, reinforcement with aliases,
conflicts to the review queue (never overwritten), explicit supersede with inherited aliases and
counter-signals, entity updates within the alias cap, open questions, promotion, audit."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.beliefs.lifecycle import BeliefLifecycle
from service.config import Settings
from service.domain.belief import Belief, EpistemicStatus, utcnow
from service.domain.principal import Principal, Role
from service.extraction.merge import BeliefMerger, MergeContext, MergeReport
from service.extraction.sidecar import ParseStatus
from service.extraction.validator import AliasCandidate, validate_sidecar
from service.recall.context import ContextBuilder
from service.storage.audit import AuditQuery
from service.storage.reviews import ReviewStore
from tests.api.conftest import Team, ok
from tests.factories import make_belief, put_all
from tests.memory_loop.conftest import new_belief


@pytest.fixture
def merger(loop_services: Services, loop_settings: Settings) -> BeliefMerger:
    reviews = ReviewStore(loop_services.opensearch, loop_settings.opensearch_namespace)
    lifecycle = BeliefLifecycle(loop_services.store, loop_services.audit, refresh="true")
    return BeliefMerger(lifecycle, reviews, loop_settings.loop)


def run(merger: BeliefMerger, who: Principal, **sections: Any) -> MergeReport:
    payload = {"turn_signal": "substantive", **sections}
    validated = validate_sidecar(json.dumps(payload), ParseStatus.PARSED)
    assert validated.accepted, validated.rejected_reason
    ctx = MergeContext(who, "sess", f"turn-{uuid.uuid4().hex[:8]}", "gpt-4o", ["domain:code"])
    return merger.apply(ctx, validated)


def outcomes(report: MergeReport) -> list[str]:
    return [op.outcome for op in report.ops]


def alice(team: Team) -> Principal:
    return Principal(tenant_id=team.tenant, user_id="alice", projects=frozenset({"pay"}))


def test_confidence_floor(merger: BeliefMerger, crew: Team, loop_services: Services) -> None:
    report = run(
        merger,
        alice(crew),
        new_beliefs=[
            new_belief("weak_guess", "Maybe uses Kafka.", confidence=0.34),
            new_belief("floor_fact", "Uses Kafka.", confidence=0.35),
        ],
    )
    assert outcomes(report) == ["skipped_low_confidence", "inserted"]
    stored = loop_services.store.get(alice(crew), str(report.ops[1].belief_id))
    assert stored.canonical_name == "floor_fact"
    assert stored.provenance.source_model == "gpt-4o"
    assert stored.change_log[0].trigger == "created (extraction)"


def test_same_content_reinforces_and_adds_aliases(merger: BeliefMerger, crew: Team, loop_services: Services) -> None:
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "redis_cache",
            id="b-redis",
            type="entity",
            aliases=["redis"],
            content="Redis is the cache.",
        ),
    )
    report = run(
        merger,
        alice(crew),
        new_beliefs=[
            new_belief("redis_cache", "redis is the cache", type="entity", aliases=["cache store"]),
            new_belief("Redis", "Redis is the cache!", type="entity", aliases=["kv"]),  # matched via its alias
        ],
    )
    assert outcomes(report) == ["reinforced", "reinforced"]
    belief = loop_services.store.get(alice(crew), "b-redis")
    assert belief.aliases == ["redis", "cache store", "kv"]
    assert belief.reinforcement_count == 1  # one turn reinforces once
    assert belief.content == "Redis is the cache."


def test_different_content_goes_to_the_review_queue_and_admins_resolve_it(
    merger: BeliefMerger, crew: Team, loop_services: Services, api: TestClient
) -> None:
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "ci_runner",
            id="b-ci",
            type="decision",
            aliases=["ci"],
            content="CI runs on Jenkins.",
            confidence=0.8,
        ),
    )
    report = run(
        merger, alice(crew), new_beliefs=[new_belief("ci_runner", "CI runs on GitHub Actions.", confidence=0.75)]
    )
    assert outcomes(report) == ["conflict_queued"]
    assert loop_services.store.get(alice(crew), "b-ci").content == "CI runs on Jenkins."  # never overwritten
    mine = ok(api.get("/v1/reviews", headers=crew.h("alice")))
    assert [r["belief_id"] for r in mine] == ["b-ci"]
    assert mine[0]["paper_outcome"] == "flagged_conflict"
    assert ok(api.get("/v1/reviews", headers=crew.h("bob"))) == []
    assert api.get("/v1/admin/reviews", headers=crew.h("alice")).status_code == 403
    queue = ok(api.get("/v1/admin/reviews", params={"kind": "conflict"}, headers=crew.h("carol")))
    assert [r["review_id"] for r in queue] == [mine[0]["review_id"]]
    bad = api.post(
        f"/v1/admin/reviews/{mine[0]['review_id']}/resolve", json={"action": "apply_alias"}, headers=crew.h("carol")
    )
    assert bad.status_code == 422
    resolved = ok(
        api.post(
            f"/v1/admin/reviews/{mine[0]['review_id']}/resolve",
            json={"action": "accept_proposed"},
            headers=crew.h("carol"),
        )
    )
    assert resolved["status"] == "resolved"
    old = loop_services.store.get(alice(crew), "b-ci")
    new = loop_services.store.get(alice(crew), resolved["result_belief_id"])
    assert old.superseded_by == new.id
    assert old.epistemic_status is EpistemicStatus.SUPERSEDED
    assert new.content == "CI runs on GitHub Actions."
    assert new.aliases == ["ci"]
    again = api.post(
        f"/v1/admin/reviews/{mine[0]['review_id']}/resolve", json={"action": "dismiss"}, headers=crew.h("carol")
    )
    assert again.status_code == 409


def test_admins_merge_a_conflict_into_the_existing_belief(
    merger: BeliefMerger, crew: Team, other_crew: Team, loop_services: Services, api: TestClient
) -> None:
    """merge: a new version of the existing belief (its name and scopes) with the union of aliases
    and the content/why-it-matters chosen per field; the old version stays in the chain; one
    belief.merge event; the same grants as the other resolutions (admins of the tenant only)."""
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "ci_runner",
            id="b-ci",
            type="decision",
            aliases=["ci"],
            content="CI runs on Jenkins.",
            why_it_matters="Pipelines are Jenkinsfiles.",
            confidence=0.8,
        ),
    )
    proposal = new_belief("ci_runner", "CI runs on GitHub Actions.", aliases=["gha", "github actions"], confidence=0.75)
    assert outcomes(run(merger, alice(crew), new_beliefs=[proposal])) == ["conflict_queued"]
    review_id = ok(api.get("/v1/admin/reviews", headers=crew.h("carol")))[0]["review_id"]
    url = f"/v1/admin/reviews/{review_id}/resolve"
    merge = {"action": "merge", "merge": {"content": "proposed", "why_it_matters": "existing"}}

    assert api.post(url, json=merge, headers=crew.h("alice")).status_code == 403  # a member
    assert api.post(url, json=merge, headers=other_crew.h("carol")).status_code == 404  # another tenant's admin
    wrong = [
        {"action": "keep_existing", "merge": {}},  # merge choices only with merge
        {"action": "merge", "merge": {"content": "theirs"}},
        {"action": "merge", "merge": {"edited_content": ""}},
    ]
    for body in wrong:
        refused = api.post(url, json=body, headers=crew.h("carol"))
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "validation_error"
    assert loop_services.store.get(alice(crew), "b-ci").is_live  # nothing changed

    resolved = ok(api.post(url, json=merge, headers=crew.h("carol")))
    assert resolved["status"] == "resolved" and resolved["resolution"] == "merge"
    old = loop_services.store.get(alice(crew), "b-ci")
    new = loop_services.store.get(alice(crew), resolved["result_belief_id"])
    assert old.superseded_by == new.id and new.supersedes == "b-ci"
    assert old.content == "CI runs on Jenkins."  # history kept
    assert (new.canonical_name, new.owner_id, new.scope) == ("ci_runner", "alice", ["domain:code"])
    assert new.content == "CI runs on GitHub Actions."
    assert new.why_it_matters == "Pipelines are Jenkinsfiles."
    assert new.aliases == ["ci", "gha", "github actions"]
    assert new.change_log[-1].trigger == f"merged review {review_id} into belief b-ci"
    assert new.change_log[-1].previous_content == "CI runs on Jenkins."
    history = ok(api.get(f"/v1/beliefs/{new.id}/history", headers=crew.h("alice")))
    assert [b["content"] for b in history["chain"]] == ["CI runs on Jenkins.", "CI runs on GitHub Actions."]
    recalled = ok(api.post("/v1/recall", json={"query": "which github actions runner?"}, headers=crew.h("alice")))
    assert [b["id"] for b in recalled["tiers"]["relevant"]] == [new.id]

    loop_services.audit.refresh()  # events are appended without a refresh
    events = ok(api.get("/v1/admin/audit", params={"action": "belief.merge"}, headers=crew.h("carol")))["items"]
    assert [e["belief_ids"] for e in events] == [["b-ci", new.id]]
    assert events[0]["details"]["content_from"] == "proposed"
    assert events[0]["details"]["aliases_added"] == ["gha", "github actions"]
    assert events[0]["before"]["content"] == "CI runs on Jenkins."
    assert api.post(url, json=merge, headers=crew.h("carol")).status_code == 409  # resolved once


def test_explicit_supersede_inherits_aliases_and_old_name_as_counter_signal(
    merger: BeliefMerger, crew: Team, loop_services: Services, loop_settings: Settings
) -> None:
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "linting_eslint",
            id="b-lint",
            aliases=["eslint", "lint"],
            content="Uses ESLint.",
        ),
    )
    report = run(
        merger,
        alice(crew),
        belief_updates=[
            {
                "belief_id": "b-lint",
                "change": "superseded",
                "new_content": "Uses Biome.",
                "new_canonical_name": "linting_biome",
            }
        ],
    )
    assert outcomes(report) == ["superseded"]
    old = loop_services.store.get(alice(crew), "b-lint")
    new = loop_services.store.get(alice(crew), str(report.ops[0].belief_id))
    assert old.superseded_by == new.id
    assert (new.canonical_name, new.content, new.pinned, new.supersedes) == (
        "linting_biome",
        "Uses Biome.",
        False,
        "b-lint",
    )
    assert new.aliases == ["eslint", "lint", "linting eslint"]
    assert new.change_log[0].previous_content == "Uses ESLint."
    # a query in the old vocabulary now reaches the active belief, never the superseded one
    recall = ContextBuilder(loop_services.store, loop_settings.recall).build(
        alice(crew), ["domain:code"], "should I configure eslint?"
    )
    assert recall.injected_ids == [new.id]
    # a second supersede of the retired belief is refused
    assert outcomes(run(merger, alice(crew), belief_updates=[{"belief_id": "b-lint", "change": "superseded"}])) == [
        "skipped"
    ]


def test_user_edited_beliefs_are_never_superseded_by_extraction(
    merger: BeliefMerger, crew: Team, loop_services: Services
) -> None:
    put_all(
        loop_services.store,
        make_belief(crew.tenant, "alice", "tone", id="b-tone", user_edited=True, content="Be terse."),
    )
    report = run(
        merger,
        alice(crew),
        belief_updates=[{"belief_id": "b-tone", "change": "superseded", "new_content": "Be chatty."}],
    )
    assert outcomes(report) == ["conflict_queued"]
    assert loop_services.store.get(alice(crew), "b-tone").is_live


def test_a_colleagues_pin_keeps_a_shared_belief_from_silent_supersede_by_extraction(
    merger: BeliefMerger, crew: Team, loop_services: Services, api: TestClient
) -> None:
    """carol, the lead, pins alice's project pay decision: a deliberate curation. A pin made the
    belief user-edited, so a later turn's supersede became a review item; since only the owner's pin
    is a user edit, bob's turn replaced the pinned decision silently."""
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "ledger_db",
            id="b-ledger",
            type="decision",
            content="Ledger on Postgres.",
            scope=["project:pay"],
        ),
    )
    ok(api.post("/v1/beliefs/b-ledger/pin", headers=crew.h("carol")))
    bob = Principal(tenant_id=crew.tenant, user_id="bob", projects=frozenset({"pay"}))
    update = {"belief_id": "b-ledger", "change": "superseded", "new_content": "Ledger on DynamoDB."}
    report = run(merger, bob, belief_updates=[update])
    assert outcomes(report) == ["conflict_queued"]
    kept = loop_services.store.get(bob, "b-ledger")
    assert kept.is_live and kept.content == "Ledger on Postgres." and kept.pinned
    assert not kept.user_edited  # a colleague's pin is still not the owner's edit
    item = merger.reviews.get(bob, str(report.ops[0].detail))
    assert item.belief_id == "b-ledger" and "pinned" in item.reason


def test_entity_update_respects_the_alias_cap(merger: BeliefMerger, crew: Team, loop_services: Services) -> None:
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant, "alice", "kubernetes", id="b-k8s", type="entity", aliases=[f"alias {i}" for i in range(24)]
        ),
    )
    report = run(
        merger,
        alice(crew),
        entity_updates=[{"canonical_name": "kubernetes", "new_aliases": ["k8s", "kube", "alias 3", "eks"]}],
    )
    assert outcomes(report) == ["aliases_added"]
    assert "alias cap reached" in (report.ops[0].detail or "")
    belief = loop_services.store.get(alice(crew), "b-k8s")
    assert len(belief.aliases) == 25
    assert belief.aliases[-1] == "k8s"
    assert "alias cap 25 reached" in (belief.change_log[-1].note or "")
    assert outcomes(run(merger, alice(crew), entity_updates=[{"canonical_name": "nope", "new_aliases": ["x"]}])) == [
        "not_found"
    ]


def test_open_questions_created_and_resolved(
    merger: BeliefMerger, crew: Team, loop_services: Services, loop_settings: Settings
) -> None:
    report = run(
        merger,
        alice(crew),
        new_open_questions=[
            {"canonical_name": "auth_tokens", "content": "JWT or opaque tokens?", "scope": ["domain:code"]}
        ],
    )
    qid = str(report.ops[0].belief_id)
    question = loop_services.store.get(alice(crew), qid)
    assert (question.type.value, question.confidence, question.pinned, question.aliases) == (
        "open_question",
        0.7,
        True,
        [],
    )
    builder = ContextBuilder(loop_services.store, loop_settings.recall)
    assert builder.build(alice(crew), ["domain:code"], "anything").question_ids == [qid]
    report = run(
        merger, alice(crew), new_beliefs=[new_belief("auth_token_choice", "Opaque tokens.", resolves_open_question=qid)]
    )
    assert outcomes(report) == ["inserted"]
    assert loop_services.store.get(alice(crew), qid).resolved_at is not None
    assert builder.build(alice(crew), ["domain:code"], "anything").question_ids == []


def test_inferred_promotion_needs_count_and_age(merger: BeliefMerger, crew: Team, loop_services: Services) -> None:
    old = utcnow() - timedelta(days=3)
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant,
            "alice",
            "prefers_tables",
            id="b-old",
            epistemic_status="inferred",
            reinforcement_count=4,
            content="Prefers tables.",
            created_at=old,
        ),
        make_belief(
            crew.tenant,
            "alice",
            "prefers_lists",
            id="b-young",
            epistemic_status="inferred",
            reinforcement_count=9,
            content="Prefers lists.",
        ),
    )
    run(
        merger,
        alice(crew),
        belief_updates=[
            {"belief_id": "b-old", "change": "reinforced"},
            {"belief_id": "b-young", "change": "reinforced"},
        ],
    )
    promoted = loop_services.store.get(alice(crew), "b-old")
    assert promoted.epistemic_status is EpistemicStatus.ACTIVE
    assert promoted.change_log[-1].trigger == "promoted: inferred -> active"
    assert loop_services.store.get(alice(crew), "b-young").epistemic_status is EpistemicStatus.INFERRED


def test_every_change_is_audited(merger: BeliefMerger, crew: Team, loop_services: Services) -> None:
    report = run(merger, alice(crew), new_beliefs=[new_belief("audited_fact", "Audited.")])
    belief_id = str(report.ops[0].belief_id)
    run(merger, alice(crew), belief_updates=[{"belief_id": belief_id, "change": "reinforced"}])
    loop_services.opensearch.indices.refresh(index=loop_services.audit.alias)
    admin = Principal(tenant_id=crew.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    events, _ = loop_services.audit.search(admin, AuditQuery(belief_id=belief_id), size=20, after=None)
    assert {e.action for e in events} >= {"belief.create", "belief.reinforce"}


def test_shared_scope_needs_a_grant(merger: BeliefMerger, crew: Team, loop_services: Services) -> None:
    report = run(
        merger,
        alice(crew),
        new_beliefs=[
            new_belief("pay_ledger", "Ledger in Postgres.", scope=["project:pay"]),
            new_belief("secret_plan", "Other project.", scope=["project:other"]),
        ],
    )
    assert outcomes(report) == ["inserted", "inserted"]
    ledger = loop_services.store.get(alice(crew), str(report.ops[0].belief_id))
    other = loop_services.store.get(alice(crew), str(report.ops[1].belief_id))
    assert ledger.scope == ["project:pay"]
    assert other.scope == ["domain:code"]  # no grant for project:other: falls back to the session scope
    assert isinstance(ledger, Belief)


def test_rerunning_the_turn_that_inserted_changes_nothing(
    merger: BeliefMerger, crew: Team, loop_services: Services
) -> None:
    """A crash after the writes and before the turn is marked done re-runs the same turn: it must
    not reinforce the belief or the open question it created itself (tests/durability crashes a
    real worker at that point)."""
    payload = {
        "turn_signal": "substantive",
        "new_beliefs": [new_belief("rerun_fact", "Inserted once.")],
        "new_open_questions": [
            {"canonical_name": "rerun_question", "content": "Asked once?", "scope": ["domain:code"]}
        ],
    }
    validated = validate_sidecar(json.dumps(payload), ParseStatus.PARSED)
    ctx = MergeContext(alice(crew), "sess", f"turn-{uuid.uuid4().hex[:8]}", "gpt-4o", ["domain:code"])
    first = merger.apply(ctx, validated)
    again = merger.apply(ctx, validated)
    assert outcomes(first) == outcomes(again) == ["inserted", "inserted"]
    assert [op.belief_id for op in again.ops] == [op.belief_id for op in first.ops]
    for op in again.ops:
        stored = loop_services.store.get(alice(crew), str(op.belief_id))
        assert stored.reinforcement_count == 0
        assert len(stored.change_log) == 1


def test_one_turn_stating_two_contents_under_one_name_files_the_second_as_a_conflict(
    merger: BeliefMerger, crew: Team, loop_services: Services, api: TestClient
) -> None:
    """The second item finds the belief the first just inserted (its id derives from the turn and
    the name). Taken for a re-run of that insert, it was reported ``inserted`` and its statement
    dropped; a different statement under the same name is a conflict, as from any other turn."""
    report = run(
        merger,
        alice(crew),
        new_beliefs=[
            new_belief("queue_broker", "Jobs go through RabbitMQ."),
            new_belief("queue_broker", "Jobs go through SQS."),
            new_belief("queue_broker", "jobs go through rabbitmq"),
        ],
    )
    assert outcomes(report) == ["inserted", "conflict_queued", "inserted"]
    [first, second, third] = report.ops
    assert second.belief_id == first.belief_id == third.belief_id
    stored = loop_services.store.get(alice(crew), str(first.belief_id))
    assert (stored.content, stored.reinforcement_count) == ("Jobs go through RabbitMQ.", 0)
    [review] = ok(api.get("/v1/reviews", headers=crew.h("alice")))
    assert (review["belief_id"], review["proposed"]["content"]) == (first.belief_id, "Jobs go through SQS.")


def test_an_alias_approved_after_its_belief_was_superseded_is_not_lost_on_the_old_version(
    crew: Team, other_crew: Team, loop_services: Services, api: TestClient
) -> None:
    """An alias candidate waits for an admin; meanwhile its belief is superseded. Approving it used
    to add the alias to the superseded version, which recall never returns, and report the item
    resolved: the approved words never found the belief. Like the other resolutions of a belief
    no longer live, it is refused (409) and the item stays open; the current version is untouched
    and still found by its own names."""
    for team in (crew, other_crew):
        put_all(
            loop_services.store,
            make_belief(team.tenant, "alice", "redis_cache", id="b-redis", type="entity", aliases=["redis"]),
        )
    ctx = MergeContext(alice(crew), "s-1", f"t-{uuid.uuid4().hex[:6]}", None, ["domain:code"])
    flywheel = loop_services.reviews.flywheel
    [queued] = flywheel.process(ctx, "the hot keys pile up", [AliasCandidate("hot keys", ["redis_cache"], "low")])
    assert queued.outcome == "queued" and queued.review_id
    superseded = {"id": "b-redis-2", "content": "Valkey is the cache."}
    ok(api.post("/v1/beliefs/b-redis/supersede", json=superseded, headers=crew.h("alice")), 201)
    resolve = {"action": "apply_alias"}
    refused = api.post(f"/v1/admin/reviews/{queued.review_id}/resolve", json=resolve, headers=crew.h("carol"))
    assert refused.status_code == 409, refused.text
    assert "hot keys" not in ok(api.get("/v1/beliefs/b-redis", headers=crew.h("alice")))["aliases"]
    [still_open] = ok(api.get("/v1/admin/reviews", params={"kind": "alias_candidate"}, headers=crew.h("carol")))
    assert still_open["status"] == "open"
    recall = {"scopes": ["domain:code"], "query": "how does redis behave?"}
    assert ok(api.post("/v1/recall", json=recall, headers=crew.h("alice")))["injected_ids"] == ["b-redis-2"]
    assert ok(api.post("/v1/recall", json=recall, headers=other_crew.h("alice")))["injected_ids"] == ["b-redis"]
