"""``tenure move-change-logs`` (``move_inline_logs``) over a corpus whose beliefs still keep their
change logs inline, against a running node.

After upgrading, beliefs written before the change log moved out keep it in their document until
their next write or this one-time command. It builds a throw-away namespace of ``--size`` beliefs
of the benchmark corpus (``recall_bench.belief_at``) over ``--tenants`` tenants, each with
``--entries`` change-log entries inline, as the service wrote them before; then runs the move
(every belief rewritten with a compare-and-set, its log document first) and runs it again (it must
move nothing). It prints each run's counts, wall time, beliefs moved per second and the node's CPU
(``/proc`` of ``--opensearch-pid``), checks that a sample of moved beliefs reads back with its whole
history, and drops the namespace.

    .venv/bin/python -m benchmarks.move_change_logs --opensearch-url $OS --opensearch-pid $OS_PID --size 100000

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from opensearchpy import OpenSearch

from benchmarks import scratch_namespace
from benchmarks.recall_bench import Spec, belief_at
from service.domain.belief import Belief, ChangeLogEntry
from service.domain.principal import Principal
from service.storage.beliefs import BeliefStore, move_inline_logs
from service.storage.client import routed_id
from service.storage.templates import BELIEFS

SAMPLE = 50  # beliefs read back after the move, with their history


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    scratch_namespace.add_arguments(
        parser, size=100_000, size_help="beliefs with an inline change log", namespace="move-bench"
    )
    parser.add_argument("--entries", type=int, default=20, help="change-log entries per belief")
    return parser.parse_args(argv)


def _with_log(i: int, args: argparse.Namespace, now: datetime) -> Belief:
    belief = belief_at(i, Spec(tenants=args.tenants), now)
    belief.change_log = [
        ChangeLogEntry(changed_at=now - timedelta(minutes=n), trigger="reinforced (extraction)", actor=belief.owner_id)
        for n in range(args.entries)
    ]
    return belief


def _documents(args: argparse.Namespace, now: datetime) -> Iterator[dict[str, Any]]:
    alias = BELIEFS.alias(args.namespace)
    for i in range(args.size):
        belief = _with_log(i, args, now)
        # as written before the log moved out: Belief.to_document keeps the log in the document
        yield {
            "_index": alias,
            "_id": routed_id(belief.tenant_id, belief.id),
            "_routing": belief.tenant_id,
            "_source": belief.to_document(),
        }


def _load(client: OpenSearch, args: argparse.Namespace, now: datetime) -> float:
    return scratch_namespace.bulk_load(
        client, [BELIEFS.alias(args.namespace)], _documents(args, now), chunk_size=2000, merge=False
    )


def _histories_intact(store: BeliefStore, args: argparse.Namespace, now: datetime) -> bool:
    """A sample of the moved beliefs read by id (their log fetched from its own document) carry the
    history they had inline, and their documents no longer hold it."""
    for i in range(0, args.size, max(1, args.size // SAMPLE)):
        expected = _with_log(i, args, now)
        projects = frozenset(f"p{k}" for k in range(Spec().projects_per_tenant))
        reader = Principal(tenant_id=expected.tenant_id, user_id=expected.owner_id, projects=projects)
        loaded = store.get(reader, expected.id)
        key = routed_id(expected.tenant_id, expected.id)
        raw = store.client.get(index=store.alias, id=key, routing=expected.tenant_id)
        if loaded.change_log != expected.change_log or "change_log" in raw["_source"]:
            return False
    return True


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    client = OpenSearch([args.opensearch_url], timeout=300)
    now = datetime.now(UTC).replace(microsecond=0)
    with scratch_namespace.fresh(client, args.namespace):
        result: dict[str, Any] = {
            "beliefs": args.size,
            "tenants": args.tenants,
            "entries": args.entries,
            "load_s": round(_load(client, args, now), 1),
        }
        store = BeliefStore(client, args.namespace)
        for run in (1, 2):
            moved, cost = scratch_namespace.timed(args.opensearch_pid, lambda: move_inline_logs(store))
            per_s = moved.moved / max(cost["wall_s"], 0.1)  # wall_s is rounded to 0.1 s
            result[f"run_{run}"] = {**asdict(moved), **cost, "moved_per_s": round(per_s, 1)}
            client.indices.refresh(index=store.alias)
            print(json.dumps(result), flush=True)
        result["histories_intact"] = _histories_intact(store, args, now)
        print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
