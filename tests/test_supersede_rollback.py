"""A supersede whose retirement fails on a real store: the new version it wrote is removed only
when a real-time read shows the old version was not retired. A timed-out retire may have been
applied; removing its successor then would leave the old version pointing at nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opensearchpy import OpenSearch

from service.auth.actor import Actor
from service.beliefs.lifecycle import BeliefLifecycle, Change, Replacement
from service.errors import NotFound, StoreUnavailable
from service.storage.audit import AuditStore
from service.storage.beliefs import BeliefStore
from tests.conftest import principal
from tests.factories import make_belief, put_all


@pytest.fixture
def lifecycle(os_client: OpenSearch, store: BeliefStore) -> BeliefLifecycle:
    return BeliefLifecycle(store, AuditStore(os_client, store.namespace), refresh="true")


def _supersede_with(
    lifecycle: BeliefLifecycle, store: BeliefStore, tenant: str, retire: Callable[..., Any]
) -> tuple[str, StoreUnavailable]:
    """Supersede ``b-orm`` with ``retire`` standing in for the lifecycle's; returns the id the new
    version was given and the error the supersede raised."""
    alice = principal(tenant, "alice")
    put_all(store, make_belief(tenant, "alice", "orm_choice", id="b-orm", content="Uses Mongoose."))
    old = store.get(alice, "b-orm")
    lifecycle.retire = retire  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable) as failed:
        lifecycle.supersede(Change(Actor(alice)), old, Replacement(content="Uses the raw driver.", id="b-orm-2"))
    return "b-orm-2", failed.value


def test_a_retire_applied_but_unanswered_keeps_the_new_version(
    lifecycle: BeliefLifecycle, store: BeliefStore, tenant: str
) -> None:
    real_retire = lifecycle.retire

    def applied_then_lost(*args: Any, **kwargs: Any) -> Any:
        real_retire(*args, **kwargs)
        raise StoreUnavailable("store a belief: the node did not answer in time")

    new_id, _ = _supersede_with(lifecycle, store, tenant, applied_then_lost)
    alice = principal(tenant, "alice")
    assert store.get(alice, "b-orm").superseded_by == new_id
    assert store.get(alice, new_id).content == "Uses the raw driver."


def test_a_retire_that_never_happened_removes_the_new_version(
    lifecycle: BeliefLifecycle, store: BeliefStore, tenant: str
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("store a belief: the node refused")

    new_id, _ = _supersede_with(lifecycle, store, tenant, refused)
    alice = principal(tenant, "alice")
    assert store.get(alice, "b-orm").is_live
    with pytest.raises(NotFound):
        store.get(alice, new_id)


def test_when_the_read_back_fails_too_the_new_version_is_kept(
    lifecycle: BeliefLifecycle, store: BeliefStore, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("store a belief: the node refused")

    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("read a belief's successor: the node did not answer")

    monkeypatch.setattr(store, "successor_now", unreadable)
    new_id, _ = _supersede_with(lifecycle, store, tenant, refused)
    monkeypatch.undo()
    alice = principal(tenant, "alice")
    assert store.get(alice, "b-orm").is_live  # a live duplicate, visible and mendable, not a lost version
    assert store.get(alice, new_id).is_live
