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


FILTER_TYPES = re.compile(r"\b(AccessFilters|MaintenanceScan)\(")


def test_access_filters_are_built_only_in_the_chokepoint() -> None:
    """The storage boundary is a type: only access.py makes AccessFilters / MaintenanceScan
    (and they refuse to be made anywhere else at run time)."""
    import pytest

    from service.storage.access import AccessFilters, MaintenanceScan

    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers", "evals", "benchmarks")
        if p.name != "access.py" and FILTER_TYPES.search(p.read_text())
    ]
    assert offenders == []
    with pytest.raises(TypeError, match="chokepoint"):
        AccessFilters({"match_all": {}}, (), "t1")
    with pytest.raises(TypeError, match="maintenance_scan"):
        MaintenanceScan("anything", ())


def test_every_query_builder_requires_the_access_filters() -> None:
    """Each body builder in service/storage/queries.py takes the chokepoint's AccessFilters as its
    first parameter (mypy then refuses a call with a hand-made list of clauses)."""
    import inspect

    from service.storage import queries
    from service.storage.access import AccessFilters

    builders = {
        name: fn
        for name, fn in vars(queries).items()
        if name.endswith("_body") and inspect.isfunction(fn) and fn.__module__ == queries.__name__
    }
    assert {"relevant_body", "pinned_body", "open_questions_body", "persona_body", "by_ids_body", "list_body"} <= set(
        builders
    )
    for name, fn in builders.items():
        first = next(iter(inspect.signature(fn, eval_str=True).parameters.values()))
        assert first.annotation is AccessFilters, name


STATUS_HANDLING = re.compile(r"""status(_code)?["')\]]*\s*(==|!=)\s*40[49]\b|\b(NotFoundError|ConflictError)\b""")


def test_store_404_and_409_are_mapped_only_in_storage_client() -> None:
    """opensearch-py's 404/409 become NotFound/Conflict in one place (storage/client.py:
    translate_errors, already_exists); nothing else compares an OpenSearch status."""
    mapped_here = ROOT / "service" / "storage" / "client.py"
    # the API's opensearch-py handlers are a status-blind safety net (anything untranslated is a
    # 503); its 404 is Starlette's "no route"
    http_errors = ROOT / "service" / "api" / "errors.py"
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers")
        if p not in (mapped_here, http_errors) and STATUS_HANDLING.search(p.read_text())
    ]
    assert offenders == []


SDK_ROUTE = re.compile(r"""["']/v1/(recall|beliefs|admin|turns|whoami)\b""")
# http_scale_bench: pre-encoded JSONL import bodies (the SDK encodes records itself; re-encoding
# 5,000-record bodies inside the timed import would change what the ingest benchmark measures).
# recall_cost_split: the API's own cost per request, so its latencies carry no client library
# (the SDK's httpx stack costs ~1 ms of CPU per call on the same two cores).
HAND_BUILT_ALLOWED = {
    "benchmarks/http_scale_bench.py": "/v1/beliefs/import",
    "benchmarks/recall_cost_split.py": "/v1/recall",
}


def test_tools_reach_the_api_through_the_sdk() -> None:
    """The evals, the load test and the benchmarks call the routes the Python SDK covers (recall,
    beliefs, turns, admin) through ``tenure_client`` (issue 13), not through a private HTTP client;
    the proxy's chat routes (the SDK only points an OpenAI client at them) are not covered."""
    offenders = []
    for path in _sources("evals", "loadtest", "benchmarks"):
        name = str(path.relative_to(ROOT))
        allowed = HAND_BUILT_ALLOWED.get(name)
        for match in SDK_ROUTE.finditer(path.read_text()):
            line = path.read_text()[match.start() :].splitlines()[0]
            if allowed and allowed in line:
                continue
            offenders.append(f"{name}: {line.strip()}")
    assert offenders == []


ACCOUNT_WRITES = re.compile(
    r"\bindex_routed\b|\bclient\.(index|update|delete|bulk|create|delete_by_query|update_by_query)\b"
)


def test_every_account_write_bumps_the_accounts_version() -> None:
    """Cached credentials are trusted while their tenant's accounts version is unchanged
    (service/auth/authenticator.py), so no write of an account record may skip the bump: in
    service/storage/accounts.py (the only module that names the accounts alias) every write call
    sits inside ``with self._changing(...)``; the one exception is ``touch_keys`` (last_used_at,
    which no credential check reads)."""
    import ast

    path = ROOT / "service" / "storage" / "accounts.py"
    tree = ast.parse(path.read_text())
    store = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AccountStore")
    unbumped: list[str] = []
    writes = 0
    for method in (n for n in store.body if isinstance(n, ast.FunctionDef)):
        guarded: set[int] = set()
        for node in ast.walk(method):
            if isinstance(node, ast.With) and any(
                "self._changing(" in ast.unparse(item.context_expr) for item in node.items
            ):
                guarded.update(id(inner) for inner in ast.walk(node))
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and ACCOUNT_WRITES.search(ast.unparse(node.func)):
                writes += 1
                if id(node) not in guarded and method.name != "touch_keys":
                    unbumped.append(f"{method.name}: {ast.unparse(node.func)}")
    assert writes >= 2 and unbumped == []
    naming = [
        str(p.relative_to(ROOT))
        for p in _sources("service", "workers")
        if p != path and re.search(r"\bACCOUNTS\.alias\(", p.read_text())
    ]
    assert naming == []
