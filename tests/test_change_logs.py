"""The beliefs' change logs live in their own index family (service/storage/change_logs.py): the
belief document names its log document, recall's hits carry neither, every read that loads a whole
belief gets its history back, and a write never leaves a belief without it: the log document is
written first, the belief then points at it, the log it replaced is deleted. Two tenants with the
same belief id never see each other's logs."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from opensearchpy import OpenSearch

from service.config import CelerySettings
from service.domain.belief import Belief, ChangeLogEntry, utcnow
from service.errors import Conflict, Unreadable
from service.storage import beliefs as belief_storage
from service.storage.beliefs import BeliefStore, move_inline_logs
from service.storage.change_logs import ORPHAN_MIN_AGE, ChangeLogStore, SweepPace
from service.storage.client import routed_id
from service.storage.templates import BELIEFS, apply_templates, drop_namespace, expected_mapping, load_json
from service.storage.unreadable import why_unreadable
from tests.conftest import principal
from tests.factories import make_belief, old_orphan_logs, put_all

TRIGGERS = ("created", "reinforced", "note added")


def _entries(*triggers: str, note: str | None = None) -> list[ChangeLogEntry]:
    return [ChangeLogEntry(changed_at=utcnow(), trigger=t, actor="alice", note=note) for t in triggers]


def _with_log(tenant: str, name: str, *triggers: str, note: str | None = None, **overrides: Any) -> Belief:
    belief = make_belief(tenant, "alice", name, **overrides)
    belief.change_log = _entries(*triggers, note=note)
    return belief


def _reinforce(store: BeliefStore, tenant: str, belief_id: str) -> None:
    """A read for update, one more entry, a compare-and-set: what the lifecycle does."""
    loaded, seq_no, term = store.get_versioned(principal(tenant, "alice"), belief_id)
    loaded.change_log.append(_entries("reinforced")[0])
    store.replace(loaded, if_seq_no=seq_no, if_primary_term=term)


def _raw(os_client: OpenSearch, store: BeliefStore, belief: Belief) -> dict[str, Any]:
    found = os_client.get(index=store.alias, id=routed_id(belief.tenant_id, belief.id), routing=belief.tenant_id)
    source: dict[str, Any] = found["_source"]
    return source


def _log_documents(os_client: OpenSearch, store: BeliefStore, tenant: str, belief_id: str) -> list[dict[str, Any]]:
    os_client.indices.refresh(index=store.logs.alias)
    body = {
        "size": 100,
        "query": {"bool": {"filter": [{"term": {"tenant_id": tenant}}, {"term": {"belief_id": belief_id}}]}},
    }
    hits = os_client.search(index=store.logs.alias, body=body)["hits"]["hits"]
    return [h["_source"] for h in hits]


def test_the_log_lives_in_its_own_document(os_client: OpenSearch, store: BeliefStore, tenant: str) -> None:
    belief = _with_log(tenant, "log_apart", *TRIGGERS)
    store.put(belief)

    stored = _raw(os_client, store, belief)
    assert "change_log" not in stored
    logs = _log_documents(os_client, store, tenant, belief.id)
    assert [log["ref"] for log in logs] == [stored["change_log_ref"]]
    assert [e["trigger"] for e in logs[0]["entries"]] == list(TRIGGERS)

    loaded = store.get(principal(tenant, "alice"), belief.id)
    assert loaded.change_log == belief.change_log
    assert loaded == belief  # the model as written: the ref is the storage layer's, not the model's


def test_reads_for_recall_carry_no_log(store: BeliefStore, tenant: str) -> None:
    belief = _with_log(tenant, "log_not_recalled", *TRIGGERS)
    store.put(belief)
    (light,) = store.get_many(principal(tenant, "alice"), [belief.id])
    assert light.change_log == []
    assert light.content == belief.content


def test_a_write_replaces_the_log_document_and_retires_the_old_one(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    belief = _with_log(tenant, "log_rewritten", "created")
    store.put(belief)
    first_ref = _raw(os_client, store, belief)["change_log_ref"]

    _reinforce(store, tenant, belief.id)

    second_ref = _raw(os_client, store, belief)["change_log_ref"]
    assert second_ref != first_ref
    assert [log["ref"] for log in _log_documents(os_client, store, tenant, belief.id)] == [second_ref]
    assert [e.trigger for e in store.get(principal(tenant, "alice"), belief.id).change_log] == ["created", "reinforced"]


def test_a_refused_write_keeps_the_stored_history_and_leaves_no_log_behind(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    belief = _with_log(tenant, "log_cas", "created")
    store.put(belief)
    loaded, seq_no, term = store.get_versioned(principal(tenant, "alice"), belief.id)
    loaded.change_log.append(_entries("lost race")[0])
    with pytest.raises(Conflict):
        store.replace(loaded, if_seq_no=seq_no + 100, if_primary_term=term)  # someone else wrote first

    assert [e.trigger for e in store.get(principal(tenant, "alice"), belief.id).change_log] == ["created"]
    assert len(_log_documents(os_client, store, tenant, belief.id)) == 1


def test_two_tenants_with_the_same_belief_id_keep_their_own_logs(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    mine = _with_log(tenant, "shared_id", "created", note="tenant one's note", id="b-same-id")
    theirs = _with_log(other, "shared_id", "created", "reinforced", note="tenant two's note", id="b-same-id")
    store.put(mine)
    store.put(theirs)

    assert [e.note for e in store.get(principal(tenant, "alice"), "b-same-id").change_log] == ["tenant one's note"]
    assert [e.note for e in store.get(principal(other, "alice"), "b-same-id").change_log] == ["tenant two's note"] * 2

    # a hard delete in one tenant removes its logs only
    admin = principal(tenant, "root", admin=True)
    assert belief_storage.delete_ids(store, admin, ["b-same-id"]) == ["b-same-id"]
    assert _log_documents(os_client, store, tenant, "b-same-id") == []
    assert len(_log_documents(os_client, store, other, "b-same-id")) == 1
    assert len(store.get(principal(other, "alice"), "b-same-id").change_log) == 2


def test_a_reader_whose_log_was_retired_meanwhile_reads_the_belief_again(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    belief = _with_log(tenant, "log_race", "created")
    store.put(belief)
    held = os_client.get(index=store.alias, id=routed_id(tenant, belief.id), routing=tenant)  # read, then...

    _reinforce(store, tenant, belief.id)  # ...a writer retires its log

    (whole,) = store.with_logs([held])
    assert [e["trigger"] for e in whole["_source"]["change_log"]] == ["created", "reinforced"]
    assert whole["_seq_no"] > held["_seq_no"]


def test_a_belief_whose_log_is_gone_is_quarantined_not_historyless(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    belief = _with_log(tenant, "log_lost", "created")
    store.put(belief)
    ref = _raw(os_client, store, belief)["change_log_ref"]
    os_client.delete(index=store.logs.alias, id=routed_id(tenant, ref), routing=tenant, refresh=True)

    with pytest.raises(Unreadable):
        store.get(principal(tenant, "alice"), belief.id)
    (light,) = store.get_many(principal(tenant, "alice"), [belief.id])  # recall still reads it
    assert light.id == belief.id
    # what the quarantine's erase by id checks first: the stored form, its log included, cannot load
    raw = belief_storage.raw_source(store, principal(tenant, "root", admin=True), belief.id)
    assert raw is not None and why_unreadable(raw) is not None
    # and the quarantine's scan lists it, and only it: a colleague's belief with its log loads
    intact = _with_log(tenant, "log_kept", "created")
    store.put(intact)
    store.refresh()
    sources, _ = belief_storage.raw_tenant_page(store, principal(tenant, "root", admin=True), size=50, after=None)
    reasons = {s["id"]: why_unreadable(s) for s in sources}
    assert reasons[intact.id] is None
    assert "change_log" in (reasons[belief.id] or "")


def test_a_document_with_its_log_inline_still_loads_and_its_next_write_moves_it_out(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    belief = _with_log(tenant, "log_inline", *TRIGGERS)
    document = belief.to_document()  # as written before the log moved out: the log inline
    os_client.index(index=store.alias, id=routed_id(tenant, belief.id), routing=tenant, body=document, refresh=True)

    loaded, seq_no, term = store.get_versioned(principal(tenant, "alice"), belief.id)
    assert loaded.change_log == belief.change_log
    loaded.change_log.append(_entries("reinforced")[0])
    store.replace(loaded, if_seq_no=seq_no, if_primary_term=term)

    stored = _raw(os_client, store, belief)
    assert "change_log" not in stored and "change_log_ref" in stored
    assert len(store.get(principal(tenant, "alice"), belief.id).change_log) == len(TRIGGERS) + 1


def test_bulk_writes_store_each_log_and_retire_the_replaced_ones(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    beliefs = [_with_log(tenant, f"bulk_log_{i}", "created") for i in range(5)]
    assert not store.put_many(beliefs, refresh="true").failed
    for b in beliefs:
        b.change_log.append(_entries("imported again")[0])
    assert not store.put_many(beliefs, refresh="true").failed
    for b in beliefs:
        assert len(_log_documents(os_client, store, tenant, b.id)) == 1
        assert [e.trigger for e in store.get(principal(tenant, "alice"), b.id).change_log] == [
            "created",
            "imported again",
        ]
    # a create-only import of the same ids is refused and leaves no log document behind
    result = store.put_many(beliefs, refresh="true", create_only=True)
    assert sorted(result.failed) == sorted(b.id for b in beliefs)
    for b in beliefs:
        assert len(_log_documents(os_client, store, tenant, b.id)) == 1


def test_the_sweep_removes_logs_no_belief_points_at(os_client: OpenSearch, store: BeliefStore, tenant: str) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    belief = _with_log(tenant, "log_swept", "created")
    store.put(belief)
    live_ref = _raw(os_client, store, belief)["change_log_ref"]
    # writers that crashed after their log document, before their belief document: two in this
    # tenant (one of a belief that exists, one of a belief never written), one in another
    crashed = [belief, _with_log(tenant, "never_written", "created"), _with_log(other, "log_swept", "created")]
    orphans = []
    for one in crashed:
        pending = ChangeLogStore.split(one.to_document())
        assert pending is not None
        store.logs.write(pending)
        orphans.append((one.tenant_id, pending.ref))
    old = (utcnow() - ORPHAN_MIN_AGE - timedelta(minutes=1)).isoformat()
    for owner, ref in [(tenant, live_ref), *orphans]:
        os_client.update(
            index=store.logs.alias, id=routed_id(owner, ref), routing=owner, body={"doc": {"created_at": old}}
        )
    os_client.indices.refresh(index=store.logs.alias)

    # beat's run covers every tenant (>=: another test's orphans may be old enough by now)
    done = store.logs.sweep_orphans(page=2)
    assert done.removed >= 3 and done.tenants >= 2 and done.resume_after is None
    assert [log["ref"] for log in _log_documents(os_client, store, tenant, belief.id)] == [live_ref]
    assert _log_documents(os_client, store, tenant, "b-never-written-alice") == []
    assert _log_documents(os_client, store, other, belief.id) == []
    assert [e.trigger for e in store.get(principal(tenant, "alice"), belief.id).change_log] == ["created"]
    assert store.logs.sweep_orphans(tenant_id=tenant).removed == 0


class _Ticks:
    """A clock that moves one second per reading, and the rests asked of it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rests: list[float] = []

    def clock(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.rests.append(seconds)


def _own_namespace(os_client: OpenSearch) -> tuple[str, BeliefStore]:
    namespace = f"test-sweep-{uuid.uuid4().hex[:8]}"
    apply_templates(os_client, namespace)
    return namespace, BeliefStore(os_client, namespace)


def test_the_sweep_rests_between_pages_for_its_work_fraction(os_client: OpenSearch) -> None:
    namespace, store = _own_namespace(os_client)
    try:
        old_orphan_logs(os_client, store, ["t-a"], per_tenant=5)
        ticks = _Ticks()
        pace = SweepPace(work_fraction=0.25, clock=ticks.clock, sleep=ticks.sleep)
        done = store.logs.sweep_orphans(page=2, pace=pace)
        assert (done.removed, done.tenants, done.resume_after) == (5, 1, None)
        # 5 logs in pages of 2: three pages (the last one short), each worked one tick and rested three
        assert ticks.rests == [3.0, 3.0, 3.0]
        os_client.indices.refresh(index=store.logs.alias)
        assert store.logs.sweep_orphans(pace=SweepPace(work_fraction=1.0, sleep=ticks.sleep)).removed == 0
        assert ticks.rests == [3.0, 3.0, 3.0]  # a fraction of 1 never rests
    finally:
        drop_namespace(os_client, namespace)


def test_a_sweep_out_of_budget_stops_between_tenants_and_the_next_resumes(os_client: OpenSearch) -> None:
    namespace, store = _own_namespace(os_client)
    tenants = ["t-a", "t-b", "t-c"]
    try:
        old_orphan_logs(os_client, store, tenants, per_tenant=2)
        ticks = _Ticks()
        pace = SweepPace(budget_s=1.0, clock=ticks.clock, sleep=ticks.sleep)  # spent after one tenant
        passes = []
        after: str | None = None
        while True:
            done = store.logs.sweep_orphans(pace=pace, resume_after=after)
            passes.append((done.removed, done.tenants, done.resume_after))
            after = done.resume_after
            if after is None:
                break
        assert passes == [(2, 1, "t-a"), (2, 1, "t-b"), (2, 1, None)]
        os_client.indices.refresh(index=store.logs.alias)
        assert store.logs.sweep_orphans().removed == 0
        # one tenant's sweep (an admin's) ignores the cursor of the others
        old_orphan_logs(os_client, store, ["t-b"], per_tenant=1)
        assert store.logs.sweep_orphans(tenant_id="t-b", resume_after="t-c").removed == 1
    finally:
        drop_namespace(os_client, namespace)


def test_the_sweep_budget_must_leave_room_in_the_task_time_limit() -> None:
    with pytest.raises(ValueError, match="SWEEP_BUDGET"):
        CelerySettings(change_log_sweep_budget_s=300.0, heavy_soft_time_limit_s=240)
    with pytest.raises(ValueError, match="work_fraction"):
        SweepPace(work_fraction=0.0)


def test_an_index_made_before_the_log_moved_out_gets_the_ref_field(os_client: OpenSearch) -> None:
    namespace = f"test-old-{uuid.uuid4().hex[:8]}"
    mapping = expected_mapping(BELIEFS)
    del mapping["properties"]["change_log_ref"]
    index = BELIEFS.concrete(namespace)
    settings = load_json("component/tenure-analysis.json")["template"]["settings"]  # the analyzers it needs
    settings["index"].update(number_of_shards=1, number_of_replicas=0)
    try:
        os_client.indices.create(
            index=index, body={"settings": settings, "mappings": mapping, "aliases": {BELIEFS.alias(namespace): {}}}
        )
        apply_templates(os_client, namespace)
        live = os_client.indices.get_mapping(index=index)[index]["mappings"]["properties"]
        assert live["change_log_ref"] == expected_mapping(BELIEFS)["properties"]["change_log_ref"]
        store = BeliefStore(os_client, namespace)
        belief = _with_log("t-old", "old_index", "created")
        store.put(belief)
        assert store.get(principal("t-old", "alice"), belief.id).change_log == belief.change_log
    finally:
        drop_namespace(os_client, namespace)


def test_moving_inline_logs_rewrites_each_belief_once_and_keeps_its_history(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    old = [_with_log(tenant, f"inline_{i}", *TRIGGERS[: i + 1]) for i in range(3)]
    for b in old:  # as written before the log moved out: the log inline
        os_client.index(index=store.alias, id=routed_id(tenant, b.id), routing=tenant, body=b.to_document())
    current = _with_log(tenant, "already_apart", "created")
    store.put(current)
    before = _raw(os_client, store, current)["change_log_ref"]
    os_client.indices.refresh(index=store.alias)

    done = move_inline_logs(store, tenant_id=tenant, page=2)
    assert (done.scanned, done.moved, done.changed_meanwhile, done.unreadable) == (4, 3, 0, [])
    for b in old:
        stored = _raw(os_client, store, b)
        assert "change_log" not in stored and "change_log_ref" in stored
        assert store.get(principal(tenant, "alice"), b.id).change_log == b.change_log
    assert _raw(os_client, store, current)["change_log_ref"] == before  # not rewritten

    os_client.indices.refresh(index=store.alias)
    assert move_inline_logs(store, tenant_id=tenant).moved == 0


def test_a_bulk_compare_and_set_skips_a_belief_changed_meanwhile_and_retires_its_new_log(
    os_client: OpenSearch, store: BeliefStore, tenant: str
) -> None:
    """``put_many(versions=...)``, the move's write: a belief written since it was read is not
    overwritten, is reported as changed, and the log written for it does not stay behind."""
    kept, stale = _with_log(tenant, "cas_kept", "created"), _with_log(tenant, "cas_stale", "created")
    put_all(store, kept, stale)
    read = {b.id: store.get_versioned(principal(tenant, "alice"), b.id) for b in (kept, stale)}
    _reinforce(store, tenant, stale.id)  # someone else's write lands between the read and ours
    ours = [loaded for loaded, _, _ in read.values()]
    for loaded in ours:
        loaded.change_log.append(_entries("note added")[0])
    versions = {routed_id(tenant, b_id): (seq_no, term) for b_id, (_, seq_no, term) in read.items()}

    result = store.put_many(ours, refresh="true", versions=versions)

    assert result.written == [kept.id] and result.changed_meanwhile == [stale.id]
    assert "changed concurrently" in result.failed[stale.id]
    triggers = [e.trigger for e in store.get(principal(tenant, "alice"), stale.id).change_log]
    assert triggers == ["created", "reinforced"]  # the other write's, not ours
    assert [log["ref"] for log in _log_documents(os_client, store, tenant, stale.id)] == [
        _raw(os_client, store, stale)["change_log_ref"]
    ]
    assert [e.trigger for e in store.get(principal(tenant, "alice"), kept.id).change_log] == ["created", "note added"]
