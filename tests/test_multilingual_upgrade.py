"""Upgrading a deployment to the multilingual analysis (``tenure-analysis`` v2, beliefs template v2)
with ``tenure reindex beliefs`` on a real node: the English corpus recalls identically afterwards
(same beliefs, same scores, same order) and the Japanese belief stored before the upgrade becomes
findable from an unsegmented question."""

from __future__ import annotations

import copy
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
from service.recall.context import ContextBuilder
from service.storage import templates
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS
from tests import test_cli_operations as operations

TENANT = "upgrade-tenant"
JAPANESE_QUESTION = "セッションストアの設定を教えて"
KOREAN_QUESTION = "레디스의 설정은 어떻게 돼?"
# the operator-command tests' own namespace fixture and CLI runner
ns_settings = operations.ns_settings
_run = operations._run


def _version_one_analysis(current: dict[str, Any]) -> dict[str, Any]:
    """``tenure-analysis`` as released before v2: the same body without the ``.cjk`` additions."""
    body = copy.deepcopy(current)
    body["version"] = 1
    settings = body["template"]["settings"]
    settings.pop("index")
    analysis = settings["analysis"]
    analysis.pop("tokenizer")
    analysis["char_filter"].pop("tenure_nfkc")
    for name in ("tenure_latin_tokens", "tenure_non_latin_tokens", "tenure_katakana_stem", "tenure_cjk_shingles"):
        analysis["filter"].pop(name)
    for name in ("tenure_fold", "tenure_ko_function_words", "tenure_ko_hangul_words"):  # v2, v3
        analysis["filter"].pop(name)
    analysis["analyzer"] = {
        k: v for k, v in analysis["analyzer"].items() if not k.startswith(("tenure_cjk_", "tenure_ko_"))
    }
    for field in body["template"]["mappings"]["properties"].values():
        for sub in ("cjk", "cjk_latin", "cjk_shingle", "ko", "ko_shingle"):
            field["fields"].pop(sub)
    return body


@pytest.fixture
def version_one(tmp_path: Path) -> Path:
    """A copy of index_templates/ as it was before the multilingual analysis."""
    root = tmp_path / "index_templates"
    for path in templates.TEMPLATE_DIR.rglob("*.json"):
        target = root / path.relative_to(templates.TEMPLATE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    analysis = root / "component" / "tenure-analysis.json"
    analysis.write_text(json.dumps(_version_one_analysis(json.loads(analysis.read_text())), ensure_ascii=False))
    beliefs = root / "index" / "tenure-beliefs.json"
    body = json.loads(beliefs.read_text())
    body["version"] = 1
    # composed_of names components by stem: "tenure-analysis" is put as -v1 from its file above
    beliefs.write_text(json.dumps(body))
    return root


def _recall_everything(store: BeliefStore, settings: Settings) -> dict[str, Any]:
    """Every static paper case and the Japanese and Korean questions: the ids of each tier, with scores."""
    backend = ContextBackend(ContextBuilder(store, settings.recall))
    out: dict[str, Any] = {}
    queries = [(c.case_id, c.user_id, c.scope, c.query) for c in paper_case_set().static]
    queries.append(("ja", "test-user", ["domain:code"], JAPANESE_QUESTION))
    queries.append(("ko", "test-user", ["domain:code"], KOREAN_QUESTION))
    for case_id, user, scope, query in queries:
        tiers = backend.recall(Principal(tenant_id=TENANT, user_id=user), scope, query, None)
        out[case_id] = (tiers.pinned, tiers.relevant, tiers.questions, tiers.scores)
    return out


def test_reindex_to_the_multilingual_analysis_keeps_english_recall_identical(
    ns_settings: Settings, os_client: OpenSearch, version_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = BELIEFS.alias(ns_settings.opensearch_namespace)
    released = templates.TEMPLATE_DIR
    monkeypatch.setattr(templates, "TEMPLATE_DIR", version_one)
    assert _run(ns_settings, "apply-templates")[0] == 0
    store = BeliefStore(os_client, ns_settings.opensearch_namespace)
    load_corpus(store, TENANT, paper_case_set())
    japanese = Belief(
        tenant_id=TENANT,
        owner_id="test-user",
        type="decision",
        canonical_name="セッションストア",
        content="セッションストアは Redis。",
        scope=["domain:code"],
    )
    korean = japanese.model_copy(
        update={"id": "b-ko-redis", "canonical_name": "레디스", "content": "레디스는 캐시 전용."}
    )
    store.put_many([japanese, korean], refresh="true")
    before = _recall_everything(store, ns_settings)
    # new code on the old index: English as always; the Japanese and Korean questions find
    # nothing (v1 cannot segment them) but do not fail either
    assert before["ja"][1] == [] and before["ko"][1] == []

    monkeypatch.setattr(templates, "TEMPLATE_DIR", released)  # release the multilingual templates
    code, result, err = _run(ns_settings, "reindex", "beliefs")
    assert code == 0, err
    version = templates.load_json("index/tenure-beliefs.json")["version"]
    assert result["template"] == f"{alias}-v{version}" and result["target"] == f"{alias}-000002"
    assert result["documents"]["source"] == result["documents"]["target"] == 31

    after = _recall_everything(store, ns_settings)
    assert after["ja"][1] == [japanese.id] and after["ko"][1] == [korean.id]
    english = [case for case in before if case not in ("ja", "ko")]
    assert len(english) == 60
    assert {c: after[c] for c in english} == {c: before[c] for c in english}
