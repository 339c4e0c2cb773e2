"""Upgrading a deployment to the beliefs template v3 (``tenure-belief-fields`` v2: the relation's
``relation_type``) with ``tenure reindex beliefs`` on a real node: the stored corpus recalls
identically afterwards, a typed relation is refused by the old index with a 4xx (its mapping is
strict) and stored, recalled and rendered with its type after the upgrade."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opensearchpy import OpenSearch

from service.config import Settings
from service.domain.belief import Belief
from service.domain.principal import Principal
from service.errors import ValidationFailed
from service.recall.context import ContextBuilder
from service.recall.render import render_injection
from service.storage import templates
from tests import test_cli_operations as operations
from tests.upgrade import copy_templates, deploy_old

TENANT = "relation-upgrade"
# the operator-command tests' own namespace fixture
ns_settings = operations.ns_settings


@pytest.fixture
def before_v3(tmp_path: Path) -> Path:
    """A copy of index_templates/ as released before v3: belief fields v1, without relation_type."""
    root = copy_templates(tmp_path)
    fields = root / "component" / "tenure-belief-fields.json"
    body = json.loads(fields.read_text())
    body["version"] = 1
    body["template"]["mappings"]["properties"].pop("relation_type")
    fields.write_text(json.dumps(body))
    beliefs = root / "index" / "tenure-beliefs.json"
    index = json.loads(beliefs.read_text())
    index["version"] = 2
    index["composed_of"] = [
        "tenure-belief-fields-v1" if c.startswith("tenure-belief-fields-") else c for c in index["composed_of"]
    ]
    beliefs.write_text(json.dumps(index))
    return root


def _relation(**extra: Any) -> Belief:
    fields: dict[str, Any] = {
        "tenant_id": TENANT,
        "owner_id": "test-user",
        "type": "relation",
        "canonical_name": "payments_api_uses_redis",
        "aliases": ["payments redis"],
        "content": "The payments API keeps its sessions in Redis.",
        "why_it_matters": "A Redis change is a payments change.",
        "scope": ["domain:code"],
        "participants": ["b-payments-api", "b-session-store"],
    }
    return Belief.model_validate(fields | extra)


def test_reindex_to_the_relation_type_mapping_keeps_recall_identical(
    ns_settings: Settings, os_client: OpenSearch, before_v3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = deploy_old(ns_settings, os_client, before_v3, monkeypatch, TENANT)
    store = old.store
    untyped = _relation(id="b-untyped-relation")
    store.put(untyped, refresh="true")  # new code, old index: a relation without a type still writes
    before = old.recall_everything()
    with pytest.raises(ValidationFailed):  # the old mapping is strict: a 4xx, never a 500
        store.put(_relation(id="b-typed-early", relation_type="depends_on"), refresh="true")

    result = old.reindex()
    assert result["template"] == f"{old.alias}-v{templates.load_json('index/tenure-beliefs.json')['version']}"
    assert result["target"] == f"{old.alias}-000002"
    assert result["documents"]["source"] == result["documents"]["target"]

    assert old.recall_everything() == before
    assert store.get(Principal(tenant_id=TENANT, user_id="test-user"), untyped.id).relation_type is None
    typed = _relation(
        id="b-typed", relation_type="Depends On", canonical_name="checkout_ledger_link", aliases=["ledger link"]
    )
    store.put(typed, refresh="true")
    who = Principal(tenant_id=TENANT, user_id="test-user")
    assert store.get(who, "b-typed").relation_type == "depends_on"
    found = ContextBuilder(store, ns_settings.recall).build(who, ["domain:code"], "what is the ledger link?")
    assert [e.belief.id for e in found.relevant] == ["b-typed"]
    block = render_injection(found).text
    assert '"relation_type": "depends_on"' in block and '"type": "relation"' in block
