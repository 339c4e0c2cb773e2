"""Index templates: applied idempotently, live mapping equals the versioned JSON, alias swap works."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from opensearchpy import OpenSearch, RequestError

from service.config import Settings
from service.domain.belief import Belief
from service.errors import NotFound, StoreUnavailable, ValidationFailed
from service.storage.audit import SORTED_FIELDS, AuditEvent, AuditQuery, AuditStore
from service.storage.beliefs import BeliefStore
from service.storage.operations import upgrade_family
from service.storage.templates import (
    AUDIT,
    BELIEF_LOGS,
    BELIEFS,
    TURNS,
    apply_templates,
    doc_values_drift,
    drop_namespace,
    ensure_alias,
    expected_mapping,
    has_doc_values,
    index_sort,
    index_template_body,
    index_template_name,
    merge_policy,
    template_refresh_interval,
    unsorted_indices,
)
from service.storage.turns import TurnRecord, TurnStore
from tests.conftest import principal


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


def test_the_change_logs_family_comes_with_the_beliefs(os_client: OpenSearch, settings: Settings) -> None:
    """The session's namespace was set up with the beliefs family alone: its logs came with it."""
    live = _live_mapping(os_client, BELIEF_LOGS.alias(settings.opensearch_namespace))
    assert _normalise(live) == _normalise(expected_mapping(BELIEF_LOGS))
    assert live["properties"]["entries"] == {"type": "object", "enabled": False}  # stored, never indexed


def test_apply_is_idempotent_and_alias_points_to_generation_one(os_client: OpenSearch, settings: Settings) -> None:
    ns = settings.opensearch_namespace
    apply_templates(os_client, ns)
    apply_templates(os_client, ns)
    targets = list(os_client.indices.get_alias(name=BELIEFS.alias(ns)).keys())
    assert targets == [BELIEFS.concrete(ns, 1)]


def _segments_per_tier(client: OpenSearch, alias: str) -> set[str]:
    live = client.indices.get_settings(index=alias, name="index.merge.policy.segments_per_tier")
    return {str(v["settings"]["index"]["merge"]["policy"]["segments_per_tier"]) for v in live.values()}


def test_the_merge_policy_reaches_an_index_made_before_it(os_client: OpenSearch) -> None:
    """A template only shapes new indices; the measured merge policy (docs/operations.md) is put on
    the existing index behind the alias by every apply, idempotently."""
    ns = f"mp-{uuid.uuid4().hex[:8]}"
    try:
        apply_templates(os_client, ns)
        alias = BELIEFS.alias(ns)
        wanted = str(merge_policy(BELIEFS)["policy"]["segments_per_tier"])
        assert _segments_per_tier(os_client, alias) == {wanted}
        # an index from before the policy (OpenSearch's default), then a start-up of this release
        os_client.indices.put_settings(index=alias, body={"index": {"merge": {"policy": {"segments_per_tier": 10}}}})
        apply_templates(os_client, ns)
        apply_templates(os_client, ns)
        assert _segments_per_tier(os_client, alias) == {wanted}
    finally:
        drop_namespace(os_client, ns)


@pytest.mark.parametrize(
    ("version", "missing"),
    [("v1", ("credential", "credential_id")), ("v2", ("credential_id",))],
)
def test_a_turns_index_made_before_turns_named_their_credential_takes_it_and_keeps_its_turns(
    os_client: OpenSearch, version: str, missing: tuple[str, ...]
) -> None:
    """Turns template v2 adds ``credential``, v3 ``credential_id``: a start-up puts what an index
    made by an earlier version lacks on it (strict, so it would refuse every new turn otherwise),
    and a turn stored before still loads, without them (docs/memory-loop.md: extracted by the rule
    such turns always had, no revocation check). Two tenants' turns."""
    ns = f"turns-{version}-{uuid.uuid4().hex[:8]}"
    mapping = expected_mapping(TURNS)
    for field in missing:
        del mapping["properties"][field]
    index = TURNS.concrete(ns)
    try:
        os_client.indices.create(
            index=index,
            body={
                "settings": {"index": {"number_of_shards": 1, "number_of_replicas": 0}},
                "mappings": mapping,
                "aliases": {TURNS.alias(ns): {"is_write_index": True}},
            },
        )
        store = TurnStore(os_client, ns)
        old = TurnRecord(tenant_id="t-a", turn_id="turn-old", owner_id="dana", session_id="s").model_dump(mode="json")
        for field in missing:
            del old[field]  # as the code before wrote it
        os_client.index(index=TURNS.alias(ns), id="t-a:turn-old", body=old, routing="t-a", refresh=True)
        new = TurnRecord(
            tenant_id="t-b",
            turn_id="turn-new",
            owner_id="dana",
            session_id="s",
            credential="idp_token",
            credential_id="idp-jti-1",
        )
        with pytest.raises(ValidationFailed):  # the strict earlier mapping refuses the field
            store.create(new)
        apply_templates(os_client, ns, (TURNS,))
        live = os_client.indices.get_mapping(index=index)[index]["mappings"]["properties"]
        for field in ("credential", "credential_id"):
            assert _normalise(live[field]) == _normalise(expected_mapping(TURNS)["properties"][field])
        store.create(new)
        before = store.load("t-a", "turn-old")[0]
        assert (before.credential, before.credential_id) == (None, None)
        after = store.load("t-b", "turn-new")[0]
        assert (after.credential, after.credential_id) == ("idp_token", "idp-jti-1")
        with pytest.raises(NotFound):  # keyed by tenant: the other tenant's turn is not this one's
            store.load("t-a", "turn-new")
    finally:
        drop_namespace(os_client, ns, (TURNS,))


def _refresh_intervals(client: OpenSearch, alias: str) -> list[str | None]:
    """Each index's explicit refresh interval, None where it has none (OpenSearch's default)."""
    live = client.indices.get_settings(index=alias, name="index.refresh_interval")  # lists only explicit ones
    return [
        live.get(index, {}).get("settings", {}).get("index", {}).get("refresh_interval")
        for index in sorted(client.indices.get_alias(name=alias))
    ]


def test_the_audit_index_refreshes_every_30_s(os_client: OpenSearch) -> None:
    """The audit template (v3) refreshes every 30 s: drained receipts wait at most that long in the
    node's indexing buffer (v2's search-idle shard kept them for minutes, then flushed them in one
    multi-second burst). An index an earlier template made (1s: v1; no interval: v2) is moved to
    30s by every apply; any other value (an operator's, a bulk load's -1) stays."""
    ns = f"ri-{uuid.uuid4().hex[:8]}"
    try:
        assert template_refresh_interval(AUDIT) == "30s"
        apply_templates(os_client, ns, (AUDIT,))
        alias = AUDIT.alias(ns)
        assert _refresh_intervals(os_client, alias) == ["30s"]
        for earlier in ("1s", None):
            os_client.indices.put_settings(index=alias, body={"index": {"refresh_interval": earlier}})
            assert _refresh_intervals(os_client, alias) == [earlier]
            apply_templates(os_client, ns, (AUDIT,))
            apply_templates(os_client, ns, (AUDIT,))
            assert _refresh_intervals(os_client, alias) == ["30s"]
        for kept in ("5s", "-1"):
            os_client.indices.put_settings(index=alias, body={"index": {"refresh_interval": kept}})
            apply_templates(os_client, ns, (AUDIT,))
            assert _refresh_intervals(os_client, alias) == [kept]
    finally:
        drop_namespace(os_client, ns, (AUDIT,))


def _keywords_with_doc_values(mapping: dict[str, Any]) -> set[str]:
    return {
        name for name, spec in mapping["properties"].items() if spec.get("type") == "keyword" and has_doc_values(spec)
    }


def test_audit_keywords_keep_doc_values_only_where_reads_sort_on_them() -> None:
    """Doc values cost disk for every drained receipt: of the audit's keyword fields only those a
    read sorts on keep them (tenant_id: the shared common field)."""
    assert SORTED_FIELDS == ("at", "event_id")
    assert _keywords_with_doc_values(expected_mapping(AUDIT)) == {"event_id", "tenant_id"}


def test_audit_events_are_found_by_every_filter_without_doc_values(os_client: OpenSearch) -> None:
    """The lean fields still filter (term queries read the inverted index), the read still sorts
    and the per-day counts still aggregate; an aggregation on a lean field is refused, so the live
    index really has no doc values there."""
    ns = f"dv-{uuid.uuid4().hex[:6]}"
    try:
        apply_templates(os_client, ns, (AUDIT,))
        alias = AUDIT.alias(ns)
        assert _keywords_with_doc_values(_live_mapping(os_client, alias)) == {"event_id", "tenant_id"}
        store = AuditStore(os_client, ns)
        events = [
            AuditEvent(
                tenant_id="t-dv",
                action="recall" if i % 2 else "belief.create",
                actor_id=f"u{i}",
                actor_kind="user",
                credential_id=f"cred-{i}",
                belief_ids=[f"b-{i}", "b-shared"],
                session_id=f"s-{i}",
                request_id=f"req-{i}",
                scopes=["domain:code"],
            )
            for i in range(4)
        ]
        store.append_many(events, refresh=True)
        admin = principal("t-dv", "admin-1", admin=True)
        page, _ = store.search(admin, AuditQuery(), size=10, after=None)
        assert [e.event_id for e in page] == sorted((e.event_id for e in events), reverse=True)
        for query, wanted in (
            (AuditQuery(actor_id="u2"), {events[2].event_id}),
            (AuditQuery(belief_id="b-1"), {events[1].event_id}),
            (AuditQuery(belief_id="b-shared"), {e.event_id for e in events}),
            (AuditQuery(session_id="s-3"), {events[3].event_id}),
            (AuditQuery(request_id="req-0"), {events[0].event_id}),
            (AuditQuery(action="recall"), {events[1].event_id, events[3].event_id}),
            (AuditQuery(event_id=events[2].event_id), {events[2].event_id}),
        ):
            found, _ = store.search(admin, query, size=10, after=None)
            assert {e.event_id for e in found} == wanted, query
        assert sum(n for _, n in store.daily_counts(admin, "recall", days=2)) == 2
        with pytest.raises(RequestError):
            os_client.search(index=alias, body={"size": 0, "aggs": {"a": {"terms": {"field": "actor_id"}}}})
    finally:
        drop_namespace(os_client, ns, (AUDIT,))


def test_an_audit_index_with_doc_values_keeps_working_until_a_reindex_drops_them(
    os_client: OpenSearch, caplog: pytest.LogCaptureFixture
) -> None:
    """An audit index made by template v3 (doc values on every keyword) is left as it is by a
    start-up of this release, takes and serves events, and ``tenure reindex audit`` copies them
    into a generation with the lean mapping. Start-up names the index and the reindex until then."""
    ns = f"dvu-{uuid.uuid4().hex[:6]}"
    try:
        before = expected_mapping(AUDIT)
        for spec in before["properties"].values():
            spec.pop("doc_values", None)  # the v3 mapping
        apply_templates(os_client, ns, ())  # the components only
        os_client.indices.create(
            index=AUDIT.concrete(ns, 1),
            body={"mappings": before, "aliases": {AUDIT.alias(ns): {"is_write_index": True}}},
        )
        with caplog.at_level(logging.WARNING, logger="service.storage.templates"):
            apply_templates(os_client, ns, (AUDIT,))
        assert f"{AUDIT.concrete(ns, 1)} keeps doc values unlike its template on action, actor_id" in caplog.text
        assert "tenure reindex audit" in caplog.text
        alias = AUDIT.alias(ns)
        assert "actor_id" in _keywords_with_doc_values(_live_mapping(os_client, alias))
        store = AuditStore(os_client, ns)
        store.append_many([AuditEvent(tenant_id="t-dvu", action="recall", actor_id="u1", actor_kind="user")])
        result = upgrade_family(os_client, ns, AUDIT)
        assert result.target == AUDIT.concrete(ns, 2)
        assert result.documents == {"source": 1, "target": 1}
        assert _normalise(_live_mapping(os_client, alias)) == _normalise(expected_mapping(AUDIT))
        assert doc_values_drift(os_client, AUDIT, ns) == {}
        found, _ = store.search(principal("t-dvu", "a", admin=True), AuditQuery(actor_id="u1"), size=5, after=None)
        assert [e.actor_id for e in found] == ["u1"]
    finally:
        drop_namespace(os_client, ns, (AUDIT,))


def test_the_beliefs_index_is_sorted_by_tenant(os_client: OpenSearch, settings: Settings) -> None:
    """Every recall is filtered to one tenant: sorted by tenant_id, a tenant's documents are one
    run in each segment (docs/operations.md, "Beliefs sorted by tenant")."""
    assert index_sort(BELIEFS) == ["tenant_id"]
    live = os_client.indices.get_settings(index=BELIEFS.alias(settings.opensearch_namespace), name="index.sort.*")
    (only,) = live.values()
    assert only["settings"]["index"]["sort"]["field"] in (["tenant_id"], "tenant_id")
    assert unsorted_indices(os_client, BELIEFS, settings.opensearch_namespace) == []


def test_an_index_made_before_the_sort_is_reported_until_a_reindex(
    os_client: OpenSearch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sort is static: an index created by the template before v6 keeps its order. Start-up
    says so; ``tenure reindex beliefs`` (upgrade_family) gives the next generation the sort."""
    ns = f"sort-{uuid.uuid4().hex[:6]}"
    try:
        body = index_template_body(BELIEFS, ns)
        del body["template"]["settings"]["sort"]  # the template as it was before v6
        apply_templates(os_client, ns, ())  # the components only
        os_client.indices.put_index_template(name=index_template_name(BELIEFS, ns), body=body)
        ensure_alias(os_client, BELIEFS, ns)
        assert unsorted_indices(os_client, BELIEFS, ns) == [BELIEFS.concrete(ns, 1)]
        with caplog.at_level(logging.WARNING, logger="service.storage.templates"):
            apply_templates(os_client, ns)
        assert f"{BELIEFS.concrete(ns, 1)} is not sorted like its template" in caplog.text
        assert "tenure reindex beliefs" in caplog.text
        assert unsorted_indices(os_client, BELIEFS, ns) == [BELIEFS.concrete(ns, 1)]  # still: static
        target = upgrade_family(os_client, ns, BELIEFS).target
        assert target == BELIEFS.concrete(ns, 2)
        assert unsorted_indices(os_client, BELIEFS, ns) == []
    finally:
        drop_namespace(os_client, ns)


def test_a_reindex_copies_audit_events_written_since_the_last_refresh(os_client: OpenSearch) -> None:
    """The audit index refreshes only every 30 s: the copy must not miss the events written since
    (with writes blocked, the counts would differ and the upgrade fail)."""
    ns = f"rxa-{uuid.uuid4().hex[:6]}"
    try:
        apply_templates(os_client, ns, (AUDIT,))
        store = AuditStore(os_client, ns)
        events = [AuditEvent(tenant_id="t-rx", action="recall", actor_id=f"u{i}", actor_kind="user") for i in range(4)]
        store.append_many(events)  # no refresh, as the receipt drain writes them
        result = upgrade_family(os_client, ns, AUDIT)
        assert result.documents == {"source": 4, "target": 4}
        os_client.indices.refresh(index=AUDIT.alias(ns))
        assert os_client.count(index=AUDIT.alias(ns))["count"] == 4
    finally:
        drop_namespace(os_client, ns, (AUDIT,))


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
        target = upgrade_family(os_client, ns, BELIEFS).target
        assert list(os_client.indices.get_alias(name=BELIEFS.alias(ns)).keys()) == [target]
        assert _normalise(_live_mapping(os_client, target)) == _normalise(expected_mapping(BELIEFS))
        from tests.conftest import principal

        assert store.get(principal("t1", "u1"), belief.id).canonical_name == "redis_cache"
    finally:
        drop_namespace(os_client, ns)


def test_a_stale_index_template_version_is_replaced_on_apply(os_client: OpenSearch) -> None:
    """Start-up after a template version bump: the old version (same pattern and priority, which
    OpenSearch refuses side by side) is removed, the current one put."""
    ns = f"stale-{uuid.uuid4().hex[:6]}"
    try:
        apply_templates(os_client, ns)
        current = index_template_name(BELIEFS, ns)
        body = os_client.indices.get_index_template(name=current)["index_templates"][0]["index_template"]
        os_client.indices.delete_index_template(name=current)
        os_client.indices.put_index_template(name=f"{BELIEFS.alias(ns)}-v0", body=body)
        assert apply_templates(os_client, ns) == [f"{BELIEFS.alias(ns)}-v0"]
        names = [
            t["name"] for t in os_client.indices.get_index_template(name=f"{BELIEFS.alias(ns)}-v*")["index_templates"]
        ]
        assert names == [current]
    finally:
        drop_namespace(os_client, ns)


def test_a_write_blocked_index_is_a_retryable_store_outage(os_client: OpenSearch) -> None:
    ns = f"blocked-{uuid.uuid4().hex[:6]}"
    apply_templates(os_client, ns)
    store = BeliefStore(os_client, ns)
    belief = Belief(
        tenant_id="t1", owner_id="u1", type="entity", canonical_name="kafka", content="Kafka.", scope=["domain:code"]
    )
    index = BELIEFS.concrete(ns, 1)
    os_client.indices.put_settings(index=index, body={"index": {"blocks": {"write": True}}})
    try:
        with pytest.raises(StoreUnavailable, match="blocking writes"):
            store.put(belief, refresh="true")
    finally:
        os_client.indices.put_settings(index=index, body={"index": {"blocks": {"write": False}}})
        drop_namespace(os_client, ns)


def test_composed_of_names_components_by_stem_and_gets_their_versions_from_the_registry() -> None:
    """No index template file spells a component's version: it is added from the component's own
    file when the template is put (one place per version)."""
    from service.storage.templates import FAMILIES, TEMPLATE_DIR, component_name, index_template_body, load_json

    components = {path.stem for path in (TEMPLATE_DIR / "component").glob("*.json")}
    for family in FAMILIES:
        stems = load_json(f"index/tenure-{family.name}.json")["composed_of"]
        assert set(stems) <= components, family.name  # stems only, each an existing component file
        put = index_template_body(family, "ns")["composed_of"]
        assert put == [f"{stem}-v{load_json(f'component/{stem}.json')['version']}" for stem in stems]
        assert put == [component_name(stem) for stem in stems]
