"""The change-log orphan sweep (``ChangeLogStore.sweep_orphans``, the hourly beat task) over a
large log index, against a running node.

It builds a throw-away namespace of ``--size`` minimal belief documents (tenant, id,
``change_log_ref``) over ``--tenants`` tenants, and their log documents (3 entries each, created an
hour ago, so past the sweep's minimum age), of which ``--orphan-every``-th has no belief naming it.
Then it sweeps twice: the first sweep removes the orphans, the second finds none. A sweep is as
many passes as it takes to reach the last tenant, each resuming after the one before
(``--budget-s``, the beat task's budget; none by default), paced by ``--work-fraction`` (the beat
task's default is 0.25; 1, the default here, measures the sweep's own cost). It prints the load
time and each sweep's passes, wall time, OpenSearch CPU (from ``/proc`` of ``--opensearch-pid``)
and that CPU over the wall time (how many of the node's cores the sweep keeps busy on average),
and drops the namespace.

    .venv/bin/python -m benchmarks.change_log_sweep --opensearch-url $OS --opensearch-pid $OS_PID --size 1000000
    .venv/bin/python -m benchmarks.change_log_sweep ... --work-fraction 0.25 --budget-s 120

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from opensearchpy import OpenSearch

from benchmarks import scratch_namespace
from service.storage.change_logs import ChangeLogStore, SweepPace
from service.storage.client import routed_id
from service.storage.templates import BELIEF_LOGS, BELIEFS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    scratch_namespace.add_arguments(parser, size=1_000_000, size_help="log documents", namespace="sweep-bench")
    parser.add_argument("--orphan-every", type=int, default=100, help="every n-th log has no belief")
    parser.add_argument("--work-fraction", type=float, default=1.0, help="the sweep's pace (SweepPace)")
    parser.add_argument("--budget-s", type=float, default=None, help="each pass's budget (SweepPace)")
    return parser.parse_args(argv)


def _documents(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    beliefs, logs = BELIEFS.alias(args.namespace), BELIEF_LOGS.alias(args.namespace)
    created = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    entries = [
        {"changed_at": created, "trigger": t, "actor": "alice", "note": None}
        for t in ("created", "reinforced", "pinned")
    ]
    for i in range(args.size):
        belief = {"id": f"b{i:07d}", "tenant_id": f"t{i % args.tenants:04d}", "change_log": entries}
        pending = ChangeLogStore.split(belief)  # the store's own forms: belief names the log's ref
        if pending is None:
            raise RuntimeError("a log with entries always splits off")
        pending.document["created_at"] = created  # past the sweep's minimum age
        tenant = pending.tenant_id
        if i % args.orphan_every:
            yield {
                "_index": beliefs,
                "_id": routed_id(tenant, pending.belief_id),
                "_routing": tenant,
                "_source": belief,
            }
        yield {"_index": logs, "_id": routed_id(tenant, pending.ref), "_routing": tenant, "_source": pending.document}


def _load(client: OpenSearch, args: argparse.Namespace) -> float:
    aliases = (BELIEFS.alias(args.namespace), BELIEF_LOGS.alias(args.namespace))
    return scratch_namespace.bulk_load(client, aliases, _documents(args), chunk_size=5000, merge=True)


def _sweep(store: ChangeLogStore, pace: SweepPace) -> tuple[int, int]:
    """Passes until the last tenant, each resuming after the one before, as beat's runs do."""
    removed = passes = 0
    after: str | None = None
    while True:
        done = store.sweep_orphans(pace=pace, resume_after=after)
        removed, passes, after = removed + done.removed, passes + 1, done.resume_after
        if after is None:
            return removed, passes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    client = OpenSearch([args.opensearch_url], timeout=300)
    with scratch_namespace.fresh(client, args.namespace):
        result: dict[str, Any] = {
            "log_documents": args.size,
            "tenants": args.tenants,
            "work_fraction": args.work_fraction,
            "budget_s": args.budget_s,
            "load_s": round(_load(client, args), 1),
        }
        store = ChangeLogStore(client, args.namespace)
        pace = SweepPace(work_fraction=args.work_fraction, budget_s=args.budget_s)
        for run in (1, 2):
            (removed, passes), cost = scratch_namespace.timed(args.opensearch_pid, lambda: _sweep(store, pace))
            result[f"sweep_{run}"] = {"removed": removed, "passes": passes, **cost}
            client.indices.refresh(index=BELIEF_LOGS.alias(args.namespace))
            print(json.dumps(result), flush=True)
        result["left"] = client.count(index=BELIEF_LOGS.alias(args.namespace))["count"]
        print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
