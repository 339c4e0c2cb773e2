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

from service.config import Settings
from service.domain.belief import Belief
from service.storage import templates
from tests import test_cli_operations as operations
from tests.upgrade import copy_templates, deploy_old

TENANT = "upgrade-tenant"
JAPANESE_QUESTION = "セッションストアの設定を教えて"
KOREAN_QUESTION = "레디스의 설정은 어떻게 돼?"
# the operator-command tests' own namespace fixture
ns_settings = operations.ns_settings


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
    root = copy_templates(tmp_path)
    analysis = root / "component" / "tenure-analysis.json"
    analysis.write_text(json.dumps(_version_one_analysis(json.loads(analysis.read_text())), ensure_ascii=False))
    beliefs = root / "index" / "tenure-beliefs.json"
    body = json.loads(beliefs.read_text())
    body["version"] = 1
    # composed_of names components by stem: "tenure-analysis" is put as -v1 from its file above
    beliefs.write_text(json.dumps(body))
    return root


# the Japanese and Korean questions beside the paper's static cases
CJK_QUESTIONS = [
    ("ja", "test-user", ["domain:code"], JAPANESE_QUESTION),
    ("ko", "test-user", ["domain:code"], KOREAN_QUESTION),
]


def test_reindex_to_the_multilingual_analysis_keeps_english_recall_identical(
    ns_settings: Settings, os_client: OpenSearch, version_one: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = deploy_old(ns_settings, os_client, version_one, monkeypatch, TENANT)
    store = old.store
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
    before = old.recall_everything(CJK_QUESTIONS)
    # new code on the old index: English as always; the Japanese and Korean questions find
    # nothing (v1 cannot segment them) but do not fail either
    assert before["ja"][1] == [] and before["ko"][1] == []

    result = old.reindex()  # release the multilingual templates
    version = templates.load_json("index/tenure-beliefs.json")["version"]
    assert result["template"] == f"{old.alias}-v{version}" and result["target"] == f"{old.alias}-000002"
    assert result["documents"]["source"] == result["documents"]["target"] == 31

    after = old.recall_everything(CJK_QUESTIONS)
    assert after["ja"][1] == [japanese.id] and after["ko"][1] == [korean.id]
    english = [case for case in before if case not in ("ja", "ko")]
    assert len(english) == 60
    assert {c: after[c] for c in english} == {c: before[c] for c in english}
