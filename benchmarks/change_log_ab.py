"""Recall's searches on two copies of the beliefs index that differ only in the beliefs' change logs.

A belief keeps its history in its own document: one change-log entry when it is created, one per
reinforcement, edit or promotion, up to ``MAX_CHANGE_LOG`` (200). Recall never returns the change
log. Still, OpenSearch reads the whole stored source of every hit, parses it, and filters the log
out (``_source.excludes``). The benchmark corpus is generated with empty change logs, so its
figures show recall as if no belief had a history. This measures what the history costs recall:

1. Index B is made as a copy of index A (the namespace's index, same settings and mappings,
   every document with its routing and vocabulary units). Every
   belief gets a change log shaped like the ones extraction writes (``ChangeLogEntry``: a
   "created" entry, then "reinforced" ones, each with its own session and turn ids). Its length
   is ``--entries reinforced`` (1 + the belief's ``reinforcement_count``, the history the corpus
   implies) or a fixed number (``--entries 200``: every belief at the cap, the worst case).
   ``--placement`` says where the copy keeps it: ``inline`` in the belief document (as before the
   log moved out), ``apart`` in a log document of its own (``<copy>-apart-logs``, the
   ``belief-logs`` family's mapping) named by the belief's ``change_log_ref``, as the service
   stores it now (service/storage/change_logs.py); ``inline,apart`` makes both copies.
2. The searches of ``--queries`` recalls through the real API (``index_order_ab``) are replayed
   raw on A and each copy in alternating rounds, with the node's CPU per search. The hits of every
   answer are compared too: the change log must not change an answer.

    .venv/bin/python -m benchmarks.change_log_ab --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --size 100000 --entries 200 --copy change-log-ab --placement inline,apart

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Iterator
from typing import Any

from opensearchpy import OpenSearch, helpers

from benchmarks import index_order_ab, recall_floor
from service.domain.belief import MAX_CHANGE_LOG, ChangeLogEntry
from service.storage.change_logs import REF_FIELD, ChangeLogStore
from service.storage.client import routed_id
from service.storage.templates import BELIEF_LOGS, BELIEFS, expected_mapping
from service.storage.vocabulary import UNITS_FIELD

PLACEMENTS = ("inline", "apart")
CREATED = "created (extraction)"
REINFORCED = "reinforced (extraction)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    recall_floor.add_recording_arguments(parser)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--entries", default="reinforced", help="'reinforced' (1 + reinforcement_count) or a number")
    parser.add_argument("--copy", default="change-log-ab", help="index B's name (deleted first)")
    parser.add_argument(
        "--placement", default="inline", help="inline, apart or inline,apart: where the copies keep the logs"
    )
    parser.add_argument("--opensearch-pid", type=int, default=None, help="for its CPU per search")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.entries != "reinforced" and not 1 <= int(args.entries) <= MAX_CHANGE_LOG:
        parser.error(f"--entries: 'reinforced' or 1..{MAX_CHANGE_LOG}")
    args.placement = [p.strip() for p in args.placement.split(",") if p.strip()]
    if not args.placement or set(args.placement) - set(PLACEMENTS):
        parser.error(f"--placement: one or more of {', '.join(PLACEMENTS)}")
    return args


def entries_for(source: dict[str, Any], entries: str) -> int:
    """How many change-log entries the copy of this belief gets."""
    if entries == "reinforced":
        return min(MAX_CHANGE_LOG, 1 + int(source.get("reinforcement_count") or 0))
    return int(entries)


def _hex(seed: str, length: int) -> str:
    """A stable id-like hex string (ids do not compress like repeated text)."""
    return hashlib.blake2b(seed.encode(), digest_size=length // 2).hexdigest()


def history(source: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` entries as the lifecycle writes them: created, then reinforced, each in its own
    session and turn, in the stored (JSON) form. The model dumps one entry; the others are that
    dump with their own trigger and ids (a model per entry made a copy at the cap take minutes)."""
    belief = str(source["id"])
    entry = ChangeLogEntry(
        changed_at=source.get("last_reinforced_at") or source["created_at"],
        trigger=REINFORCED,
        actor=source.get("owner_id"),
        changed_by_session=f"sess-{_hex(belief, 16)}",
        changed_by_turn=f"turn-{_hex(belief, 32)}",
    ).model_dump(mode="json")
    return [
        {
            **entry,
            "trigger": CREATED if i == 0 else REINFORCED,
            "changed_by_session": f"sess-{_hex(f'{belief}/s{i}', 16)}",
            "changed_by_turn": f"turn-{_hex(f'{belief}/t{i}', 32)}",
        }
        for i in range(count)
    ]


def _copied(client: OpenSearch, source: str, name: str, entries: str, placement: str) -> Iterator[dict[str, Any]]:
    """Each document of ``source`` with its history, and its vocabulary units: the mapping keeps
    them out of ``_source``, so they are read from doc values (without them, a tenant's vocabulary
    would be built from nothing on B). ``apart``: the history as a log document of its own (the
    change-log store's own :meth:`~ChangeLogStore.split`), the belief naming it."""
    query = {"query": {"match_all": {}}, "docvalue_fields": [UNITS_FIELD]}
    for hit in helpers.scan(client, index=source, size=2000, query=query):
        document = hit["_source"]
        document["change_log"] = history(document, entries_for(document, entries))
        if placement == "apart":
            pending = ChangeLogStore.split(document)
            if pending is not None:
                yield {
                    "_index": f"{name}-logs",
                    "_id": routed_id(pending.tenant_id, pending.ref),
                    "_routing": pending.tenant_id,
                    "_source": pending.document,
                }
        units = hit.get("fields", {}).get(UNITS_FIELD)
        if units:
            document[UNITS_FIELD] = units
        yield {"_index": name, "_id": hit["_id"], "_routing": hit.get("_routing"), "_source": document}


def make_logged_copy(
    client: OpenSearch, source: str, name: str, entries: str, placement: str = "inline"
) -> dict[str, Any]:
    """Index ``name``: ``source``'s documents (ids, routing) with change logs of ``entries``, kept
    as ``placement`` says, merged to one segment per shard. Returns how long each step took and
    the store sizes."""
    index_order_ab.create_like(client, source, name)
    if placement == "apart":
        ref = expected_mapping(BELIEFS)["properties"][REF_FIELD]
        client.indices.put_mapping(index=name, body={"properties": {REF_FIELD: ref}})  # an index made before v7
        client.indices.delete(index=f"{name}-logs", ignore=[404])
        client.indices.create(
            index=f"{name}-logs",
            body={
                "settings": {"number_of_shards": 4, "number_of_replicas": 0},
                "mappings": expected_mapping(BELIEF_LOGS),
            },
        )
    started = time.monotonic()
    helpers.bulk(client, _copied(client, source, name, entries, placement), chunk_size=1000, request_timeout=600)
    copied = round(time.monotonic() - started, 1)
    merged = index_order_ab.merge_copy(client, name)
    if placement == "apart":
        client.indices.refresh(index=f"{name}-logs")
    shown = [source, name, *([f"{name}-logs"] if placement == "apart" else [])]
    stats = client.indices.stats(index=",".join(shown), metric="store,docs")["indices"]
    primaries = {index: stats[index]["primaries"] for index in shown}
    return {
        "placement": placement,
        "copy_s": copied,
        "merge_s": merged,
        "docs": {index: held["docs"]["count"] for index, held in primaries.items()},
        "store_mb": {index: round(held["store"]["size_in_bytes"] / 1e6, 1) for index, held in primaries.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenSearch(args.opensearch_url.split(","), timeout=120)
    index_a = index_order_ab.index_behind_alias(client, args.size)
    copies = {
        placement: f"{args.copy}-apart" if placement == "apart" and len(args.placement) > 1 else args.copy
        for placement in args.placement
    }
    made = {
        name: make_logged_copy(client, index_a, name, args.entries, placement) for placement, name in copies.items()
    }
    searches = index_order_ab.recorded_searches(args)
    report = {
        "what": "change_log_ab",
        "index_a": index_a,
        "index_b": args.copy,
        "copies": copies,
        "entries_b": args.entries,
        "copy": made,
        **index_order_ab.replay(args, searches, [index_a, *copies.values()]),
    }
    index_order_ab.write_report(args, argv, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
