"""Recall's searches with and without a ``_source`` filter on their hits.

Recall's tiers (persona, pinned, open questions, relevant) used to ask OpenSearch to leave the
derived fields and the (legacy, inline) change log out of every hit's source
(``_source.excludes``). Any such filter makes OpenSearch parse each hit's stored source and write it
out again; without one it copies the stored bytes. The tiers now take the whole source and recall
drops those fields itself (service/storage/queries.py, service/storage/unreadable.py). This
measures the difference on a loaded corpus with nothing but OpenSearch in the measurement:

1. The real API runs in this process (``recall_floor.record``, every cache as deployed), answers
   ``--warmup`` recalls, then records the ``_msearch`` requests of ``--queries`` more as sent.
2. Each is replayed raw as sent (``whole``) and with the old filter put back on every query line
   (``filtered``), alternating the order for ``--rounds`` rounds (``index_order_ab``), with the
   node's CPU per search from ``/proc``. The searches that carry the three filter tiers (a user's
   first recall, or one after a write) and those with the relevant tier alone are reported apart.
3. The ids of every answer's hits, in order, must be the same in both variants.

    .venv/bin/python -m benchmarks.source_filter_ab --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --traffic random

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks import index_order_ab, recall_floor
from benchmarks.recall_floor import Sent
from service.storage.queries import SOURCE_EXCLUDES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    recall_floor.add_recording_arguments(parser)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--opensearch-pid", type=int, default=None, help="for its CPU per search")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def filtered(sent: Sent) -> Sent:
    """The same tier searches (an ``_msearch``, or a tier searched alone) with the source filter
    recall's tiers used to send."""
    tiers = sent.tier_searches() or []
    queries = [{**body, "_source": {"excludes": SOURCE_EXCLUDES}} for _, body in tiers]
    if sent.kind != "_msearch":
        return Sent(sent.method, sent.path, json.dumps(queries[0]).encode())
    body = "".join(
        f"{json.dumps(header)}\n{json.dumps(query)}\n" for (header, _), query in zip(tiers, queries, strict=True)
    )
    return Sent(sent.method, sent.path, body.encode())


def tiers_in(sent: Sent) -> int:
    return len(sent.tier_searches() or [])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    searches = [s for s in index_order_ab.recorded_searches(args) if tiers_in(s)]
    groups = {
        "with_filter_tiers": [s for s in searches if tiers_in(s) > 1],
        "relevant_tier_only": [s for s in searches if tiers_in(s) == 1],
    }
    report: dict[str, Any] = {"what": "source_filter_ab", "source_excludes": SOURCE_EXCLUDES}
    for group, sent in groups.items():
        if sent:
            variants = {"whole": sent, "filtered": [filtered(s) for s in sent]}
            report[group] = index_order_ab.replay_variants(args, variants)
    index_order_ab.write_report(args, argv, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
