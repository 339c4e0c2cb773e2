"""What the audit fields' doc values cost the node while receipts are drained into it.

The receipt drain sends a second's injection receipts (300 at 300 recalls/s) to the audit index in
one bulk every second. This makes two scratch indices on a running node, one with the audit
template's mapping (``tenure-audit-fields`` v2: doc values only on the fields reads sort on) and
one with doc values on every keyword field (v1, as before), both with the template's settings,
and drains ``--seconds`` one-a-second bulks into each in turn, ``--rounds`` times (ABBA..., so
the machine's drift and the order fall on both). Each pass ends with a refresh, so the segment its receipts make is
in its cost. Per pass: the node's CPU per second (``/proc``) and the bulks' median ``took``; at the
end each index's size on disk. The scratch indices are deleted.

    .venv/bin/python -m benchmarks.audit_mapping_ab --opensearch-url $OS --opensearch-pid $OS_PID \\
        --seconds 30 --rounds 2

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import uuid
from typing import Any

from opensearchpy import OpenSearch

from benchmarks.audit_refresh_bench import receipt_bulk
from loadtest.__main__ import process_cpu_s
from service.storage.templates import AUDIT, expected_mapping, template_settings

ARMS = ("template", "doc_values_everywhere")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--opensearch-pid", type=int, required=True, help="the node's process, for its CPU")
    parser.add_argument("--seconds", type=int, default=30, help="bulks per pass, one a second")
    parser.add_argument("--rounds", type=int, default=2, help="passes per arm, alternating")
    parser.add_argument("--events", type=int, default=300, help="per bulk: a second's receipts at 300 recalls/s")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def arm_mapping(arm: str) -> dict[str, Any]:
    """The audit mapping of ``arm``: the template's, or the template's with doc values on every
    field (the default OpenSearch gives a keyword when the mapping does not say)."""
    mapping = expected_mapping(AUDIT)
    if arm == "doc_values_everywhere":
        mapping = copy.deepcopy(mapping)
        for spec in mapping["properties"].values():
            spec.pop("doc_values", None)
    return mapping


def create_arms(client: OpenSearch, prefix: str) -> dict[str, str]:
    settings = {**template_settings(AUDIT), "number_of_replicas": 0}
    settings.pop("auto_expand_replicas", None)
    indices = {arm: f"{prefix}-{arm.replace('_', '-')}" for arm in ARMS}
    for arm, index in indices.items():
        client.indices.create(index=index, body={"settings": settings, "mappings": arm_mapping(arm)})
    return indices


def drain_pass(client: OpenSearch, index: str, args: argparse.Namespace) -> dict[str, float]:
    """``args.seconds`` one-a-second bulks into ``index``, then a refresh: the node's CPU per second."""
    client.indices.flush(index=index)
    cpu0, t0 = process_cpu_s(args.opensearch_pid), time.monotonic()
    took: list[int] = []
    for second in range(args.seconds):
        took.append(int(client.bulk(body=receipt_bulk(index, args.events, second))["took"]))
        time.sleep(max(0.0, t0 + second + 1 - time.monotonic()))
    client.indices.refresh(index=index)
    cpu_s = process_cpu_s(args.opensearch_pid) - cpu0
    return {"node_cpu_ms_per_s": round(cpu_s * 1000 / args.seconds, 1), "bulk_took_median_ms": statistics.median(took)}


def store_bytes(client: OpenSearch, index: str) -> int:
    size: int = client.indices.stats(index=index, metric="store")["_all"]["primaries"]["store"]["size_in_bytes"]
    return size


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenSearch(args.opensearch_url, timeout=120)
    indices = create_arms(client, f"bench-audit-mapping-{uuid.uuid4().hex[:6]}")
    passes: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    try:
        for round_no in range(args.rounds):
            for arm in ARMS if round_no % 2 == 0 else ARMS[::-1]:  # ABBA: the order's effect falls on both
                passes[arm].append(drain_pass(client, indices[arm], args))
                print(json.dumps({"round": round_no, "arm": arm, **passes[arm][-1]}), flush=True)
        for index in indices.values():
            client.indices.forcemerge(index=index, max_num_segments=1)  # sizes compared like for like
        sizes = {arm: store_bytes(client, index) for arm, index in indices.items()}
    finally:
        for index in indices.values():
            client.indices.delete(index=index, ignore_unavailable=True)
    summary = {
        arm: {
            "node_cpu_ms_per_s": [p["node_cpu_ms_per_s"] for p in passes[arm]],
            "node_cpu_ms_per_s_median": statistics.median(p["node_cpu_ms_per_s"] for p in passes[arm]),
            "bulk_took_median_ms": [p["bulk_took_median_ms"] for p in passes[arm]],
            "store_bytes_merged": sizes[arm],
        }
        for arm in ARMS
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump({"events_per_second": args.events, "seconds": args.seconds, "arms": summary}, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
