"""Operator commands against the real node: ``tenure apply-templates`` and ``tenure reindex``."""

from __future__ import annotations

import io
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opensearchpy import OpenSearch
from opensearchpy import exceptions as os_exc

from service.cli import main
from service.config import Settings
from service.domain.belief import Belief
from service.storage import templates
from service.storage.beliefs import BeliefStore
from service.storage.operations import segments_per_shard
from service.storage.templates import BELIEFS, FAMILIES, drop_namespace
from tests.conftest import principal


def _run(settings: Settings, *argv: str) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), settings=settings, out=out, err=err)
    return code, (json.loads(out.getvalue()) if out.getvalue() else None), err.getvalue()


@pytest.fixture
def ns_settings(settings: Settings, os_client: OpenSearch) -> Iterator[Settings]:
    """A namespace of its own, dropped afterwards with every family and template version in it."""
    ns = f"ops-{uuid.uuid4().hex[:8]}"
    yield settings.model_copy(update={"opensearch_namespace": ns})
    drop_namespace(os_client, ns, FAMILIES)
    os_client.indices.delete_index_template(name=f"{ns}-*", ignore=[404])


def _aliases(client: OpenSearch, alias: str) -> list[str]:
    return sorted(client.indices.get_alias(name=alias).keys())


def test_apply_templates_creates_every_family_and_is_idempotent(ns_settings: Settings, os_client: OpenSearch) -> None:
    ns = ns_settings.opensearch_namespace
    # an older template version with the same pattern and priority: OpenSearch refuses to hold both,
    # so the command must replace it rather than fail
    stale = {"index_patterns": [f"{ns}-beliefs-*"], "priority": 200, "template": {"settings": {"number_of_shards": 1}}}
    os_client.indices.put_index_template(name=f"{ns}-beliefs-v0", body=stale)

    code, first, err = _run(ns_settings, "apply-templates")
    assert code == 0, err
    assert first["removed_stale_index_templates"] == [f"{ns}-beliefs-v0"]
    expected = {
        f"{ns}-{name}": [f"{ns}-{name}-000001"]
        for name in ("beliefs", "belief-logs", "audit", "accounts", "turns", "reviews")
    }
    assert first["aliases"] == expected
    assert {_aliases(os_client, alias)[0] for alias in expected} == {v[0] for v in expected.values()}
    for name in first["index_templates"]:
        assert os_client.indices.exists_index_template(name=name)
    assert not os_client.indices.exists_index_template(name=f"{ns}-beliefs-v0")
    shards = os_client.indices.get_settings(index=f"{ns}-beliefs-000001")[f"{ns}-beliefs-000001"]
    assert shards["settings"]["index"]["number_of_shards"] == "8"  # the real template, not the stale one

    code, second, err = _run(ns_settings, "apply-templates")
    assert code == 0, err
    assert second == {**first, "removed_stale_index_templates": []}


def _beliefs(count: int) -> list[Belief]:
    return [
        Belief(
            tenant_id=f"t{i % 5}",
            owner_id="u1",
            type="entity",
            canonical_name=f"service_{i}",
            aliases=[f"svc{i}"],
            content=f"Service {i}.",
            scope=["domain:code"],
        )
        for i in range(count)
    ]


@pytest.fixture
def version_two(tmp_path: Path) -> Path:
    """A copy of index_templates/ whose beliefs index template is version 2 (4 shards instead of 8);
    tests deploy version 1 first, then point ``TEMPLATE_DIR`` here. Only the namespaced index
    template changes: component templates are shared by every namespace on the node."""
    root = tmp_path / "index_templates"
    shutil.copytree(templates.TEMPLATE_DIR, root)
    path = root / "index" / "tenure-beliefs.json"
    body = json.loads(path.read_text())
    body["version"] += 1
    body["template"]["settings"]["number_of_shards"] = 4
    path.write_text(json.dumps(body))
    return path


def _deploy_v1_with(settings: Settings, client: OpenSearch, beliefs: list[Belief]) -> BeliefStore:
    assert _run(settings, "apply-templates")[0] == 0
    store = BeliefStore(client, settings.opensearch_namespace)
    store.put_many(beliefs, refresh="true")
    return store


def test_reindex_upgrades_the_template_moves_the_alias_and_keeps_every_document(
    ns_settings: Settings, os_client: OpenSearch, version_two: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = BELIEFS.alias(ns_settings.opensearch_namespace)
    beliefs = _beliefs(40)
    store = _deploy_v1_with(ns_settings, os_client, beliefs)
    monkeypatch.setattr(templates, "TEMPLATE_DIR", version_two.parents[1])  # release version 2

    code, result, err = _run(ns_settings, "reindex", "beliefs")
    assert code == 0, err
    assert result["source"] == [f"{alias}-000001"] and result["target"] == f"{alias}-000002"
    assert result["documents"] == {"source": 40, "target": 40}
    released = json.loads(version_two.read_text())["version"]
    assert result["template"] == f"{alias}-v{released}"
    assert _aliases(os_client, alias) == [f"{alias}-000002"]
    assert os_client.indices.exists_index_template(name=f"{alias}-v{released}")
    assert not os_client.indices.exists_index_template(name=f"{alias}-v{released - 1}")
    index_settings = os_client.indices.get_settings(index=f"{alias}-000002")[f"{alias}-000002"]["settings"]["index"]
    assert index_settings["number_of_shards"] == "4"
    assert segments_per_shard(os_client, f"{alias}-000002") <= 1  # merged before the swap
    for belief in beliefs:  # routed by tenant: each is found through its own tenant's principal
        assert store.get(principal(belief.tenant_id, "u1"), belief.id).canonical_name == belief.canonical_name
    # the old generation is kept for rollback but takes no more writes
    with pytest.raises(os_exc.AuthorizationException):
        os_client.index(index=f"{alias}-000001", body={"tenant_id": "t0"}, routing="t0")
    store.put(_beliefs(41)[-1], refresh="true")  # writes go to the new generation
    assert os_client.count(index=f"{alias}-000002")["count"] == 41

    code, merged, err = _run(ns_settings, "merge-segments", "beliefs")
    assert code == 0, err
    assert merged["index"] == alias and merged["segments_per_shard_after"] <= 1

    code, result, err = _run(ns_settings, "reindex", "beliefs", "--delete-old")
    assert code == 0, err
    assert result["target"] == f"{alias}-000003" and result["documents"] == {"source": 41, "target": 41}
    assert result["old_generation"] == "deleted"
    assert not os_client.indices.exists(index=f"{alias}-000002")
    assert _aliases(os_client, alias) == [f"{alias}-000003"]


def test_a_failed_copy_leaves_the_alias_and_writes_as_they_were(
    ns_settings: Settings, os_client: OpenSearch, version_two: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = BELIEFS.alias(ns_settings.opensearch_namespace)
    store = _deploy_v1_with(ns_settings, os_client, _beliefs(5))
    body = json.loads(version_two.read_text())
    # a mapping no existing belief fits: every copied document is rejected
    body["template"]["mappings"] = {"properties": {"confidence": {"type": "boolean"}}}
    version_two.write_text(json.dumps(body))
    monkeypatch.setattr(templates, "TEMPLATE_DIR", version_two.parents[1])

    code, result, err = _run(ns_settings, "reindex", "beliefs")
    assert code == 1 and result is None
    assert json.loads(err)["error"]["code"] == "reindex_failed"
    assert _aliases(os_client, alias) == [f"{alias}-000001"]
    assert not os_client.indices.exists(index=f"{alias}-000002")
    store.put(_beliefs(6)[-1], refresh="true")  # the write block was lifted again
    assert os_client.count(index=alias)["count"] == 6


def test_reindex_rejects_an_unknown_family(ns_settings: Settings) -> None:
    code, _, err = _run(ns_settings, "reindex", "belief")
    assert code == 1 and "unknown index family" in json.loads(err)["error"]["message"]


def test_move_change_logs_moves_inline_logs_out_once(ns_settings: Settings, os_client: OpenSearch) -> None:
    """``tenure move-change-logs``: a belief stored with its log inline (before the logs had their
    own index) keeps its history and loses the inline copy; a second run has nothing to move."""
    ns = ns_settings.opensearch_namespace
    assert _run(ns_settings, "apply-templates")[0] == 0
    store = BeliefStore(os_client, ns)
    belief = Belief.model_validate(
        {
            "id": "b-inline",
            "tenant_id": "t-ops",
            "owner_id": "ana",
            "type": "decision",
            "canonical_name": "inline_history",
            "content": "Kept its history inside its document.",
            "why_it_matters": "Read it before changing it.",
            "scope": ["domain:code"],
            "change_log": [{"changed_at": "2026-11-01T00:00:00Z", "trigger": "created", "actor": "ana"}],
        }
    )
    os_client.index(
        index=BELIEFS.alias(ns), id="t-ops:b-inline", routing="t-ops", body=belief.to_document(), refresh=True
    )

    code, first, err = _run(ns_settings, "move-change-logs")
    assert code == 0, err
    assert (first["scanned"], first["moved"], first["unreadable"]) == (1, 1, [])
    stored = os_client.get(index=BELIEFS.alias(ns), id="t-ops:b-inline", routing="t-ops")["_source"]
    assert "change_log" not in stored and stored["change_log_ref"]
    assert store.get(principal("t-ops", "ana"), "b-inline").change_log == belief.change_log

    os_client.indices.refresh(index=BELIEFS.alias(ns))
    code, second, err = _run(ns_settings, "move-change-logs", "--tenant", "t-ops")
    assert code == 0, err
    assert (second["scanned"], second["moved"]) == (1, 0)
