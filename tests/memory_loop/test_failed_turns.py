"""Failed turns for admins: ``GET /v1/admin/turns`` lists the tenant's turns by extraction status,
``POST /v1/admin/turns/{id}/retry`` (and ``/v1/admin/turns/retry`` for a batch) sends a failed one
back for extraction. Real OpenSearch, Redis and Celery worker; two tenants, each with a member and
an admin: members get 403, another tenant's admin never sees a turn nor learns it exists."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from fastapi.testclient import TestClient

from service.api.state import Services
from service.auth.actor import Actor
from service.config import Settings
from service.domain.principal import Principal, Role
from service.errors import Conflict, ErrorCode
from service.extraction.failed_turns import FailedTurns
from service.storage.turns import TurnRecord, TurnStore
from tests.api.conftest import Team, ok
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn
from tests.memory_loop.test_extraction_worker import beliefs_named
from workers import resources
from workers.tasks import extraction

FAILED = "gave up after 3 attempts, none finished; the last one: interrupted: SoftTimeLimitExceeded: slow"


@pytest.fixture
def res(loop_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[resources.Resources]:
    """The worker's resources on the test's namespace, for tasks run in this process (the sweep
    treats a pending turn untouched for a second as stale)."""
    settings = loop_settings.model_copy(
        update={"loop": loop_settings.loop.model_copy(update={"sweep_stale_after_s": 1})}
    )
    built = resources.build(settings)
    monkeypatch.setattr(extraction, "_res", lambda: built)
    try:
        yield built
    finally:
        built.close()


def stored_turn(services: Services, team: Team, owner: str, *names: str, **fields: Any) -> str:
    """A turn of ``owner`` stored as ``POST /v1/turns`` stores one, without enqueueing it (one new
    belief per name in its sidecar); ``fields`` set its extraction state."""
    raw = sidecar(new_beliefs=[new_belief(n, f"{n} holds.") for n in names]).split(">>>", 1)[1].rsplit("<<<", 1)[0]
    turn_id = f"turn-{uuid.uuid4().hex[:10]}"
    services.loop.turns.create(
        TurnRecord(
            tenant_id=team.tenant,
            turn_id=turn_id,
            owner_id=owner,
            projects=["pay"],
            session_id="s-failed",
            scope=["domain:code"],
            source="client",
            model="gpt-4o",
            user_message="what do we use?",
            assistant_text="We use it.",
            sidecar_raw=raw,
            parse_status="parsed",
            gate="verified",
            **fields,
        )
    )
    return turn_id


def failed_turn(services: Services, team: Team, owner: str, *names: str, error: str = FAILED) -> str:
    """A turn the sweep failed (its attempts spent)."""
    return stored_turn(services, team, owner, *names, extraction_status="failed", attempts=3, error=error)


def refresh_turns(services: Services) -> None:
    services.opensearch.indices.refresh(index=services.loop.turns.alias)


def listed(api: TestClient, headers: dict[str, str], **params: Any) -> list[str]:
    return [t["turn_id"] for t in ok(api.get("/v1/admin/turns", params=params, headers=headers))["items"]]


def retry_events(api: TestClient, services: Services, team: Team, turn_id: str) -> list[dict[str, Any]]:
    services.audit.refresh()  # events are appended without a refresh
    events = ok(api.get("/v1/admin/audit", params={"action": "turn.retry"}, headers=team.h("carol")))["items"]
    return [e for e in events if (e.get("details") or {}).get("turn_id") == turn_id]


def test_a_turn_failed_by_the_sweep_is_listed_retried_and_extracted_by_the_worker(
    api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    res: resources.Resources,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outage of the brief: every attempt is cut short (the heavy soft time limit of a slow
    store), the sweep fails the turn once its attempts are spent, and nothing would ever extract
    it again. Once the store is well, an admin retries it and the real worker extracts it."""
    name = f"retried_fact_{uuid.uuid4().hex[:6]}"
    turn_id = stored_turn(loop_services, crew, "alice", name)
    store: TurnStore = res.turns

    def slow_store(*_: Any) -> Any:
        raise SoftTimeLimitExceeded("slow store")

    with monkeypatch.context() as outage:
        outage.setattr(res.pipeline.merger, "apply", slow_store)
        # the real task body, here, while the store is slow: each attempt is cut short and counted
        for _ in range(res.settings.loop.max_extraction_attempts):
            assert extraction.extract_turn.apply(args=[crew.tenant, turn_id]).failed()
        time.sleep(1.2)  # stale for the sweep
        refresh_turns(loop_services)
        extraction.sweep_turns.apply().get()
    failed, _, _ = store.load(crew.tenant, turn_id)
    assert failed.extraction_status == "failed", failed
    assert failed.error is not None and failed.error.startswith("gave up after 3 attempts, none finished")
    refresh_turns(loop_services)

    # the tenant's admin finds it; the listing carries no message text
    page = ok(api.get("/v1/admin/turns", headers=crew.h("carol")))
    [row] = [t for t in page["items"] if t["turn_id"] == turn_id]
    assert (row["owner_id"], row["extraction_status"], row["attempts"]) == ("alice", "failed", 3)
    assert row["error"] == failed.error
    assert "user_message" not in row and "assistant_text" not in row and "sidecar_raw" not in row
    whole = ok(api.get(f"/v1/admin/turns/{turn_id}", headers=crew.h("carol")))
    assert (whole["user_message"], whole["assistant_text"]) == ("what do we use?", "We use it.")
    assert name in (whole["sidecar_raw"] or "")
    # a member may not list or retry; another tenant's admin never sees it
    assert api.get("/v1/admin/turns", headers=crew.h("alice")).status_code == 403
    assert api.post(f"/v1/admin/turns/{turn_id}/retry", headers=crew.h("alice")).status_code == 403
    assert turn_id not in listed(api, other_crew.h("carol"))
    for response in (
        api.get(f"/v1/admin/turns/{turn_id}", headers=other_crew.h("carol")),
        api.post(f"/v1/admin/turns/{turn_id}/retry", headers=other_crew.h("carol")),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "not_found"
    assert store.load(crew.tenant, turn_id)[0].extraction_status == "failed"  # untouched by them
    assert beliefs_named(api, crew.h("alice"), name) == []

    # the store is well again: the retry sends it to the real worker, which extracts it
    retried = ok(api.post(f"/v1/admin/turns/{turn_id}/retry", headers=crew.h("carol")))
    assert (retried["extraction_status"], retried["attempts"], retried["queued"]) == ("pending", 0, True)
    assert (retried["previous_error"], retried["previous_attempts"]) == (failed.error, 3)
    assert retried["error"].startswith("retry requested by carol at ")
    assert retried["error"].endswith(f"it had failed: {failed.error}")
    done = wait_turn(api, crew.h("alice"), turn_id)
    assert done["extraction_status"] == "done", done
    [belief] = beliefs_named(api, crew.h("alice"), name)
    assert belief["content"] == f"{name} holds."
    after, _, _ = store.load(crew.tenant, turn_id)
    assert (after.attempts, after.error) == (1, None)

    [event] = retry_events(api, loop_services, crew, turn_id)
    assert (event["actor_id"], event["tenant_id"]) == ("carol", crew.tenant)
    assert event["details"]["previous_error"] == failed.error
    assert event["details"]["previous_attempts"] == 3
    assert event["details"]["owner_id"] == "alice"
    assert retry_events(api, loop_services, other_crew, turn_id) == []


def test_listing_pages_newest_first_and_filters(api: TestClient, crew: Team, loop_services: Services) -> None:
    oldest = failed_turn(loop_services, crew, "alice", "page_a")
    middle = failed_turn(loop_services, crew, "bob", "page_b")
    newest = failed_turn(loop_services, crew, "alice", "page_c")
    done = stored_turn(loop_services, crew, "alice", "page_d", extraction_status="done", attempts=1)
    refresh_turns(loop_services)
    carol = crew.h("carol")
    first = ok(api.get("/v1/admin/turns", params={"limit": 2}, headers=carol))
    assert [t["turn_id"] for t in first["items"]] == [newest, middle]
    assert first["next_cursor"]
    second = ok(api.get("/v1/admin/turns", params={"limit": 2, "cursor": first["next_cursor"]}, headers=carol))
    assert [t["turn_id"] for t in second["items"]] == [oldest]
    assert second["next_cursor"] is None
    assert listed(api, carol, owner_id="bob") == [middle]
    assert listed(api, carol, owner_id="alice") == [newest, oldest]
    assert listed(api, carol, status="done") == [done]
    assert listed(api, carol, status="pending") == []


@pytest.mark.parametrize(
    "params",
    [
        {"status": "broken"},
        {"status": ""},
        {"limit": 0},
        {"limit": 501},
        {"limit": "many"},
        {"owner_id": "Not A Slug!"},
        {"cursor": "not-a-cursor"},
        {"cursor": "W10"},  # a valid base64 JSON list, of the wrong arity
    ],
)
def test_bad_listing_parameters_are_422(api: TestClient, crew: Team, params: dict[str, Any]) -> None:
    response = api.get("/v1/admin/turns", params=params, headers=crew.h("carol"))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"


def test_bad_retry_requests_are_422(api: TestClient, crew: Team) -> None:
    for path, body in [
        ("/v1/admin/turns/bad%20id/retry", None),
        ("/v1/admin/turns/retry", {"limit": 0}),
        ("/v1/admin/turns/retry", {"limit": 201}),
        ("/v1/admin/turns/retry", {"owner_id": "Not A Slug!"}),
        ("/v1/admin/turns/retry", {"status": "done"}),  # unknown field
    ]:
        response = api.post(path, json=body, headers=crew.h("carol"))
        assert response.status_code == 422, (path, body, response.text)
        assert response.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize("status", ["pending", "running", "done", "skipped"])
def test_only_a_failed_turn_is_retried(api: TestClient, crew: Team, loop_services: Services, status: str) -> None:
    turn_id = stored_turn(loop_services, crew, "alice", "not_failed", extraction_status=status)
    response = api.post(f"/v1/admin/turns/{turn_id}/retry", headers=crew.h("carol"))
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert (error["code"], error["details"]) == ("turn_not_failed", {"extraction_status": status})
    turn, _, _ = loop_services.loop.turns.load(crew.tenant, turn_id)
    assert turn.extraction_status == status
    assert retry_events(api, loop_services, crew, turn_id) == []


def test_a_missing_turn_is_404(api: TestClient, crew: Team) -> None:
    for response in (
        api.get("/v1/admin/turns/turn-nope", headers=crew.h("carol")),
        api.post("/v1/admin/turns/turn-nope/retry", headers=crew.h("carol")),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["message"] == "turn 'turn-nope' not found"  # not a missing route


def test_two_concurrent_retries_retry_once(
    api: TestClient, crew: Team, loop_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both retries read the failed turn before either writes it back: the second write is refused
    by the turn's seq_no, re-read, and answered 409; one enqueue, one audit event."""
    turn_id = failed_turn(loop_services, crew, "alice", "raced")
    service = FailedTurns(loop_services.loop.turns, loop_services.loop.queue, loop_services.beliefs.lifecycle)
    both_read = threading.Barrier(2, timeout=10)
    store = loop_services.loop.turns
    load = store.load
    first_reads: set[int] = set()

    def load_together(tenant_id: str, wanted: str) -> tuple[TurnRecord, int, int]:
        loaded = load(tenant_id, wanted)
        me = threading.get_ident()
        if me not in first_reads:  # each retry's first read waits for the other's
            first_reads.add(me)
            both_read.wait()
        return loaded

    monkeypatch.setattr(store, "load", load_together)
    admin = Actor(
        principal=Principal(tenant_id=crew.tenant, user_id="carol", roles=frozenset({Role.ADMIN})), kind="api_key"
    )
    outcomes: list[object] = []

    def retry() -> None:
        try:
            outcomes.append(service.retry(admin, turn_id))
        except Conflict as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=retry) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    monkeypatch.undo()
    refused = [o for o in outcomes if isinstance(o, Conflict)]
    assert len(outcomes) == 2 and len(refused) == 1, outcomes
    assert refused[0].code is ErrorCode.TURN_NOT_FAILED
    assert len(retry_events(api, loop_services, crew, turn_id)) == 1
    # and once more, one after the other: the turn is no longer failed
    again = api.post(f"/v1/admin/turns/{turn_id}/retry", headers=crew.h("carol"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "turn_not_failed"


def test_a_disabled_authors_retried_turn_stays_unextracted(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services, operator_headers: dict[str, str]
) -> None:
    name = f"disabled_fact_{uuid.uuid4().hex[:6]}"
    turn_id = failed_turn(loop_services, crew, "bob", name)
    ok(api.post(f"/v1/admin/tenants/{crew.tenant}/users/bob/disable", headers=crew.h("carol")))
    ok(api.post(f"/v1/admin/turns/{turn_id}/retry", headers=crew.h("carol")))
    turn = wait_turn(api, crew.h("carol"), turn_id)
    assert turn["extraction_status"] == "skipped"
    assert turn["result"] == {"reason": "the turn's author or tenant is disabled, or the author's account is gone"}
    assert beliefs_named(api, crew.h("carol"), name) == []


def test_bulk_retry_sends_the_newest_failed_turns_up_to_its_limit(
    api: TestClient, crew: Team, other_crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    names = [f"bulk_{i}_{uuid.uuid4().hex[:6]}" for i in range(2)]
    older, newer = (failed_turn(loop_services, crew, "alice", n) for n in names)
    theirs = failed_turn(loop_services, other_crew, "alice", "theirs")
    mine_done = stored_turn(loop_services, crew, "alice", "bulk_done", extraction_status="done")
    refresh_turns(loop_services)
    carol = crew.h("carol")
    assert api.post("/v1/admin/turns/retry", json={}, headers=crew.h("bob")).status_code == 403
    first = ok(api.post("/v1/admin/turns/retry", json={"limit": 1}, headers=carol))
    assert [t["turn_id"] for t in first["retried"]] == [newer]
    assert first["more"] is True and first["not_retried"] == {}
    refresh_turns(loop_services)
    second = ok(api.post("/v1/admin/turns/retry", headers=carol))
    assert [t["turn_id"] for t in second["retried"]] == [older]
    assert second["more"] is False
    for turn_id, name in ((older, names[0]), (newer, names[1])):
        assert wait_turn(api, carol, turn_id)["extraction_status"] == "done"
        assert len(beliefs_named(api, crew.h("alice"), name)) == 1
        assert len(retry_events(api, loop_services, crew, turn_id)) == 1
    assert loop_services.loop.turns.load(other_crew.tenant, theirs)[0].extraction_status == "failed"
    assert loop_services.loop.turns.load(crew.tenant, mine_done)[0].extraction_status == "done"
    refresh_turns(loop_services)
    assert ok(api.post("/v1/admin/turns/retry", headers=carol)) == {"retried": [], "not_retried": {}, "more": False}
    assert listed(api, other_crew.h("carol")) == [theirs]


def test_the_sdk_and_the_cli_list_and_retry(
    api: TestClient, crew: Team, other_crew: Team, loop_services: Services
) -> None:
    import io
    import json

    from tenure_client import Conflict as SdkConflict
    from tenure_client import NotFound as SdkNotFound
    from tenure_client import PermissionDenied, Tenure, models

    from service.cli import main

    first, second, third = (failed_turn(loop_services, crew, "bob", f"sdk_{i}") for i in range(3))
    refresh_turns(loop_services)
    admin = Tenure("http://testserver", crew.keys["carol"], http_client=api)
    page = admin.admin.turns(owner_id="bob", limit=2)
    assert isinstance(page, models.AdminTurnPage)
    assert [t.turn_id for t in page.items] == [third, second] and page.next_cursor
    assert [t.turn_id for t in admin.admin.iter_turns(owner_id="bob", page_size=1)] == [third, second, first]
    assert admin.admin.turns(status="done", owner_id="bob").items == []
    assert admin.admin.get_turn(first).user_message == "what do we use?"
    retried = admin.admin.retry_turn(first)
    assert (retried.extraction_status, retried.previous_error, retried.queued) == ("pending", FAILED, True)
    with pytest.raises(SdkConflict) as refused:
        admin.admin.retry_turn(first)
    assert refused.value.code == "turn_not_failed"
    # pending, or already taken by the worker (when one runs in this session)
    assert refused.value.details["extraction_status"] in ("pending", "running", "done")
    with pytest.raises(PermissionDenied):
        Tenure("http://testserver", crew.keys["bob"], http_client=api).admin.turns()
    with pytest.raises(SdkNotFound):
        Tenure("http://testserver", other_crew.keys["carol"], http_client=api).admin.retry_turn(second)

    def cli(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["--key", crew.keys["carol"], *argv], client=api, out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    refresh_turns(loop_services)
    code, out, err = cli("turns", "--owner", "bob")
    assert code == 0, err
    assert [t["turn_id"] for t in json.loads(out)["items"]] == [third, second]  # first is pending now
    code, out, err = cli("retry-turn", second)
    assert code == 0, err
    assert [(t["turn_id"], t["extraction_status"]) for t in json.loads(out)["items"]] == [(second, "pending")]
    refresh_turns(loop_services)
    code, out, err = cli("retry-turn", "--failed", "--owner", "bob", "--limit", "5")
    assert code == 0, err
    assert [t["turn_id"] for t in json.loads(out)["retried"]] == [third]
    code, out, err = cli("retry-turn", second)
    assert code == 1 and "turn_not_failed" in err
    code, _, err = cli("retry-turn")
    assert code == 1 and "name turn ids, or pass --failed" in err
