"""Records keyed ``<tenant>:<id>`` (turns, review items) through ``service/storage/keyed_records.py``
on the session's node: created once, saved only over the version they were loaded at, a record
the model cannot load named with its erase route, and a stored source that names another tenant
read as absent even under the tenant's own key (a hand-edited index)."""

from __future__ import annotations

import uuid

import pytest
from opensearchpy import OpenSearch

from service.config import Settings
from service.errors import Conflict, NotFound, Unreadable
from service.storage.client import routed_id
from service.storage.reviews import REVIEWS, ReviewItem, ReviewStore
from service.storage.templates import apply_templates
from service.storage.turns import TURNS, TurnRecord, TurnStore


@pytest.fixture(scope="module")
def stores(os_client: OpenSearch, settings: Settings) -> tuple[TurnStore, ReviewStore]:
    ns = settings.opensearch_namespace
    apply_templates(os_client, ns, (TURNS, REVIEWS))
    return TurnStore(os_client, ns), ReviewStore(os_client, ns)


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _turn(tenant: str, turn_id: str) -> TurnRecord:
    return TurnRecord(tenant_id=tenant, turn_id=turn_id, owner_id="alice", session_id="s")


def _review(tenant: str, review_id: str) -> ReviewItem:
    return ReviewItem(tenant_id=tenant, review_id=review_id, kind="conflict", owner_id="alice")


def test_created_once_and_saved_only_over_the_version_loaded(stores: tuple[TurnStore, ReviewStore]) -> None:
    turns, reviews = stores
    tenant = _tenant()
    turns.create(_turn(tenant, "turn-1"))
    with pytest.raises(Conflict, match="turn 'turn-1' already exists"):
        turns.create(_turn(tenant, "turn-1"))
    turn, seq_no, term = turns.load(tenant, "turn-1")
    turn.extraction_status = "done"
    turns.save(turn, seq_no=seq_no, primary_term=term)
    with pytest.raises(Conflict, match="turn 'turn-1' changed concurrently"):
        turns.save(turn, seq_no=seq_no, primary_term=term)
    assert turns.load(tenant, "turn-1")[0].extraction_status == "done"
    with pytest.raises(NotFound):
        turns.load(_tenant(), "turn-1")  # the same id under another tenant's key

    assert reviews.create(_review(tenant, "rv-1")) is True
    assert reviews.create(_review(tenant, "rv-1")) is False  # filed already: no change
    loaded = reviews.load(tenant, "rv-1")
    assert loaded is not None
    item, seq_no, term = loaded
    item.status = "dismissed"
    reviews.save(item, seq_no=seq_no, primary_term=term)
    with pytest.raises(Conflict, match="review item 'rv-1' changed concurrently"):
        reviews.save(item, seq_no=seq_no, primary_term=term)
    assert reviews.load(_tenant(), "rv-1") is None


def test_a_source_naming_another_tenant_reads_as_absent(
    stores: tuple[TurnStore, ReviewStore], os_client: OpenSearch, settings: Settings
) -> None:
    turns, reviews = stores
    tenant, other = _tenant(), _tenant()
    ns = settings.opensearch_namespace
    for alias, doc_id, source in (
        (TURNS.alias(ns), routed_id(tenant, "turn-x"), _turn(other, "turn-x").model_dump(mode="json")),
        (REVIEWS.alias(ns), routed_id(tenant, "rv-x"), _review(other, "rv-x").model_dump(mode="json")),
    ):
        os_client.index(index=alias, id=doc_id, routing=tenant, body=source, refresh=True)
    with pytest.raises(NotFound):
        turns.load(tenant, "turn-x")
    assert reviews.load(tenant, "rv-x") is None


def test_an_unloadable_record_names_where_an_admin_erases_it(
    stores: tuple[TurnStore, ReviewStore], os_client: OpenSearch, settings: Settings
) -> None:
    turns, reviews = stores
    tenant = _tenant()
    ns = settings.opensearch_namespace
    bad_turn = _turn(tenant, "turn-bad").model_dump(mode="json") | {"extraction_status": "bogus"}
    bad_review = _review(tenant, "rv-bad").model_dump(mode="json") | {"kind": "bogus"}
    for alias, key, source in ((TURNS.alias(ns), "turn-bad", bad_turn), (REVIEWS.alias(ns), "rv-bad", bad_review)):
        os_client.index(index=alias, id=routed_id(tenant, key), routing=tenant, body=source, refresh=True)
    with pytest.raises(Unreadable, match="/v1/admin/quarantine/turn/turn-bad"):
        turns.load(tenant, "turn-bad")
    with pytest.raises(Unreadable, match="/v1/admin/quarantine/review/rv-bad"):
        reviews.load(tenant, "rv-bad")
