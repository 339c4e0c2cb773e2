"""Builders for test beliefs (real documents in the real index)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from opensearchpy import OpenSearch

from service.domain.belief import Belief, ChangeLogEntry, utcnow
from service.storage.beliefs import BeliefStore
from service.storage.change_logs import ORPHAN_MIN_AGE, ChangeLogStore
from service.storage.client import routed_id


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


def old_orphan_logs(os_client: OpenSearch, store: BeliefStore, tenants: list[str], per_tenant: int) -> list[str]:
    """Log documents no belief points at, old enough for the orphan sweep: what writers that
    crashed after their log document, before their belief document, leave. Their ids."""
    old = (utcnow() - ORPHAN_MIN_AGE - timedelta(minutes=1)).isoformat()
    ids = []
    for owner in tenants:
        for i in range(per_tenant):
            belief = make_belief(owner, "alice", f"crashed_{i}")
            belief.change_log = [ChangeLogEntry(changed_at=utcnow(), trigger="created", actor="alice")]
            pending = ChangeLogStore.split(belief.to_document())
            assert pending is not None
            store.logs.write(pending)
            ids.append(routed_id(owner, pending.ref))
            os_client.update(index=store.logs.alias, id=ids[-1], routing=owner, body={"doc": {"created_at": old}})
    os_client.indices.refresh(index=store.logs.alias)
    return ids
