"""Upgrading a deployment to stored vocabulary units (beliefs template v5, ``tenure-belief-fields``
v3: ``vocabulary_units``) with ``tenure reindex beliefs`` on a real node. Before the upgrade the
documents have no units and the vocabulary is read from term vectors (recall by vocabulary still
answers); the reindex stores every document's units in the new generation (they are not in
``_source``, so the copy alone has none), after which the vocabulary is one aggregation. Recall by
vocabulary is the same before and after, and the same as the Lucene query's, on every static
paper case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opensearchpy import OpenSearch

from evals.cases import paper_case_set
from service.config import Settings
from service.domain.principal import Principal
from service.recall.context import ContextBuilder
from service.recall.vocabulary import VocabularyMatcher
from service.storage import calls
from service.storage.beliefs import BeliefStore
from service.storage.vocabulary import UNITS_FIELD
from tests import test_cli_operations as operations
from tests.upgrade import copy_templates, deploy_old

TENANT = "units-upgrade"
# the operator-command tests' own namespace fixture
ns_settings = operations.ns_settings


@pytest.fixture
def before_v5(tmp_path: Path) -> Path:
    """A copy of index_templates/ as released before v5: belief fields v2, without units."""
    root = copy_templates(tmp_path)
    fields = root / "component" / "tenure-belief-fields.json"
    body = json.loads(fields.read_text())
    body["version"] = 2
    body["template"]["mappings"]["properties"].pop(UNITS_FIELD)
    body["template"]["mappings"].pop("_source")
    fields.write_text(json.dumps(body))
    beliefs = root / "index" / "tenure-beliefs.json"
    index = json.loads(beliefs.read_text())
    index["version"] = 4
    beliefs.write_text(json.dumps(index))
    return root


def _recall_by_vocabulary(settings: Settings, client: OpenSearch, vocabulary: bool) -> dict[str, Any]:
    """Every static paper case: each tier's ids, with scores (a fresh store: its mapping read now)."""
    store = BeliefStore(client, settings.opensearch_namespace)
    matcher = VocabularyMatcher.for_store(store, settings.recall) if vocabulary else None
    builder = ContextBuilder(store, settings.recall, matcher)
    out: dict[str, Any] = {}
    for case in paper_case_set().static:
        result = builder.build(Principal(tenant_id=TENANT, user_id=case.user_id), case.scope, case.query)
        out[case.case_id] = (
            [e.belief.id for e in result.pinned],
            [(e.belief.id, e.score) for e in result.relevant],
            [e.belief.id for e in result.questions],
        )
    return out


def test_reindex_stores_the_units_and_recall_is_unchanged(
    ns_settings: Settings, os_client: OpenSearch, before_v5: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = deploy_old(ns_settings, os_client, before_v5, monkeypatch, TENANT)
    me = Principal(tenant_id=TENANT, user_id="test-user")
    before = calls.run(os_client, old.store.vocabulary.tenant_units(me))
    assert before.documents == 29 and before.legacy == 29  # no units: every document read from term vectors
    recalled_before = _recall_by_vocabulary(ns_settings, os_client, vocabulary=True)

    result = old.reindex()
    assert result["units_stored"] == result["documents"]["target"] == 29

    fresh = BeliefStore(os_client, ns_settings.opensearch_namespace)
    after = calls.run(os_client, fresh.vocabulary.tenant_units(me))
    assert after.documents == 29 and after.legacy == 0  # one aggregation now
    assert after.groups == before.groups
    source = os_client.search(index=old.alias, routing=TENANT, body={"size": 1})["hits"]["hits"][0]["_source"]
    assert UNITS_FIELD not in source  # the stored belief is the model's document, as before
    recalled_after = _recall_by_vocabulary(ns_settings, os_client, vocabulary=True)
    assert len(recalled_after) == 60
    assert recalled_after == recalled_before == _recall_by_vocabulary(ns_settings, os_client, vocabulary=False)
