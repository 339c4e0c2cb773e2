"""A real Celery worker builds the tenant's vocabulary after the extraction that wrote its beliefs,
and after a write through the API (service/recall/prebuild.py), so the next recall through the API
loads it instead of building it on the request path, and recalls the new belief."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service import redis_keys
from service.api.state import Services
from service.config import Settings
from service.extraction.queue import TASK_PREBUILD_VOCABULARY
from service.recall.vocabulary import TenantVocabulary, VocabularyMatcher
from service.write_versions import TenantWriteVersions
from tests.api.conftest import Team, ok
from tests.memory_loop.conftest import WorkerProcess, new_belief, sidecar, wait_turn, wait_until
from tests.memory_loop.test_extraction_worker import post_turn


def _matcher(services: Services) -> VocabularyMatcher:
    matcher = services.recall.builder.matcher
    assert matcher is not None and matcher.cache.shared is not None
    return matcher


def test_the_next_recall_after_an_extraction_loads_the_workers_build(
    api: TestClient, crew: Team, other_crew: Team, worker: WorkerProcess, loop_services: Services
) -> None:
    matcher = _matcher(loop_services)
    shared = matcher.cache.shared
    assert shared is not None
    answer = "Noted." + sidecar(
        new_beliefs=[new_belief("search_cluster", "Search runs on OpenSearch 2.x.", aliases=["opensearch"])]
    )
    done = wait_turn(api, crew.h("alice"), post_turn(api, crew.h("alice"), answer)["turn_id"])
    assert done["extraction_status"] == "done", done
    wait_until(lambda: _prebuilt(loop_services, crew.tenant))
    builds, loads = matcher.cache.stats.builds, matcher.cache.stats.shared_loads
    body = {"scopes": ["domain:code"], "query": "how is opensearch tuned?"}
    recalled = ok(api.post("/v1/recall", json=body, headers=crew.h("alice")))
    assert _relevant_names(recalled) == ["search_cluster"]
    assert (matcher.cache.stats.builds, matcher.cache.stats.shared_loads) == (builds, loads + 1)
    # the other tenant wrote nothing: no entry of theirs, and their recall finds nothing of ours
    assert shared.load(other_crew.tenant) is None
    assert _relevant_names(ok(api.post("/v1/recall", json=body, headers=other_crew.h("alice")))) == []


def test_a_write_through_the_api_is_prebuilt_by_the_worker(
    api: TestClient, crew: Team, worker: WorkerProcess, loop_services: Services, loop_settings: Settings
) -> None:
    matcher = _matcher(loop_services)
    body = {
        "type": "decision", "canonical_name": "artifact_store", "aliases": ["nexus"],
        "content": "Artifacts go to Nexus.", "why_it_matters": "Publish to Nexus.", "scope": ["domain:code"],
    }  # fmt: skip
    ok(api.post("/v1/beliefs", json=body, headers=crew.h("alice")), 201)
    wait_until(lambda: _prebuilt(loop_services, crew.tenant))
    # the task took its waiting marker: the next write asks again
    marker = redis_keys.queued_task(loop_settings.opensearch_namespace, f"{TASK_PREBUILD_VOCABULARY}:{crew.tenant}")
    assert loop_services.redis.exists(marker) == 0
    builds, loads = matcher.cache.stats.builds, matcher.cache.stats.shared_loads
    recalled = ok(api.post("/v1/recall", json={"scopes": ["domain:code"], "query": "where does nexus live?"},
                           headers=crew.h("alice")))  # fmt: skip
    assert _relevant_names(recalled) == ["artifact_store"]
    assert (matcher.cache.stats.builds, matcher.cache.stats.shared_loads) == (builds, loads + 1)


def _prebuilt(services: Services, tenant: str) -> bool:
    """The shared entry holds the tenant's vocabulary at its current write version."""
    shared = _matcher(services).cache.shared
    assert shared is not None
    entry = shared.load(tenant)
    version = TenantWriteVersions(services.redis, shared.namespace).current(tenant)
    fingerprint = _matcher(services).store.mapping().fingerprint
    return entry is not None and TenantVocabulary.is_encoded_for(
        entry, tenant_id=tenant, version=version, fingerprint=fingerprint
    )


def _relevant_names(recalled: dict[str, Any]) -> list[str]:
    return [b["canonical_name"] for b in recalled["tiers"]["relevant"]]
