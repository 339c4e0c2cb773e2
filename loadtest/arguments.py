"""Command-line arguments the load test and the HTTP benchmarks share (``python -m loadtest``,
``benchmarks.http_scale_bench``, ``benchmarks.fastpath_bench``): where the stack's OpenSearch and
Redis come from, how many API workers serve, and the synthetic corpus's sizes and tenancy."""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class Arguments(Protocol):
    """An argument parser or one of its groups."""

    def add_argument(self, *names: str, **options: Any) -> Any: ...


def add_stack_arguments(parser: Arguments, *, api_workers: int, heap: str | None = None) -> None:
    """``--opensearch-url``/``--redis-url`` (reuse running servers instead of starting them),
    ``--api-workers`` and, for tools that start their own node, ``--heap``."""
    parser.add_argument("--opensearch-url", help="reuse a running OpenSearch instead of starting one")
    parser.add_argument("--redis-url", help="reuse a running Redis instead of starting one")
    if heap is not None:
        parser.add_argument("--heap", default=heap, help="heap of the OpenSearch node started for the run")
    parser.add_argument("--api-workers", type=int, default=api_workers)


def add_corpus_arguments(parser: Arguments) -> None:
    """``--sizes`` (corpus sizes, ascending), ``--tenants``, ``--users-per-tenant``."""
    parser.add_argument("--sizes", default="10000,100000,1000000", help="corpus sizes, ascending")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--users-per-tenant", type=int, default=5)


def add_recall_arguments(parser: Arguments, *, clients: int) -> None:
    """``--queries`` measured sequential recalls after ``--warmup`` ones; ``--clients`` concurrent."""
    parser.add_argument("--queries", type=int, default=2000, help="measured sequential recalls per stage")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--clients", type=int, default=clients, help="concurrent clients")


def sizes(args: argparse.Namespace) -> list[int]:
    """``--sizes`` as numbers, ascending."""
    return sorted(int(size) for size in args.sizes.split(","))
