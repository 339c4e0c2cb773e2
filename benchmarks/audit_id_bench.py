"""What an audit event's id costs the node when the drain creates it: random (uuid4) against
time-ordered (UUIDv7, ``service.storage.audit.time_ordered_id``) ids.

Every receipt is created with ``op_type=create`` under its own id, so for each one the node first
looks the id up in every segment of the shard. This sends ``--rounds`` bulks of ``--events``
receipt-shaped events per kind of id into an existing audit index (the bench corpus's, which holds
millions of events after a few ``fastpath_bench`` runs), alternating which kind goes first, and
prints the bulks' ``took`` and wall time and the node's CPU per bulk (``/proc``, 10 ms ticks, so
read its median over many rounds). The events belong to a tenant of their own and are deleted at
the end.

    .venv/bin/python -m benchmarks.audit_id_bench --opensearch-url $OS --opensearch-pid $OS_PID \\
        --index fastpath-1m-audit

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from opensearchpy import OpenSearch

from loadtest.__main__ import process_cpu_s
from service.storage.audit import AuditEvent, time_ordered_id

TENANT = "bench-audit-ids"
KINDS: dict[str, Callable[[], str]] = {"uuid4": lambda: uuid.uuid4().hex, "uuid7": time_ordered_id}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--opensearch-pid", type=int, default=None, help="for the node's CPU per bulk")
    parser.add_argument("--index", required=True, help="an audit alias or index, e.g. fastpath-1m-audit")
    parser.add_argument("--events", type=int, default=300, help="per bulk: a second's receipts at 300 recalls/s")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pause-s", type=float, default=0.7, help="between rounds")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def bulk_body(index: str, events: int, new_id: Callable[[], str]) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = []
    for i in range(events):
        event = AuditEvent(
            event_id=f"ev-{new_id()}",
            tenant_id=TENANT,
            action="recall",
            actor_id=f"u{i % 5}",
            actor_kind="api_key",
            scopes=["domain:code"],
            belief_ids=["b-1", "b-2"],
            query="which kafka topics do we keep for a week?",
            injected=[{"id": "b-1", "tier": "relevant", "score": 12.5}],
        )
        body.append({"create": {"_index": index, "_id": event.event_id, "routing": TENANT}})
        body.append(event.model_dump(mode="json", exclude_none=True))
    return body


def one_bulk(client: OpenSearch, body: list[dict[str, Any]], pid: int | None) -> dict[str, float]:
    cpu0 = process_cpu_s(pid) if pid else 0.0
    t0 = time.perf_counter()
    answer = client.bulk(body=body, refresh="false")
    wall_ms = (time.perf_counter() - t0) * 1000
    time.sleep(0.2)  # let the node's indexing threads finish what the answer did not wait for
    if answer["errors"]:
        raise RuntimeError(json.dumps(answer["items"][0]))
    cpu_ms = (process_cpu_s(pid) - cpu0) * 1000 if pid else float("nan")
    return {"took_ms": float(answer["took"]), "wall_ms": wall_ms, "node_cpu_ms": cpu_ms}


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(row[key] for row in rows), 2) for key in rows[0]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenSearch(args.opensearch_url, timeout=60)
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    try:
        for round_ in range(args.rounds):
            order = list(KINDS) if round_ % 2 == 0 else list(reversed(KINDS))
            for kind in order:
                body = bulk_body(args.index, args.events, KINDS[kind])
                results[kind].append(one_bulk(client, body, args.opensearch_pid))
            time.sleep(args.pause_s)
    finally:
        client.delete_by_query(
            index=args.index, body={"query": {"term": {"tenant_id": TENANT}}}, routing=TENANT, refresh=True,
            conflicts="proceed",
        )  # fmt: skip
    count = client.count(index=args.index)["count"]
    report = {"index": args.index, "events_in_index": count, "events_per_bulk": args.events, "rounds": args.rounds}
    for kind, rows in results.items():
        report[kind] = summary(rows[2:])  # the first rounds warm the node's code paths
        print(f"{kind}: median per bulk of {args.events}: {report[kind]}")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(report, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
