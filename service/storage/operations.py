"""Operator actions on whole index families (``tenure apply-templates``, ``tenure reindex``).

- :func:`apply_all` puts every template a deployment needs and makes sure each family's alias
  exists; run once per deploy (the compose ``templates`` service) before the API and workers start.
- :func:`upgrade_family` moves a family to the next generation: the current templates, a new
  concrete index ``<alias>-NNNNNN``, a reindex of every document, a count check, then one atomic
  alias swap. With ``block_writes`` (the default) the old generation is write-blocked for the copy,
  so no write can land where the copy has already passed and be lost; writers get a retryable 503
  meanwhile. Without it, writes made during the copy may be missing from the new generation.
  The new generation is force-merged before the swap (nothing writes to it yet).
- :func:`merge_segments` force-merges a family's live generation (``tenure merge-segments``,
  and the beat task ``beliefs.merge_segments`` after bulk imports, :func:`merge_if_fragmented`).

Why merge: a search visits every segment of the routed shard, so recall's query CPU grows with the
segment count. Measured for issue 16 (docs/benchmarks.md, docs/operations.md): ``_msearch`` of the
four recall tiers 8.1 ms -> 4.4 ms of OpenSearch CPU after a force-merge, same results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opensearchpy import OpenSearch

from service.storage import templates
from service.storage.templates import (
    FAMILIES,
    IndexFamily,
    apply_templates,
    component_name,
    index_template_name,
)
from service.storage.vocabulary import store_units

_POLL_S = 0.5


class UpgradeError(RuntimeError):
    """The upgrade stopped before the alias moved: the old generation still serves everything."""


def family_by_name(name: str) -> IndexFamily:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown index family {name!r}; one of {[f.name for f in FAMILIES]}")


def generations(client: OpenSearch, family: IndexFamily, namespace: str) -> list[str]:
    """The concrete indices behind the family's alias, oldest first."""
    return sorted(client.indices.get_alias(name=family.alias(namespace)).keys())


def _generation_number(index: str) -> int:
    return int(index.rsplit("-", 1)[1])


def apply_all(client: OpenSearch, namespace: str) -> dict[str, Any]:
    """Templates and aliases for every family of a deployment; idempotent."""
    removed = apply_templates(client, namespace, FAMILIES)
    components = sorted((templates.TEMPLATE_DIR / "component").glob("*.json"))
    return {
        "namespace": namespace,
        "component_templates": [component_name(p.stem) for p in components],
        "index_templates": [index_template_name(f, namespace) for f in FAMILIES],
        "removed_stale_index_templates": removed,
        "aliases": {f.alias(namespace): generations(client, f, namespace) for f in FAMILIES},
    }


@dataclass
class UpgradeResult:
    family: str
    alias: str
    template: str
    source: list[str]
    target: str
    documents: dict[str, int] = field(default_factory=dict)
    old_generation: str = "kept"
    took_s: float = 0.0
    units_stored: int = 0  # beliefs: documents given their vocabulary units (service/storage/vocabulary.py)


def _count(client: OpenSearch, index: str) -> int:
    client.indices.refresh(index=index)
    return int(client.count(index=index)["count"])


def _set_write_block(client: OpenSearch, indices: list[str], blocked: bool) -> None:
    client.indices.put_settings(index=",".join(indices), body={"index": {"blocks": {"write": blocked}}})


def _copy(client: OpenSearch, source: list[str], target: str) -> dict[str, Any]:
    """Reindex as a background task and poll it: a large family takes longer than any HTTP timeout.
    ``_routing`` is kept, so routed beliefs stay on their tenant's shard."""
    body = {"source": {"index": ",".join(source)}, "dest": {"index": target}}
    task_id = client.reindex(body=body, wait_for_completion=False)["task"]
    task = client.tasks.get(task_id=task_id)
    while not task.get("completed"):
        time.sleep(_POLL_S)
        task = client.tasks.get(task_id=task_id)
    if task.get("error"):
        raise UpgradeError(f"reindex task {task_id} failed: {task['error']}")
    response: dict[str, Any] = task.get("response", {})
    if response.get("failures"):
        raise UpgradeError(f"reindex into {target} had failures: {response['failures'][:3]}")
    return response


def segments_per_shard(client: OpenSearch, index: str) -> float:
    """Searchable segments per primary shard of ``index`` (an alias or concrete indices)."""
    rows = client.cat.segments(index=index, format="json", h="shard,prirep,searchable")
    primaries = [r for r in rows if r.get("prirep") == "p" and str(r.get("searchable")) == "true"]
    shards = {r["shard"] for r in primaries}
    return len(primaries) / len(shards) if shards else 0.0


def merge_segments(client: OpenSearch, index: str, *, max_num_segments: int = 1) -> dict[str, Any]:
    """Force-merge ``index`` down to ``max_num_segments`` per shard (I/O heavy, minutes at millions
    of documents: a reindex, a bulk import or a quiet hour). Searches keep running meanwhile."""
    before = segments_per_shard(client, index)
    started = time.monotonic()
    client.indices.forcemerge(index=index, max_num_segments=max_num_segments, request_timeout=3600)
    client.indices.refresh(index=index, request_timeout=600)
    return {
        "index": index,
        "segments_per_shard_before": round(before, 1),
        "segments_per_shard_after": round(segments_per_shard(client, index), 1),
        "took_s": round(time.monotonic() - started, 3),
    }


def merge_if_fragmented(client: OpenSearch, index: str, *, above: float) -> dict[str, Any] | None:
    """:func:`merge_segments` when ``index`` has more than ``above`` segments per shard (what a bulk
    import leaves behind); None otherwise. Idempotent: a merged index is left alone."""
    if segments_per_shard(client, index) <= above:
        return None
    return merge_segments(client, index)


def _swap(client: OpenSearch, alias: str, source: list[str], target: str) -> None:
    actions: list[dict[str, Any]] = [{"remove": {"index": i, "alias": alias}} for i in source]
    actions.append({"add": {"index": target, "alias": alias, "is_write_index": True}})
    client.indices.update_aliases(body={"actions": actions})


def _abort(client: OpenSearch, source: list[str], target: str, block_writes: bool) -> None:
    """Undo a failed upgrade: the alias never moved, so drop the partial copy and reopen writes."""
    client.indices.delete(index=target, ignore=[404])
    if block_writes:
        _set_write_block(client, source, False)


def upgrade_family(
    client: OpenSearch, namespace: str, family: IndexFamily, *, block_writes: bool = True, delete_old: bool = False
) -> UpgradeResult:
    """Current templates, then every document of the family copied into generation N+1 behind the alias."""
    started = time.monotonic()
    apply_templates(client, namespace, (family,))
    alias = family.alias(namespace)
    source = generations(client, family, namespace)
    target = family.concrete(namespace, max(_generation_number(i) for i in source) + 1)
    if client.indices.exists(index=target):
        raise UpgradeError(f"{target} already exists (a previous run stopped?); inspect it and delete it first")
    result = UpgradeResult(family.name, alias, index_template_name(family, namespace), source, target)
    if block_writes:
        _set_write_block(client, source, True)
    try:
        client.indices.create(index=target)  # shaped by the current index template
        client.cluster.health(index=target, wait_for_status="yellow", request_timeout=60)
        # the copy reads what a search sees: refreshed first, or it would miss what was written
        # since the last refresh (the audit index refreshes only every 30 s)
        client.indices.refresh(index=",".join(source), request_timeout=600)
        _copy(client, source, target)
        if family is templates.BELIEFS:
            # the analysed units are not in _source, so the copy has none: stored again from the
            # new generation's own analyzers before anything reads it
            result.units_stored = store_units(client, target)
        result.documents = {"source": sum(_count(client, i) for i in source), "target": _count(client, target)}
        if block_writes and result.documents["source"] != result.documents["target"]:
            raise UpgradeError(f"document counts differ after the copy: {result.documents}")
        merge_segments(client, target)  # no writer yet: one segment per shard serves fastest
        _swap(client, alias, source, target)
    except Exception:
        _abort(client, source, target, block_writes)
        raise
    if delete_old:
        client.indices.delete(index=",".join(source))
        result.old_generation = "deleted"
    elif block_writes:
        result.old_generation = "kept, write-blocked (rollback: move the alias back and clear index.blocks.write)"
    result.took_s = round(time.monotonic() - started, 3)
    return result
