"""Retention against the real node: audit events and turns past their tenant's limit are deleted,
every other tenant's and every younger document stays, turns waiting for extraction stay, and a
second run deletes nothing (idempotent, like apply-templates)."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from opensearchpy import OpenSearch

from service.cli import main
from service.config import RetentionSettings, Settings, TenantRetention
from service.domain.belief import utcnow
from service.storage.audit import AuditEvent, AuditStore
from service.storage.client import build_client
from service.storage.operations import apply_all
from service.storage.retention import RetentionStore, apply_retention
from service.storage.templates import AUDIT, FAMILIES, TURNS, drop_namespace
from service.storage.turns import TurnRecord, TurnStore

AGES = (5, 20, 60, 400)  # days
NOW = utcnow()
POLICY = RetentionSettings(
    audit_days=30,
    turns_days=10,
    tenants={"t-long": TenantRetention(audit_days=365), "t-forever": TenantRetention(audit_days=0, turns_days=0)},
)


@pytest.fixture
def client(settings: Settings) -> Iterator[OpenSearch]:
    """Its own client with a patient timeout: creating five indices on a busy CI node can take
    longer than the service's 10 s, and this test is about retention, not start-up latency."""
    patient = build_client(settings.model_copy(update={"opensearch_timeout_s": 120.0}))
    yield patient
    patient.close()


@pytest.fixture
def ns(client: OpenSearch) -> Iterator[str]:
    namespace = f"ret-{uuid.uuid4().hex[:8]}"
    apply_all(client, namespace)
    yield namespace
    drop_namespace(client, namespace, FAMILIES)
    client.indices.delete_index_template(name=f"{namespace}-*", ignore=[404])


def _seed(client: OpenSearch, ns: str) -> None:
    events, turns = AuditStore(client, ns), TurnStore(client, ns)
    for tenant in ("t-default", "t-long", "t-forever"):
        events.append_many(
            [
                AuditEvent(
                    tenant_id=tenant, at=NOW - timedelta(days=d), action="recall", actor_id="u", actor_kind="user"
                )
                for d in AGES
            ]
        )
        for days in AGES:
            at = NOW - timedelta(days=days)
            turns.create(
                TurnRecord(
                    tenant_id=tenant,
                    turn_id=f"turn-{days}",
                    owner_id="u",
                    session_id="s",
                    user_message="text of the turn",
                    extraction_status="done",
                    created_at=at,
                )
            )
    # waiting for extraction: kept whatever its age (the sweep still owes it a run)
    turns.create(
        TurnRecord(
            tenant_id="t-default",
            turn_id="turn-pending",
            owner_id="u",
            session_id="s",
            created_at=NOW - timedelta(days=400),
        )
    )
    client.indices.refresh(index=f"{ns}-*")


def _ages_left(client: OpenSearch, ns: str, family: str, tenant: str, field: str) -> list[int]:
    body = {"query": {"term": {"tenant_id": tenant}}, "size": 100, "_source": [field]}
    hits = client.search(index=f"{ns}-{family}", body=body)["hits"]["hits"]
    return sorted(round((NOW - _parse(h["_source"][field])).total_seconds() / 86400) for h in hits)


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_each_tenant_keeps_what_its_limits_allow(client: OpenSearch, ns: str) -> None:
    _seed(client, ns)
    done = apply_retention(RetentionStore(client, ns), POLICY, NOW)
    assert {(e.family, e.tenant_id, e.days): e.deleted for e in done} == {
        ("audit", None, 30): 2,  # t-default's 60- and 400-day events (overridden tenants untouched)
        ("audit", "t-long", 365): 1,
        ("turns", None, 10): 3,  # t-default's 20/60/400-day turns, not the pending one
        ("turns", "t-long", 10): 3,  # its override leaves turns at the deployment's 10 days
    }
    assert _ages_left(client, ns, "audit", "t-default", "at") == [5, 20]
    assert _ages_left(client, ns, "audit", "t-long", "at") == [5, 20, 60]
    assert _ages_left(client, ns, "audit", "t-forever", "at") == list(AGES)
    assert _ages_left(client, ns, "turns", "t-default", "created_at") == [5, 400]  # 400: the pending turn
    assert _ages_left(client, ns, "turns", "t-long", "created_at") == [5]
    assert _ages_left(client, ns, "turns", "t-forever", "created_at") == list(AGES)
    # idempotent: the same limits again delete nothing
    assert all(e.deleted == 0 for e in apply_retention(RetentionStore(client, ns), POLICY, NOW))


def test_zero_everywhere_keeps_everything(client: OpenSearch, ns: str) -> None:
    _seed(client, ns)
    assert apply_retention(RetentionStore(client, ns), RetentionSettings(audit_days=0, turns_days=0), NOW) == []
    assert len(_ages_left(client, ns, "audit", "t-default", "at")) == len(AGES)


def test_the_cli_applies_the_configured_retention(settings: Settings, client: OpenSearch, ns: str) -> None:
    _seed(client, ns)
    out, err = io.StringIO(), io.StringIO()
    configured = settings.model_copy(update={"opensearch_namespace": ns, "retention": POLICY})
    assert main(["--json", "apply-retention"], settings=configured, out=out, err=err) == 0, err.getvalue()
    report = json.loads(out.getvalue())
    assert {"family": AUDIT.name, "tenant_id": "t-long", "days": 365, "deleted": 1} in report
    assert sum(e["deleted"] for e in report if e["family"] == TURNS.name) == 6


def test_per_tenant_retention_reads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENURE_RETENTION_AUDIT_DAYS", "400")
    monkeypatch.setenv("TENURE_RETENTION_TENANTS", '{"acme": {"turns_days": 7}}')
    policy = Settings(_env_file=None).retention  # type: ignore[call-arg]
    assert policy.for_tenant("acme") == TenantRetention(audit_days=400, turns_days=7)
    assert policy.for_tenant("other") == TenantRetention(audit_days=400, turns_days=90)
