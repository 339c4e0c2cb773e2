"""A real Celery worker builds the tenant's vocabulary after the extraction that wrote its beliefs
(service/recall/prebuild.py), so the next recall through the API loads it instead of building it
on the request path, and recalls the new belief."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
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
    versions = TenantWriteVersions(loop_services.redis, shared.namespace)
    answer = "Noted." + sidecar(
        new_beliefs=[new_belief("search_cluster", "Search runs on OpenSearch 2.x.", aliases=["opensearch"])]
    )
    done = wait_turn(api, crew.h("alice"), post_turn(api, crew.h("alice"), answer)["turn_id"])
    assert done["extraction_status"] == "done", done
    fingerprint = matcher.store.mapping().fingerprint

    def prebuilt() -> bool:
        entry = shared.load(crew.tenant)
        version = versions.current(crew.tenant)
        return entry is not None and TenantVocabulary.is_encoded_for(
            entry, tenant_id=crew.tenant, version=version, fingerprint=fingerprint
        )

    wait_until(prebuilt)
    builds, loads = matcher.cache.stats.builds, matcher.cache.stats.shared_loads
    body = {"scopes": ["domain:code"], "query": "how is opensearch tuned?"}
    recalled = ok(api.post("/v1/recall", json=body, headers=crew.h("alice")))
    assert _relevant_names(recalled) == ["search_cluster"]
    assert (matcher.cache.stats.builds, matcher.cache.stats.shared_loads) == (builds, loads + 1)
    # the other tenant wrote nothing: no entry of theirs, and their recall finds nothing of ours
    assert shared.load(other_crew.tenant) is None
    assert _relevant_names(ok(api.post("/v1/recall", json=body, headers=other_crew.h("alice")))) == []


def _relevant_names(recalled: dict[str, Any]) -> list[str]:
    return [b["canonical_name"] for b in recalled["tiers"]["relevant"]]
