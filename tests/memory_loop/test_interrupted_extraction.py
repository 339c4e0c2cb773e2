"""An extraction attempt cut short by something other than its sidecar (the heavy soft time limit,
an OpenSearch failure that is no answer about the data) must not fail the turn: the merge is
idempotent per turn, so the turn goes back to the sweep and a later attempt extracts every belief.
A turn whose attempts are all spent is failed by the sweep, with the reason, instead of staying
unfinished for ever. The task runs in this process (eager) against the real OpenSearch and Redis;
only our own merge is made to raise."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from opensearchpy.exceptions import TransportError

from service.api.state import Services
from service.config import Settings
from service.errors import NotFound
from tests.api.conftest import Team
from tests.memory_loop.conftest import record_turn
from tests.memory_loop.test_extraction_worker import beliefs_named
from workers import resources
from workers.tasks import extraction


@pytest.fixture
def res(loop_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[resources.Resources]:
    """The worker's resources on the test's namespace, used by the tasks run here."""
    built = resources.build(loop_settings)
    monkeypatch.setattr(extraction, "_res", lambda: built)
    try:
        yield built
    finally:
        built.close()


def merge_raising(res: resources.Resources, monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    def cut_short(*_: Any) -> Any:
        raise exc

    monkeypatch.setattr(res.pipeline.merger, "apply", cut_short)


@pytest.mark.parametrize(
    "interruption",
    [SoftTimeLimitExceeded("heavy soft time limit"), TransportError(500, "internal_server_error", {})],
    ids=["soft-time-limit", "opensearch-500"],
)
def test_an_interrupted_extraction_goes_back_to_the_sweep(
    api: Any,
    crew: Team,
    res: resources.Resources,
    monkeypatch: pytest.MonkeyPatch,
    interruption: Exception,
) -> None:
    name = f"interrupted_{uuid.uuid4().hex[:6]}"
    turn_id = record_turn(res.turns, crew, name)
    with monkeypatch.context() as patch:
        merge_raising(res, patch, interruption)
        assert extraction.extract_turn.apply(args=[crew.tenant, turn_id]).failed()
    turn, _, _ = res.turns.load(crew.tenant, turn_id)
    assert turn.extraction_status == "pending", f"an interruption failed the turn for good: {turn.error}"
    assert turn.attempts == 1  # counted: a turn that overruns every time must end
    assert type(interruption).__name__ in (turn.error or "")
    # the sweep's next delivery extracts it
    extraction.extract_turn.apply(args=[crew.tenant, turn_id])
    done, _, _ = res.turns.load(crew.tenant, turn_id)
    assert (done.extraction_status, done.error) == ("done", None)
    assert len(beliefs_named(api, crew.h("alice"), name)) == 1


def test_a_sidecar_error_still_fails_the_turn(
    crew: Team, res: resources.Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn_id = record_turn(res.turns, crew, "bad_input_fact")
    merge_raising(res, monkeypatch, ValueError("unusable sidecar item"))
    assert extraction.extract_turn.apply(args=[crew.tenant, turn_id]).failed()
    turn, _, _ = res.turns.load(crew.tenant, turn_id)
    assert turn.extraction_status == "failed"
    assert "unusable sidecar item" in (turn.error or "")


def test_the_sweep_fails_a_turn_whose_attempts_are_spent(
    crew: Team, res: resources.Resources, loop_services: Services
) -> None:
    spent = res.settings.loop.max_extraction_attempts
    old = res.settings.celery.heavy_time_limit_s + 5
    exhausted = record_turn(
        res.turns,
        crew,
        "never_extracted",
        age_s=old,
        extraction_status="pending",
        attempts=spent,
        error="interrupted: SoftTimeLimitExceeded: heavy soft time limit",
    )
    loop_services.opensearch.indices.refresh(index=res.turns.alias)
    extraction.sweep_turns.apply()
    turn, _, _ = res.turns.load(crew.tenant, exhausted)
    assert turn.extraction_status == "failed"
    assert f"gave up after {spent} attempts" in (turn.error or "")
    assert "SoftTimeLimitExceeded" in (turn.error or "")


def test_a_spent_turn_that_cannot_be_failed_does_not_stop_the_sweep(
    crew: Team, res: resources.Resources, loop_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One spent turn the sweep cannot mark (erased meanwhile, unreadable) is logged and passed
    over: the other spent turns are failed and the tick still re-enqueues the lost ones."""
    spent = res.settings.loop.max_extraction_attempts
    old = res.settings.celery.heavy_time_limit_s + 5
    first, second = (
        record_turn(res.turns, crew, name, age_s=old, extraction_status="pending", attempts=spent)
        for name in ("spent_first", "spent_second")
    )
    loop_services.opensearch.indices.refresh(index=res.turns.alias)
    give_up = res.pipeline.give_up

    def one_gone(tenant_id: str, turn_id: str) -> None:
        if turn_id == first:
            raise NotFound(f"turn {turn_id!r} not found")
        give_up(tenant_id, turn_id)

    monkeypatch.setattr(res.pipeline, "give_up", one_gone)
    extraction.sweep_turns.apply().get()  # raises if the task failed
    assert res.turns.load(crew.tenant, second)[0].extraction_status == "failed"


def test_the_sweep_leaves_a_running_turn_to_its_task_until_the_hard_time_limit(
    crew: Team, res: resources.Resources, loop_services: Services
) -> None:
    """A turn claimed longer ago than the stale threshold but not the heavy hard time limit may
    still be in a live task (its message unacked, the queue looks drained): sent again, a second
    task would run it alongside and spend its attempts."""
    stale = res.settings.loop.sweep_stale_after_s
    assert stale < res.settings.celery.heavy_time_limit_s
    running = record_turn(res.turns, crew, "still_running", age_s=stale + 1, extraction_status="running", attempts=1)
    lost = record_turn(
        res.turns,
        crew,
        "really_lost",
        age_s=res.settings.celery.heavy_time_limit_s + 1,
        extraction_status="running",
        attempts=1,
    )
    loop_services.opensearch.indices.refresh(index=res.turns.alias)
    keys = res.turns.stale_keys(
        older_than_s=stale,
        running_older_than_s=res.settings.celery.heavy_time_limit_s,
        max_attempts=res.settings.loop.max_extraction_attempts,
    )
    assert (crew.tenant, lost) in keys
    assert (crew.tenant, running) not in keys
