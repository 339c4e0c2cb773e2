"""Structural guards: tenant data is only queried through the storage layer and its chokepoint."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUERY_CALLS = re.compile(r"\bclient\.(search|msearch|count|delete_by_query|update_by_query|scroll)\(")
TENANT_TERM = re.compile(r"""["']term["']\s*:\s*\{\s*["']tenant_id["']""")


def _sources(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in (ROOT / d).rglob("*.py") if p.is_file()]


def test_queries_are_sent_only_from_the_storage_layer() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers")
        if "storage" not in p.parts and QUERY_CALLS.search(p.read_text())
    ]
    assert offenders == []


def test_tenant_filters_are_built_only_in_the_chokepoint() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers")
        if p.name != "access.py" and TENANT_TERM.search(p.read_text())
    ]
    assert offenders == []


BELIEF_WRITES = re.compile(r"\bstore\.(put|put_many|replace)\(|\bdelete_ids\(|\bmutate\(")
ACTION_STRING = re.compile(r"""["'](belief|review|compaction)\.(?!html)[a-z_]+["']""")


def test_belief_state_changes_only_in_the_lifecycle() -> None:
    """service/beliefs/lifecycle.py is the only code that writes a belief document; nothing spells
    a belief/review/compaction audit action outside the vocabulary (service/domain/audit.py)."""
    writers = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers")
        if "storage" not in p.parts and p.name != "lifecycle.py" and BELIEF_WRITES.search(p.read_text())
    ]
    assert writers == []
    spelled = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers")
        if p != ROOT / "service" / "domain" / "audit.py" and ACTION_STRING.search(p.read_text())
    ]
    assert spelled == []
