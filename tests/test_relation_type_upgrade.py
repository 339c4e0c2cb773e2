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

from evals.cases import paper_case_set
from evals.runner import ContextBackend, load_corpus
from service.config import Settings
from service.domain.belief import Belief
from service.domain.principal import Principal
from service.errors import ValidationFailed
from service.recall.context import ContextBuilder
from service.recall.render import render_injection
from service.storage import templates
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS
from tests import test_cli_operations as operations

TENANT = "relation-upgrade"
# the operator-command tests' own namespace fixture and CLI runner
ns_settings = operations.ns_settings
_run = operations._run


@pytest.fixture
def before_v3(tmp_path: Path) -> Path:
    """A copy of index_templates/ as released before v3: belief fields v1, without relation_type."""
    root = tmp_path / "index_templates"
    for path in templates.TEMPLATE_DIR.rglob("*.json"):
        target = root / path.relative_to(templates.TEMPLATE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
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


def _recall_everything(store: BeliefStore, settings: Settings) -> dict[str, Any]:
    backend = ContextBackend(ContextBuilder(store, settings.recall))
    out: dict[str, Any] = {}
    for case in paper_case_set().static:
        tiers = backend.recall(Principal(tenant_id=TENANT, user_id=case.user_id), case.scope, case.query, None)
        out[case.case_id] = (tiers.pinned, tiers.relevant, tiers.questions, tiers.scores)
    return out


def test_reindex_to_the_relation_type_mapping_keeps_recall_identical(
    ns_settings: Settings, os_client: OpenSearch, before_v3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = BELIEFS.alias(ns_settings.opensearch_namespace)
    released = templates.TEMPLATE_DIR
    monkeypatch.setattr(templates, "TEMPLATE_DIR", before_v3)
    assert _run(ns_settings, "apply-templates")[0] == 0
    store = BeliefStore(os_client, ns_settings.opensearch_namespace)
    load_corpus(store, TENANT, paper_case_set())
    untyped = _relation(id="b-untyped-relation")
    store.put(untyped, refresh="true")  # new code, old index: a relation without a type still writes
    before = _recall_everything(store, ns_settings)
    with pytest.raises(ValidationFailed):  # the old mapping is strict: a 4xx, never a 500
        store.put(_relation(id="b-typed-early", relation_type="depends_on"), refresh="true")

    monkeypatch.setattr(templates, "TEMPLATE_DIR", released)
    code, result, err = _run(ns_settings, "reindex", "beliefs")
    assert code == 0, err
    assert result["template"] == f"{alias}-v{templates.load_json('index/tenure-beliefs.json')['version']}"
    assert result["target"] == f"{alias}-000002"
    assert result["documents"]["source"] == result["documents"]["target"]

    assert _recall_everything(store, ns_settings) == before
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
