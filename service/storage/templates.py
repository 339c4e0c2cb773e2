"""Index templates from ``index_templates/``: applied idempotently, indices behind aliases.

Names (``ns`` is ``settings.opensearch_namespace``):
- component templates ``tenure-<name>-v<version>`` (shared by all namespaces; content-addressed by version).
  An index template file lists its components by file stem (``"composed_of": ["tenure-analysis"]``);
  :func:`index_template_body` adds each component's current ``-v<version>``, so a component's
  version is written once, in its own file.
- index template ``<ns>-beliefs-v<version>`` matching ``<ns>-beliefs-*``
- write alias ``<ns>-beliefs`` -> concrete ``<ns>-beliefs-000001`` (a reindex creates ``-000002`` and swaps)
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy import exceptions as os_exc

from service.errors import NotFound
from service.storage.client import translate_errors

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "index_templates"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexFamily:
    """One family of indices (beliefs, audit, ...) defined by an index template file."""

    name: str

    def alias(self, namespace: str) -> str:
        return f"{namespace}-{self.name}"

    def concrete(self, namespace: str, generation: int = 1) -> str:
        return f"{self.alias(namespace)}-{generation:06d}"


BELIEFS = IndexFamily("beliefs")
AUDIT = IndexFamily("audit")
ACCOUNTS = IndexFamily("accounts")
TURNS = IndexFamily("turns")
REVIEWS = IndexFamily("reviews")
# The beliefs' change logs (service/storage/change_logs.py): written and read with the beliefs, so
# wherever the beliefs family is set up or dropped, this one is too (:func:`with_companions`).
BELIEF_LOGS = IndexFamily("belief-logs")
# The one registry of index families: everything a deployment writes. Start-up, `tenure
# apply-templates`, `tenure reindex`, the template tests and the clean-up of test and drill
# namespaces all iterate this tuple; a new family is added here and in index_templates/index/.
FAMILIES: tuple[IndexFamily, ...] = (BELIEFS, BELIEF_LOGS, AUDIT, ACCOUNTS, TURNS, REVIEWS)
# Families that never exist without another one: a store of beliefs writes their logs.
_COMPANIONS: dict[IndexFamily, tuple[IndexFamily, ...]] = {BELIEFS: (BELIEF_LOGS,)}
# Fields added to a family's mapping after indices of it existed, put on those indices by
# apply_templates: adding a field is a compatible mapping change, so it needs no reindex. Only
# fields whose absence from old documents means "not set" belong here.
ADDED_FIELDS: dict[IndexFamily, tuple[str, ...]] = {
    BELIEFS: ("change_log_ref",),
    TURNS: ("credential", "credential_id"),
}
# Families whose template changed its refresh interval, with the intervals earlier templates left
# on their indices (None: no interval set). apply_templates moves an index still at one of them to
# the template's own interval; any other value is an operator's (or a bulk load's -1) and stays.
# The audit index: 1s (v1), unset (v2, a search-idle shard), 30s since v3.
SUPERSEDED_REFRESH: dict[IndexFamily, tuple[str | None, ...]] = {AUDIT: ("1s", None)}


def with_companions(families: tuple[IndexFamily, ...]) -> tuple[IndexFamily, ...]:
    """``families`` plus the families that go with them, each once, in order."""
    out: list[IndexFamily] = []
    for family in families:
        for one in (family, *_COMPANIONS.get(family, ())):
            if one not in out:
                out.append(one)
    return tuple(out)


def load_json(relative: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TEMPLATE_DIR / relative).read_text())
    return data


def component_name(file_stem: str) -> str:
    return f"{file_stem}-v{load_json(f'component/{file_stem}.json')['version']}"


def component_stems(family: IndexFamily) -> list[str]:
    """The component templates of ``family``'s index template, by file stem, in order."""
    return list(load_json(f"index/tenure-{family.name}.json")["composed_of"])


def template_settings(family: IndexFamily) -> dict[str, Any]:
    """The index settings the family's index template sets (as versioned in index_templates/)."""
    settings: dict[str, Any] = load_json(f"index/tenure-{family.name}.json")["template"].get("settings", {})
    return settings


def index_template_body(family: IndexFamily, namespace: str) -> dict[str, Any]:
    """The index template as put: the namespace in its patterns, each component by versioned name."""
    body = load_json(f"index/tenure-{family.name}.json")
    body["index_patterns"] = [p.replace("{namespace}", namespace) for p in body["index_patterns"]]
    body["composed_of"] = [component_name(stem) for stem in body["composed_of"]]
    return body


def expected_mapping(family: IndexFamily) -> dict[str, Any]:
    """The mapping an index of ``family`` must have: the union of its component templates."""
    properties: dict[str, Any] = {}
    dynamic: Any = None
    source: Any = None
    for stem in component_stems(family):
        mappings = load_json(f"component/{stem}.json")["template"].get("mappings", {})
        properties.update(mappings.get("properties", {}))
        dynamic = mappings.get("dynamic", dynamic)
        source = mappings.get("_source", source)
    out: dict[str, Any] = {"properties": properties}
    if dynamic is not None:
        out["dynamic"] = dynamic
    if source is not None:
        out["_source"] = source
    return out


# Template puts and index creation are cluster-state updates: the cluster manager answers within
# its own 30 s timeout. The client waits longer than that (not the 10 s request default), so on a
# busy or multi-node cluster the server's answer decides, not a client-side read timeout.
ADMIN_TIMEOUT_S = 60


def apply_templates(client: OpenSearch, namespace: str, families: tuple[IndexFamily, ...] = (BELIEFS,)) -> list[str]:
    """Put component and index templates (older versions of a family's index template removed
    first), then make sure each family's alias exists.

    Safe to run on every start-up and from several processes at once. Returns the names of the
    stale index templates it removed.
    """
    removed: list[str] = []
    families = with_companions(families)
    for path in sorted((TEMPLATE_DIR / "component").glob("*.json")):
        client.cluster.put_component_template(
            name=component_name(path.stem), body=load_json(f"component/{path.name}"), request_timeout=ADMIN_TIMEOUT_S
        )
    for family in families:
        removed += remove_stale_index_templates(client, family, namespace)
        client.indices.put_index_template(
            name=index_template_name(family, namespace),
            body=index_template_body(family, namespace),
            request_timeout=ADMIN_TIMEOUT_S,
        )
        ensure_alias(client, family, namespace)
        add_new_fields(client, family, namespace)
        apply_merge_policy(client, family, namespace)
        upgrade_refresh_interval(client, family, namespace)
        for index, fields in doc_values_drift(client, family, namespace).items():
            log.warning(
                "%s keeps doc values unlike its template on %s (an older template made it): `tenure reindex %s` "
                "rebuilds it with the template's mapping (docs/operations.md, index upgrades)",
                index,
                ", ".join(fields),
                family.name,
            )
        for index in unsorted_indices(client, family, namespace):
            log.warning(
                "%s is not sorted like its template (index.sort.field %s): recall reads it more slowly "
                'until `tenure reindex %s` (docs/operations.md, "Beliefs sorted by tenant")',
                index,
                index_sort(family),
                family.name,
            )
    return removed


def add_new_fields(client: OpenSearch, family: IndexFamily, namespace: str) -> None:
    """Put the family's :data:`ADDED_FIELDS` on the indices behind its alias (idempotent: the same
    mapping again is a no-op), so an index created by an older template accepts documents that
    carry them."""
    names = ADDED_FIELDS.get(family, ())
    if not names:
        return
    properties = expected_mapping(family)["properties"]
    client.indices.put_mapping(
        index=family.alias(namespace),
        body={"properties": {name: properties[name] for name in names}},
        request_timeout=ADMIN_TIMEOUT_S,
    )


def merge_policy(family: IndexFamily) -> dict[str, Any]:
    """The family's ``merge`` settings from its index template file (empty: OpenSearch's defaults)."""
    settings = template_settings(family)
    policy: dict[str, Any] = settings.get("merge", {})
    return policy


def apply_merge_policy(client: OpenSearch, family: IndexFamily, namespace: str) -> None:
    """Put the template's merge policy on the indices behind the family's alias too (a template
    only shapes indices created later, and the policy is dynamic): idempotent, the same values on
    every start-up. The refresh interval is not re-put: a bulk load or reindex may have switched
    it off for a while, and the template's value is what the index was created with."""
    policy = merge_policy(family)
    if policy:
        client.indices.put_settings(
            index=family.alias(namespace), body={"index": {"merge": policy}}, request_timeout=ADMIN_TIMEOUT_S
        )


def template_refresh_interval(family: IndexFamily) -> str | None:
    """The refresh interval the family's index template sets (None: OpenSearch's default)."""
    settings = template_settings(family)
    interval: str | None = settings.get("refresh_interval")
    return interval


def upgrade_refresh_interval(client: OpenSearch, family: IndexFamily, namespace: str) -> list[str]:
    """Move the family's indices still at an interval an earlier template set
    (:data:`SUPERSEDED_REFRESH`) to the template's own; idempotent. Returns the indices changed."""
    superseded = SUPERSEDED_REFRESH.get(family)
    if superseded is None:
        return []
    wanted = template_refresh_interval(family)
    alias = family.alias(namespace)
    indices = client.indices.get_alias(name=alias, request_timeout=ADMIN_TIMEOUT_S)
    # an index without an explicit interval is left out of this answer
    live = client.indices.get_settings(index=alias, name="index.refresh_interval", request_timeout=ADMIN_TIMEOUT_S)
    stale = sorted(
        index
        for index in indices
        if live.get(index, {}).get("settings", {}).get("index", {}).get("refresh_interval") in superseded
    )
    if stale:
        client.indices.put_settings(
            index=",".join(stale), body={"index": {"refresh_interval": wanted}}, request_timeout=ADMIN_TIMEOUT_S
        )
        log.info("%s: refresh interval moved to the template's %s", ", ".join(stale), wanted or "default")
    return stale


def index_sort(family: IndexFamily) -> list[str]:
    """The fields the family's template sorts its indices by (empty: unsorted)."""
    settings = template_settings(family)
    fields: list[str] = settings.get("sort", {}).get("field", [])
    return fields


def unsorted_indices(client: OpenSearch, family: IndexFamily, namespace: str) -> list[str]:
    """The indices behind the family's alias whose index sort is not the template's. The sort is a
    static setting, fixed when an index is created: an index made before the template had it
    keeps its order until a reindex into the next generation (which the current template shapes)."""
    wanted = index_sort(family)
    alias = family.alias(namespace)
    indices = client.indices.get_alias(name=alias, request_timeout=ADMIN_TIMEOUT_S)
    # an index without the setting is left out of this answer, not listed empty
    live = client.indices.get_settings(index=alias, name="index.sort.field", request_timeout=ADMIN_TIMEOUT_S)
    return sorted(
        index
        for index in indices
        if _as_list(live.get(index, {}).get("settings", {}).get("index", {}).get("sort", {}).get("field")) != wanted
    )


def doc_values_drift(client: OpenSearch, family: IndexFamily, namespace: str) -> dict[str, list[str]]:
    """Per index behind the family's alias, the fields whose doc values differ from the template's.
    Doc values are fixed when an index is created (audit template v4 dropped them from the fields
    reads only filter on): an older index keeps them, correct but bigger, until a reindex."""
    wanted = expected_mapping(family)["properties"]
    live = client.indices.get_mapping(index=family.alias(namespace), request_timeout=ADMIN_TIMEOUT_S)
    drift: dict[str, list[str]] = {}
    for index, body in sorted(live.items()):
        properties = body.get("mappings", {}).get("properties", {})
        fields = sorted(
            name
            for name, spec in wanted.items()
            if name in properties and has_doc_values(properties[name]) != has_doc_values(spec)
        )
        if fields:
            drift[index] = fields
    return drift


def has_doc_values(spec: dict[str, Any]) -> bool:
    """A field mapping's doc values as OpenSearch reads it: on unless the mapping says false (the
    mapping API echoes the booleans it was given, possibly as strings)."""
    return str(spec.get("doc_values", True)).lower() != "false"


def _as_list(value: Any) -> list[str]:
    """A list setting as OpenSearch echoes it: a list, one string for a single value, or absent."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def index_template_name(family: IndexFamily, namespace: str) -> str:
    return f"{family.alias(namespace)}-v{load_json(f'index/tenure-{family.name}.json')['version']}"


def remove_stale_index_templates(client: OpenSearch, family: IndexFamily, namespace: str) -> list[str]:
    """Delete older versions of the family's index template. Two versions share the index pattern
    and priority, which OpenSearch refuses, so a version bump could never be put otherwise.
    Existing indices keep their mappings: a template only shapes indices created later."""
    current = index_template_name(family, namespace)
    own = re.compile(rf"^{re.escape(family.alias(namespace))}-v\d+$")
    try:
        with translate_errors("list index templates", on_missing="no index template yet"):
            listed = client.indices.get_index_template(name=f"{family.alias(namespace)}-v*")
    except NotFound:
        return []
    stale = [t["name"] for t in listed.get("index_templates", []) if own.match(t["name"]) and t["name"] != current]
    for name in stale:
        # another process may be first
        client.indices.delete_index_template(name=name, ignore=[404], request_timeout=ADMIN_TIMEOUT_S)
    return stale


def ensure_alias(client: OpenSearch, family: IndexFamily, namespace: str) -> str:
    alias = family.alias(namespace)
    if client.indices.exists_alias(name=alias):
        return alias
    index = family.concrete(namespace)
    try:
        client.indices.create(
            index=index, body={"aliases": {alias: {"is_write_index": True}}}, request_timeout=ADMIN_TIMEOUT_S
        )
    except os_exc.RequestError as exc:
        if "resource_already_exists_exception" not in str(exc.error):
            raise
    client.cluster.health(index=index, wait_for_status="yellow", request_timeout=35)
    return alias


def drop_namespace(client: OpenSearch, namespace: str, families: tuple[IndexFamily, ...] = (BELIEFS,)) -> None:
    """Delete a namespace's indices and index templates (tests and eval runs only)."""
    for family in with_companions(families):
        client.indices.delete(index=f"{family.alias(namespace)}-*", ignore=[404])
        client.indices.delete_index_template(name=index_template_name(family, namespace), ignore=[404])
