"""Index templates: applied idempotently, live mapping equals the versioned JSON, alias swap works."""

from __future__ import annotations

import uuid
from typing import Any

from opensearchpy import OpenSearch

from service.config import Settings
from service.domain.belief import Belief
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS, apply_templates, drop_namespace, expected_mapping, swap_alias


def _live_mapping(client: OpenSearch, alias: str) -> dict[str, Any]:
    response = client.indices.get_mapping(index=alias)
    (only,) = response.values()
    mapping: dict[str, Any] = only["mappings"]
    return mapping


def _normalise(value: Any) -> Any:
    """OpenSearch echoes booleans/numbers in mappings as given, but may stringify some; compare loosely."""
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, bool):
        return str(value).lower()
    return value


def test_live_mapping_matches_template(os_client: OpenSearch, settings: Settings) -> None:
    live = _live_mapping(os_client, BELIEFS.alias(settings.opensearch_namespace))
    assert _normalise(live) == _normalise(expected_mapping(BELIEFS))


def test_apply_is_idempotent_and_alias_points_to_generation_one(os_client: OpenSearch, settings: Settings) -> None:
    ns = settings.opensearch_namespace
    apply_templates(os_client, ns)
    apply_templates(os_client, ns)
    targets = list(os_client.indices.get_alias(name=BELIEFS.alias(ns)).keys())
    assert targets == [BELIEFS.concrete(ns, 1)]


def test_reindex_swaps_alias_atomically_and_keeps_documents(os_client: OpenSearch) -> None:
    ns = f"swap-{uuid.uuid4().hex[:6]}"
    apply_templates(os_client, ns)
    try:
        store = BeliefStore(os_client, ns)
        belief = Belief(
            tenant_id="t1",
            owner_id="u1",
            type="entity",
            canonical_name="redis_cache",
            aliases=["redis"],
            content="Redis is the cache.",
            scope=["domain:code"],
        )
        store.put(belief, refresh="true")
        target = swap_alias(os_client, BELIEFS, ns, 2)
        assert list(os_client.indices.get_alias(name=BELIEFS.alias(ns)).keys()) == [target]
        assert _normalise(_live_mapping(os_client, target)) == _normalise(expected_mapping(BELIEFS))
        from tests.conftest import principal

        assert store.get(principal("t1", "u1"), belief.id).canonical_name == "redis_cache"
    finally:
        drop_namespace(os_client, ns)
