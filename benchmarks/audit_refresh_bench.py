"""What the audit index's refresh interval costs the node while receipts are drained into it.

The receipt drain sends a second's injection receipts (300 at 300 recalls/s) to the audit index
in one bulk every second. For each ``--interval`` this sets the index's refresh interval
(``none``: unset, a shard nobody searches goes search-idle and is never refreshed), flushes the
index so every setting starts from an empty indexing buffer, then drains ``--seconds`` such bulks
and prints the node's CPU per second (``/proc``), its worst 100-ms windows (10-ms ticks), the
bulks' median ``took``, the refreshes and merges in the window and the indexing buffer left at
the end. With ``--flush`` it ends by flushing what the last setting left in the buffer and
prints what that flush cost: the burst an unrefreshed shard saves up for its translog's flush
threshold. The events belong to a tenant of their own and are deleted at the end; the index's
interval is put back to what it was.

    .venv/bin/python -m benchmarks.audit_refresh_bench --opensearch-url $OS --opensearch-pid $OS_PID \\
        --index fastpath-1m-audit --seconds 90 --interval 1s --interval 10s --interval 30s --interval none

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from typing import Any

from opensearchpy import OpenSearch

from loadtest.__main__ import process_cpu_s
from service.storage.audit import AuditEvent, time_ordered_id

TENANT = "bench-audit-refresh"
UNSET = "none"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--opensearch-pid", type=int, required=True, help="the node's process, for its CPU")
    parser.add_argument("--index", required=True, help="an audit alias or index, e.g. fastpath-1m-audit")
    parser.add_argument(
        "--interval", action="append", required=True, help=f"a refresh interval (1s, 30s, -1) or {UNSET!r}"
    )
    parser.add_argument("--seconds", type=int, default=90, help="bulks per interval, one a second")
    parser.add_argument("--events", type=int, default=300, help="per bulk: a second's receipts at 300 recalls/s")
    parser.add_argument("--flush", action="store_true", help="end by flushing the last setting's buffer, timed")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def interval_setting(text: str) -> str | None:
    """The ``index.refresh_interval`` value an ``--interval`` stands for (None: unset)."""
    return None if text == UNSET else text


def receipt_bulk(index: str, events: int, second: int) -> list[dict[str, Any]]:
    """One drained second of receipt-shaped events (the fields a recall's receipt fills)."""
    body: list[dict[str, Any]] = []
    for i in range(events):
        event = AuditEvent(
            event_id=f"ev-{time_ordered_id()}",
            tenant_id=TENANT,
            action="recall",
            actor_id=f"u{i % 7}",
            actor_kind="api_key",
            credential_id=f"cred-{i % 11}",
            session_id=f"s-{second}-{i % 16}",
            request_id=f"req-{uuid.uuid4().hex}",
            scopes=["domain:code", "user:universal"],
            belief_ids=[f"b-{(second * events + i + k) % 100_000}" for k in range(6)],
            query="which kafka topics do we keep for a week, and who owns their schemas?",
            injected=[{"id": f"b-{k}", "tier": "relevant", "score": 12.5 - k} for k in range(6)],
        )
        body.append({"create": {"_index": index, "_id": event.event_id, "routing": TENANT}})
        body.append(event.model_dump(mode="json", exclude_none=True))
    return body


class CpuWindows:
    """The node's CPU in every 100-ms window while it runs (10-ms ticks: read the tail, not one window)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.windows: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = process_cpu_s(self.pid)
        while not self._stop.wait(0.1):
            now = process_cpu_s(self.pid)
            self.windows.append(now - last)
            last = now

    def __enter__(self) -> CpuWindows:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def shard_counters(client: OpenSearch, index: str) -> dict[str, int]:
    stats = client.indices.stats(index=index, metric="refresh,merge,segments")["_all"]["primaries"]
    return {
        "refreshes": stats["refresh"]["total"],
        "merges": stats["merges"]["total"],
        "buffer_bytes": stats["segments"]["index_writer_memory_in_bytes"],
    }


def drain_under(client: OpenSearch, args: argparse.Namespace, interval: str) -> dict[str, Any]:
    client.indices.put_settings(index=args.index, body={"index": {"refresh_interval": interval_setting(interval)}})
    client.indices.flush(index=args.index)
    before = shard_counters(client, args.index)
    took: list[int] = []
    cpu0, t0 = process_cpu_s(args.opensearch_pid), time.monotonic()
    with CpuWindows(args.opensearch_pid) as cpu:
        for second in range(args.seconds):
            took.append(int(client.bulk(body=receipt_bulk(args.index, args.events, second))["took"]))
            time.sleep(max(0.0, t0 + second + 1 - time.monotonic()))
    cpu_s = process_cpu_s(args.opensearch_pid) - cpu0
    after = shard_counters(client, args.index)
    windows = sorted(cpu.windows)
    return {
        "interval": interval,
        "node_cpu_ms_per_s": round(cpu_s * 1000 / args.seconds, 1),
        "cpu_100ms_window_p99_ms": round(windows[int(len(windows) * 0.99)] * 1000),
        "cpu_100ms_window_max_ms": round(windows[-1] * 1000),
        "bulk_took_median_ms": statistics.median(took),
        "refreshes": after["refreshes"] - before["refreshes"],
        "merges": after["merges"] - before["merges"],
        "buffer_bytes_at_end": after["buffer_bytes"],
    }


def timed_flush(client: OpenSearch, args: argparse.Namespace) -> dict[str, Any]:
    buffer_mb = shard_counters(client, args.index)["buffer_bytes"] / 1e6
    cpu0, t0 = process_cpu_s(args.opensearch_pid), time.monotonic()
    client.indices.flush(index=args.index, request_timeout=600)
    return {
        "buffer_mb": round(buffer_mb, 1),
        "wall_s": round(time.monotonic() - t0, 2),
        "node_cpu_s": round(process_cpu_s(args.opensearch_pid) - cpu0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenSearch(args.opensearch_url, timeout=120)
    live = client.indices.get_settings(index=args.index, name="index.refresh_interval")
    # an index without an explicit interval is left out of that answer (or answers no settings)
    kept = {name: body.get("settings", {}).get("index", {}).get("refresh_interval") for name, body in live.items()}
    rows: list[dict[str, Any]] = []
    flush: dict[str, Any] | None = None
    try:
        for interval in args.interval:
            rows.append(drain_under(client, args, interval))
            print(json.dumps(rows[-1]), flush=True)
        if args.flush:
            flush = timed_flush(client, args)
            print(json.dumps({"flush": flush}), flush=True)
    finally:
        for name in client.indices.get_alias(index=args.index):
            client.indices.put_settings(index=name, body={"index": {"refresh_interval": kept.get(name)}})
        client.delete_by_query(
            index=args.index, body={"query": {"term": {"tenant_id": TENANT}}}, routing=TENANT, refresh=True
        )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump({"events_per_second": args.events, "seconds": args.seconds, "rows": rows, "flush": flush}, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
