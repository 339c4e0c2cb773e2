"""What the template-upgrade tests share (``test_relation_type_upgrade``,
``test_multilingual_upgrade``): a copy of ``index_templates/`` to turn into an older release, a
namespace deployed from it with the paper corpus loaded, ``tenure reindex beliefs`` back to the
released templates, and the recall of every static paper case to compare before and after."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opensearchpy import OpenSearch

from evals.cases import paper_case_set
from evals.runner import ContextBackend, load_corpus
from service.config import Settings
from service.domain.principal import Principal
from service.recall.context import ContextBuilder
from service.storage import templates
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS
from tests.test_cli_operations import _run

# (key, user, scopes, question): a recall beyond the paper's static cases
Question = tuple[str, str, list[str], str]


def copy_templates(tmp_path: Path) -> Path:
    """A copy of the released ``index_templates/`` that a test edits into an older release."""
    root = tmp_path / "index_templates"
    for path in templates.TEMPLATE_DIR.rglob("*.json"):
        target = root / path.relative_to(templates.TEMPLATE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    return root


@dataclass
class OldDeployment:
    """A namespace deployed from older templates, holding the paper corpus of ``tenant``."""

    settings: Settings
    store: BeliefStore
    tenant: str
    released: Path
    monkeypatch: pytest.MonkeyPatch

    @property
    def alias(self) -> str:
        return BELIEFS.alias(self.settings.opensearch_namespace)

    def reindex(self) -> dict[str, Any]:
        """Release the current templates and run ``tenure reindex beliefs``; its JSON result."""
        self.monkeypatch.setattr(templates, "TEMPLATE_DIR", self.released)
        code, result, err = _run(self.settings, "reindex", "beliefs")
        assert code == 0, err
        assert isinstance(result, dict)
        return result

    def recall_everything(self, extra: Sequence[Question] = ()) -> dict[str, Any]:
        """Every static paper case (and ``extra``): the ids of each tier, with scores."""
        backend = ContextBackend(ContextBuilder(self.store, self.settings.recall))
        questions = [(c.case_id, c.user_id, c.scope, c.query) for c in paper_case_set().static]
        out: dict[str, Any] = {}
        for key, user, scope, query in [*questions, *extra]:
            tiers = backend.recall(Principal(tenant_id=self.tenant, user_id=user), scope, query, None)
            out[key] = (tiers.pinned, tiers.relevant, tiers.questions, tiers.scores)
        return out


def deploy_old(
    settings: Settings, os_client: OpenSearch, old_templates: Path, monkeypatch: pytest.MonkeyPatch, tenant: str
) -> OldDeployment:
    """``tenure apply-templates`` from ``old_templates``, then the paper corpus into ``tenant``."""
    released = templates.TEMPLATE_DIR
    monkeypatch.setattr(templates, "TEMPLATE_DIR", old_templates)
    assert _run(settings, "apply-templates")[0] == 0
    store = BeliefStore(os_client, settings.opensearch_namespace)
    load_corpus(store, tenant, paper_case_set())
    return OldDeployment(settings, store, tenant, released, monkeypatch)
