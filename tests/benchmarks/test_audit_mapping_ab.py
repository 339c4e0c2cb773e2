"""benchmarks/audit_mapping_ab.py: its two arms' mappings, and a short run that leaves nothing behind."""

from __future__ import annotations

import os
import uuid
from argparse import Namespace

from opensearchpy import OpenSearch

from benchmarks.audit_mapping_ab import ARMS, arm_mapping, create_arms, drain_pass, store_bytes
from service.storage.templates import AUDIT, expected_mapping, has_doc_values


def _with_doc_values(mapping: dict[str, object]) -> set[str]:
    properties = mapping["properties"]
    assert isinstance(properties, dict)
    return {name for name, spec in properties.items() if spec.get("type") == "keyword" and has_doc_values(spec)}


def test_one_arm_is_the_template_and_the_other_has_doc_values_on_every_keyword() -> None:
    assert arm_mapping("template") == expected_mapping(AUDIT)
    everywhere = arm_mapping("doc_values_everywhere")
    assert _with_doc_values(arm_mapping("template")) < _with_doc_values(everywhere)
    keywords = {n for n, s in everywhere["properties"].items() if s.get("type") == "keyword"}
    assert _with_doc_values(everywhere) == keywords
    assert _with_doc_values(expected_mapping(AUDIT)) != keywords  # the template itself was not changed


def test_a_short_pass_drains_into_each_arm(os_client: OpenSearch) -> None:
    indices = create_arms(os_client, f"bench-audit-mapping-{uuid.uuid4().hex[:6]}")
    try:
        args = Namespace(opensearch_pid=os.getpid(), seconds=2, events=20)
        for arm in ARMS:
            row = drain_pass(os_client, indices[arm], args)
            assert set(row) == {"node_cpu_ms_per_s", "bulk_took_median_ms"}
            assert os_client.count(index=indices[arm])["count"] == 40  # every receipt taken by the strict mapping
            assert store_bytes(os_client, indices[arm]) > 0
    finally:
        for index in indices.values():
            os_client.indices.delete(index=index, ignore_unavailable=True)
