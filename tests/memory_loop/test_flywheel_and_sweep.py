"""The alias-enrichment flywheel through the worker (cheap queue), and the beat-driven sweep that
re-enqueues turns whose extraction never ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.config import Settings
from service.storage.turns import TurnStore
from tests.api.conftest import Team, ok
from tests.factories import make_belief, put_all
from tests.memory_loop.conftest import REPO, WorkerProcess, record_turn, sidecar, wait_turn, wait_until, worker_env
from tests.memory_loop.test_extraction_worker import post_turn


def _belief(api: TestClient, team: Team, belief_id: str) -> dict[str, Any]:
    return dict(ok(api.get(f"/v1/beliefs/{belief_id}", headers=team.h("alice"))))


def _reviews(api: TestClient, team: Team, **params: Any) -> list[dict[str, Any]]:
    return list(ok(api.get("/v1/admin/reviews", params={"kind": "alias_candidate", **params}, headers=team.h("carol"))))


def test_alias_candidates_follow_the_flywheel_rules(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services, loop_settings: Settings
) -> None:
    put_all(
        loop_services.store,
        make_belief(
            crew.tenant, "alice", "redis_cache", id="b-redis", type="entity", aliases=["redis"], content="Redis cache."
        ),
        make_belief(crew.tenant, "alice", "kubernetes", id="b-k8s", type="entity", aliases=["k8s"], content="EKS."),
    )
    said = "Our eviction sweeps are slow, the kv store stalls, hot keys pile up on the fast path."
    candidates = [
        {"surface": "eviction sweeps", "possible_entities": ["redis_cache"], "confidence": "high"},
        {"surface": "kv store", "possible_entities": ["redis_cache"], "confidence": "medium"},
        {"surface": "cache box", "possible_entities": ["redis_cache"], "confidence": "high"},
        {"surface": "fast path", "possible_entities": ["redis_cache", "kubernetes"], "confidence": "high"},
        {"surface": "hot keys", "possible_entities": ["redis_cache"], "confidence": "low"},
    ]
    first = post_turn(api, crew.h("alice"), "ok" + sidecar(possible_alias_candidates=candidates), user_message=said)
    wait_turn(api, crew.h("alice"), first["turn_id"])
    wait_until(lambda: "eviction sweeps" in _belief(api, crew, "b-redis")["aliases"])
    queued = wait_until(lambda: (r := _reviews(api, crew)) and len(r) == 3 and r)
    assert {r["surface"]: r["sightings"] for r in queued} == {"kv store": 1, "fast path": 1, "hot keys": 1}
    aliases = _belief(api, crew, "b-redis")["aliases"]
    assert "cache box" not in aliases  # never said by the user
    assert "kv store" not in aliases
    # the very next turn recalls the belief through the new alias
    recall = ok(
        api.post(
            "/v1/recall",
            json={"scopes": ["domain:code"], "query": "why are the eviction sweeps slow"},
            headers=crew.h("alice"),
        )
    )
    assert recall["injected_ids"] == ["b-redis"]
    # a second distinct turn with the medium candidate applies it (repeated sightings)
    second = post_turn(
        api,
        crew.h("alice"),
        "ok" + sidecar(possible_alias_candidates=candidates[1:2]),
        user_message="the kv store again",
    )
    wait_turn(api, crew.h("alice"), second["turn_id"])
    wait_until(lambda: "kv store" in _belief(api, crew, "b-redis")["aliases"])
    resolved = wait_until(lambda: _reviews(api, crew, status="resolved"))  # closed right after the alias
    assert [(r["surface"], r["resolution"], r["sightings"]) for r in resolved] == [("kv store", "auto_applied", 2)]
    # low confidence waits for an admin
    hot = next(r for r in _reviews(api, crew) if r["surface"] == "hot keys")
    ok(
        api.post(
            f"/v1/admin/reviews/{hot['review_id']}/resolve", json={"action": "apply_alias"}, headers=crew.h("carol")
        )
    )
    assert "hot keys" in _belief(api, crew, "b-redis")["aliases"]
    assert "fast path" not in _belief(api, crew, "b-k8s")["aliases"]


@pytest.fixture
def beat(loop_settings: Settings, tmp_path: Path) -> Any:
    log = (tmp_path / "beat.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.celery_app",
            "beat",
            "-s",
            str(tmp_path / "schedule"),
            "-l",
            "INFO",
        ],
        cwd=REPO,
        env=worker_env(loop_settings),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


def test_beat_sweep_reenqueues_turns_whose_extraction_never_ran(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services, loop_settings: Settings, beat: Any
) -> None:
    turns = TurnStore(loop_services.opensearch, loop_settings.opensearch_namespace)
    turn_id = record_turn(turns, crew, "lost_turn_fact", age_s=600)
    loop_services.opensearch.indices.refresh(index=turns.alias)
    done = wait_turn(api, crew.h("alice"), turn_id, timeout=40)
    assert done["extraction_status"] == "done"
    assert done["result"]["merge"]["ops"][0]["outcome"] == "inserted"


def test_beat_health_check_follows_the_scheduler(beat: Any, tmp_path: Path) -> None:
    """The compose/Helm health check of beat: fresh while the scheduler ticks, failing once it stops."""
    from workers.beat import check

    schedule = str(tmp_path / "schedule")
    wait_until(lambda: check(schedule) is None, timeout=30)
    probe = [sys.executable, "-m", "workers.beat", "check", schedule]
    assert subprocess.run(probe, cwd=REPO, capture_output=True, check=False).returncode == 0
    beat.terminate()
    beat.wait(timeout=20)
    wait_until(lambda: check(schedule, max_age_s=1.0) is not None, timeout=10)
    stale = subprocess.run([*probe, "1"], cwd=REPO, capture_output=True, text=True, check=False)
    assert stale.returncode == 1 and "beat last ticked" in stale.stderr
    assert (
        check(str(tmp_path / "never-started"))
        == f"{tmp_path / 'never-started'}.alive does not exist: beat has not ticked yet"
    )


def test_an_alias_candidate_must_be_said_as_words_not_inside_one(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    """``go`` inside "going", ``cache`` inside "cached" are not the user's vocabulary: as an alias
    such a common word would pull the belief into every unrelated turn. Scripts written without
    spaces (``セッションストアの設定``) still match inside the text."""
    put_all(
        loop_services.store,
        make_belief(crew.tenant, "alice", "golang_api", id="b-go", type="entity", aliases=["golang"], content="Go."),
        make_belief(crew.tenant, "alice", "redis_cache", id="b-redis", type="entity", content="Redis cache."),
        make_belief(crew.tenant, "alice", "session_store", id="b-sess", type="entity", content="Sessions in Redis."),
    )
    said = "We are going to serve cached pages; セッションストアの設定 and the eviction sweeps matter."
    candidates = [
        {"surface": "go", "possible_entities": ["golang_api"], "confidence": "high"},
        {"surface": "cache", "possible_entities": ["redis_cache"], "confidence": "high"},
        {"surface": "セッションストア", "possible_entities": ["session_store"], "confidence": "high"},
        {"surface": "eviction sweeps", "possible_entities": ["redis_cache"], "confidence": "high"},
    ]
    turn = post_turn(api, crew.h("alice"), "ok" + sidecar(possible_alias_candidates=candidates), user_message=said)
    wait_turn(api, crew.h("alice"), turn["turn_id"])
    wait_until(lambda: "eviction sweeps" in _belief(api, crew, "b-redis")["aliases"])
    assert _belief(api, crew, "b-redis")["aliases"] == ["eviction sweeps"]
    assert _belief(api, crew, "b-go")["aliases"] == ["golang"]
    assert _belief(api, crew, "b-sess")["aliases"] == ["セッションストア"]


def test_every_script_written_without_spaces_matches_inside_the_text() -> None:
    """The flywheel kept its own, shorter list of such scripts: a Lao, Myanmar or Khmer surface
    inside unbroken text was taken for part of a longer word and dropped."""
    from service.extraction.flywheel import said_as_words

    for surface, said in (
        ("ລາວ", "ພາສາລາວດີ"),  # Lao
        ("ကြက်", "ကြက်သားဟင်း"),  # Myanmar
        ("កាហ្វេ", "ខ្ញុំចូលចិត្តកាហ្វេណាស់"),  # Khmer
        ("セッションストア", "セッションストアの設定"),
        ("eviction sweeps", "the eviction sweeps matter"),
    ):
        assert said_as_words(surface, said), surface
    assert not said_as_words("go", "we are going")
