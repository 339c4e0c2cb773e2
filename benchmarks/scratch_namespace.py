"""What the benchmarks that build a throw-away namespace on a running node share
(``change_log_sweep``, ``move_change_logs``): their common arguments, a bulk load with refresh off,
one timed run with the node's CPU, and the namespace itself, made fresh and dropped afterwards."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from opensearchpy import OpenSearch, helpers

from benchmarks.index_order_ab import process_cpu_s
from service.storage.templates import apply_templates, drop_namespace

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser, *, size: int, size_help: str, namespace: str) -> None:
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--opensearch-pid", type=int, help="the node's JVM, for its CPU (else not measured)")
    parser.add_argument("--size", type=int, default=size, help=size_help)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--namespace", default=namespace)


def bulk_load(
    client: OpenSearch, aliases: Sequence[str], documents: Iterable[dict[str, Any]], *, chunk_size: int, merge: bool
) -> float:
    """Load ``documents`` (bulk actions) with refresh off, then refresh (and force-merge); seconds."""
    t0 = time.monotonic()
    for alias in aliases:
        client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "-1"}})
    loading = helpers.parallel_bulk(client, documents, thread_count=2, chunk_size=chunk_size, raise_on_error=False)
    for ok, item in loading:
        if not ok:
            raise RuntimeError(f"bulk item refused: {item}")
    for alias in aliases:
        client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "1s"}})
        client.indices.refresh(index=alias)
        if merge:
            client.indices.forcemerge(index=alias, max_num_segments=1, request_timeout=3600)
    return time.monotonic() - t0


def timed(opensearch_pid: int | None, run: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """``run()``'s answer, its wall time, the node's CPU meanwhile and that CPU over the wall time
    (how many of the node's cores it kept busy on average)."""
    cpu0, t0 = process_cpu_s(opensearch_pid), time.monotonic()
    answer = run()
    wall_s = time.monotonic() - t0
    cpu_s = process_cpu_s(opensearch_pid) - cpu0 if opensearch_pid else None
    return answer, {
        "wall_s": round(wall_s, 1),
        "opensearch_cpu_s": None if cpu_s is None else round(cpu_s, 1),
        "opensearch_cores_busy": None if cpu_s is None else round(cpu_s / wall_s, 2),
    }


@contextmanager
def fresh(client: OpenSearch, namespace: str) -> Iterator[None]:
    """``namespace`` with every index family empty (what an earlier, interrupted run left is
    dropped first), dropped again when the block ends, however it ends."""
    drop_namespace(client, namespace)
    apply_templates(client, namespace)
    try:
        yield
    finally:
        drop_namespace(client, namespace)
