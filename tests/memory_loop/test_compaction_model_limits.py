"""The compaction model's answer is bounded in the worker, as the proxy's are in the API: a whole
answer past ``TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES`` (with its length announced, sent chunked without
end, or compressed: a decompression bomb, bounded by what it decodes to) or still arriving at
``TENURE_LOOP_COMPACTION_LLM_TIMEOUT_S`` (a provider trickling it, which no per-read timeout
stops) is a model failure: the bucket is left as it was, whatever merge plan the answer held, the
run says why (its report and ``compaction.run`` event), the connection is closed. Each case goes
through a real Celery worker (its own queues, this module's bounds) and the real store."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from loadtest.scripted_llm import Reply, ScriptedLLM
from service.api.state import Services
from service.config import CelerySettings, MemoryLoopSettings, Settings
from service.domain.audit import AuditAction
from service.domain.principal import Principal, Role
from service.extraction.compaction import llm_from_settings
from service.extraction.queue import TaskQueue
from service.storage.audit import AuditQuery
from tests.api.conftest import Team
from tests.factories import make_belief, put_all
from tests.memory_loop.conftest import WorkerProcess, wait_until

MiB = 1024 * 1024
CAP = MiB  # this worker's TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES
DEADLINE_S = 3.0  # this worker's TENURE_LOOP_COMPACTION_LLM_TIMEOUT_S
PAUSE_S = 0.002  # between the pieces of an endless answer (a model's pace)
SOURCES = ("b-r1", "b-r2", "b-pg")


@pytest.fixture(scope="module")
def model_queue(
    loop_settings: Settings, llm: ScriptedLLM, api: TestClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TaskQueue]:
    """A worker with a compaction model (the scripted one) and small bounds, on queues of its own
    (the session's worker compacts without a model); the queue that reaches it."""
    settings = loop_settings.model_copy(
        update={"celery": CelerySettings(queue_prefix=f"{loop_settings.celery.queue_prefix}-cmodel")}
    )
    env = {
        "TENURE_LOOP_COMPACTION_LLM_MODEL": "gpt-4o-mini",
        "TENURE_LOOP_COMPACTION_LLM_BASE_URL": llm.base_url,
        "TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES": str(CAP),
        "TENURE_LOOP_COMPACTION_LLM_TIMEOUT_S": str(DEADLINE_S),
    }
    worker = WorkerProcess(settings, Path(tmp_path_factory.mktemp("cmodel")) / "worker.log", env)
    try:
        worker.wait_ready()
        yield TaskQueue(settings)
    finally:
        worker.stop()


def bucket(services: Services, team: Team) -> None:
    """Two entities the plan below merges, and one it leaves."""
    put_all(
        services.store,
        make_belief(team.tenant, "alice", "redis_cache", id="b-r1", type="entity", content="Redis is the cache."),
        make_belief(team.tenant, "alice", "redis", id="b-r2", type="entity", content="We cache with Redis."),
        make_belief(team.tenant, "alice", "postgres", id="b-pg", type="entity", content="Postgres is the DB."),
    )


def plan() -> str:
    """A model's answer merging b-r1 and b-r2: applied whenever it is read."""
    merge = {
        "keep_id": "b-r1",
        "retire_ids": ["b-r2"],
        "merged_content": "Redis is the cache.",
        "merged_canonical_name": "redis_cache",
        "merged_aliases": ["redis"],
        "compaction_note": "same cache",
    }
    return json.dumps({"merges": [merge], "no_action_ids": ["b-pg"]})


def compact(queue: TaskQueue, services: Services, team: Team, timeout: float) -> dict[str, Any]:
    """Compact alice's entity bucket in the worker; the run's ``compaction.run`` details."""
    queue.compact_bucket(team.tenant, "alice", "domain:code", "entity", None, True)
    admin = Principal(tenant_id=team.tenant, user_id="carol", roles=frozenset({Role.ADMIN}))
    query = AuditQuery(action=AuditAction.COMPACTION_RUN.value)

    def run() -> dict[str, Any] | None:
        services.audit.refresh()  # the audit index refreshes every 30 s
        events, _ = services.audit.search(admin, query, size=1, after=None)
        return events[0].details if events else None

    details: dict[str, Any] = wait_until(run, timeout=timeout, interval=0.2)
    return details


def untouched(services: Services, team: Team) -> bool:
    """Every source live and superseded by nothing: no merge happened, none half-way."""
    alice = Principal(tenant_id=team.tenant, user_id="alice")
    found = [services.store.get(alice, belief_id) for belief_id in SOURCES]
    return all(b.is_live and b.superseded_by is None for b in found)


def hung_up(llm: ScriptedLLM) -> int:
    """How much of its answer's endless part the model sent before the worker hung up."""
    (request,) = llm.requests
    sent: int = wait_until(lambda: request.get("_hung_up", -1) + 1, timeout=10) - 1
    return sent


@pytest.mark.parametrize(
    ("reply", "sends"),
    [
        # a valid plan followed by 2 MiB of spaces, its length announced: refused unread
        pytest.param(Reply(content=plan() + " " * (2 * MiB)), None, id="announced"),
        # a valid plan and 64 MiB of spaces, gzip: ~64 kB on the wire, httpx decoded it whole
        pytest.param(Reply(content=plan() + " " * (64 * MiB), content_encoding="gzip"), None, id="gzip-bomb"),
        pytest.param(
            Reply(endless=b"y" * 65_536, endless_max_bytes=48 * MiB, endless_pause_s=PAUSE_S), 48 * MiB, id="chunked"
        ),
        pytest.param(
            Reply(endless=b" " * MiB, endless_max_bytes=128 * MiB, endless_pause_s=PAUSE_S, content_encoding="deflate"),
            128 * MiB,
            id="deflate-bomb",
        ),
    ],
)
def test_a_model_answer_past_the_bound_leaves_the_bucket_as_it_was(
    model_queue: TaskQueue,
    crew: Team,
    loop_services: Services,
    llm: ScriptedLLM,
    reply: Reply,
    sends: int | None,
) -> None:
    """The worker read the model's answer whole, whatever its size (and httpx decoded a compressed
    one whole), so a misbehaving provider could fill its memory, and a plan at the start of an
    oversized answer was applied. Past the bound the answer is not read on: a model failure."""
    bucket(loop_services, crew)
    llm.script(reply)
    details = compact(model_queue, loop_services, crew, timeout=60)
    assert details["merges"] == []
    [note] = details["rejected"]
    assert note.startswith("model unavailable: its answer exceeds") and note.endswith("; nothing merged")
    assert "TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES" in note
    assert untouched(loop_services, crew)
    assert llm.requests[0]["_headers"]["accept-encoding"] == "identity"
    if sends is not None:  # the connection closed long before the model stopped sending
        assert hung_up(llm) < sends // 4


def test_a_model_trickling_its_answer_is_cut_off_at_the_deadline(
    model_queue: TaskQueue, crew: Team, loop_services: Services, llm: ScriptedLLM
) -> None:
    """httpx's timeout applies to each read: a model sending a merge plan a byte every 50 ms
    (~35 s for this one) kept the bucket task waiting (up to its soft time limit), then applied the
    plan. The whole call now ends at the deadline, a model failure, the bucket untouched."""
    bucket(loop_services, crew)
    llm.script(Reply(content=plan(), trickle_s=0.05))
    started = time.monotonic()
    details = compact(model_queue, loop_services, crew, timeout=20)
    assert time.monotonic() - started < DEADLINE_S + 10
    assert details["merges"] == []
    assert details["rejected"] == [
        f"model unavailable: its answer took longer than {DEADLINE_S:g} s "
        "(TENURE_LOOP_COMPACTION_LLM_TIMEOUT_S); nothing merged"
    ]
    assert untouched(loop_services, crew)
    hung_up(llm)  # the model saw the connection closed


def test_the_call_deadline_leaves_the_bucket_task_time_before_its_soft_limit() -> None:
    """A read waiting at the deadline ends at its own timeout (as long): the deadline is at most a
    third of the bucket task's soft time limit, so the call ends before it, merges still to do."""
    loop = MemoryLoopSettings(upstream_base_url="http://127.0.0.1:9/v1", compaction_llm_model="m")
    settings = Settings(loop=loop, celery=CelerySettings(heavy_soft_time_limit_s=150, heavy_time_limit_s=160))
    llm = llm_from_settings(settings)
    assert llm is not None and llm.timeout_s == 50
    assert llm.max_body_bytes == loop.upstream_max_body_bytes
    roomy = settings.model_copy(update={"celery": CelerySettings()})  # 240 s: the setting's 80 s hold
    assert (made := llm_from_settings(roomy)) is not None and made.timeout_s == loop.compaction_llm_timeout_s


def test_a_compressed_model_answer_within_the_bounds_is_applied(
    model_queue: TaskQueue, crew: Team, loop_services: Services, llm: ScriptedLLM
) -> None:
    """A provider compressing its answer though asked not to: decoded (in bounded pieces) and used."""
    bucket(loop_services, crew)
    llm.script(Reply(content=plan() + " " * 100_000, content_encoding="gzip"))
    details = compact(model_queue, loop_services, crew, timeout=60)
    [merge] = details["merges"]
    assert merge["sources"] == ["b-r1", "b-r2"]
    assert details["rejected"] == []
    alice = Principal(tenant_id=crew.tenant, user_id="alice")
    assert loop_services.store.get(alice, "b-r2").superseded_by == merge["new_id"]
    assert loop_services.store.get(alice, "b-pg").is_live


@pytest.mark.parametrize(
    "content",
    [
        # its braces never close: the search for the object in the text tried every one of them
        # to the text's end (quadratic: ~15 minutes for these 500 kB, within the bound)
        pytest.param("{" * 500_000, id="unclosed-braces"),
        # nested past the JSON parser's recursion limit: a RecursionError, not a ValueError
        pytest.param('{"merges": ' + "[" * 100_000 + "]" * 100_000 + "}", id="deep-nesting"),
    ],
)
def test_a_model_answer_within_the_bound_that_holds_no_usable_object_merges_nothing(
    model_queue: TaskQueue, crew: Team, loop_services: Services, llm: ScriptedLLM, content: str
) -> None:
    """An answer within the bound whose text is no usable object: the run either held the bucket
    task up to its soft time limit or failed it with an exception (no run recorded, the bucket
    planned again and again); it is now a useless answer, at once: nothing merged."""
    bucket(loop_services, crew)
    llm.script(Reply(content=content))
    details = compact(model_queue, loop_services, crew, timeout=20)
    assert details["merges"] == []
    assert details["rejected"] == ["model answer unusable; nothing merged"]
    assert untouched(loop_services, crew)
