"""Builders for test beliefs (real documents in the real index)."""

from __future__ import annotations

from typing import Any

from service.domain.belief import Belief
from service.storage.beliefs import BeliefStore


def make_belief(tenant: str, owner: str, name: str, **overrides: Any) -> Belief:
    data: dict[str, Any] = {
        "id": overrides.pop("id", f"b-{name.replace('_', '-')}-{owner}"),
        "tenant_id": tenant,
        "owner_id": owner,
        "type": "preference",
        "canonical_name": name,
        "aliases": [],
        "content": f"Content of {name} for {owner}.",
        "why_it_matters": f"Shapes answers about {name}.",
        "scope": ["domain:code"],
    }
    data.update(overrides)
    return Belief.model_validate(data)


def put_all(store: BeliefStore, *beliefs: Belief) -> None:
    result = store.put_many(list(beliefs), refresh="true")
    assert not result.failed, result.failed
