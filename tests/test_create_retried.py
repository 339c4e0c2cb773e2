"""A create whose first attempt was stored but whose answer was lost (the node died mid-request and
opensearch-py sent it again to the next node) must not be told "409 already exists": the retry
meets its own document. Any other write with the same id still conflicts.

The second ``put`` below is exactly what the transport's retry does: the same create, the same
document, after the first one was stored (cluster drill, docs/fault-drills.md)."""

from __future__ import annotations

import pytest

from service.errors import Conflict
from service.storage.beliefs import BeliefStore
from tests.conftest import principal
from tests.factories import make_belief


def test_the_same_create_sent_again_is_done_not_a_conflict(store: BeliefStore, tenant: str) -> None:
    belief = make_belief(tenant, "alice", "retried_create")
    store.put(belief, create_only=True)
    store.put(belief, create_only=True)  # the retry: stored already, same document
    assert store.get(principal(tenant, "alice"), belief.id).content == belief.content


def test_another_write_with_the_same_id_still_conflicts(store: BeliefStore, tenant: str) -> None:
    first = make_belief(tenant, "alice", "taken_id")
    store.put(first, create_only=True)
    other = make_belief(tenant, "alice", "taken_id", content="Something else entirely.")
    with pytest.raises(Conflict):
        store.put(other, create_only=True)
    assert store.get(principal(tenant, "alice"), first.id).content == first.content
