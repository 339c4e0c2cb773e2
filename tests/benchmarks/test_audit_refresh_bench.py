"""benchmarks/audit_refresh_bench.py: its settings, its receipts accepted by the real audit mapping,
and a short run that counts what each interval did."""

from __future__ import annotations

import os
import uuid
from argparse import Namespace

import pytest
from opensearchpy import OpenSearch

from benchmarks.audit_refresh_bench import drain_under, interval_setting, parse_args, receipt_bulk
from service.storage.templates import AUDIT, apply_templates, drop_namespace


def test_none_stands_for_an_unset_interval_and_an_interval_is_required() -> None:
    assert interval_setting("none") is None and interval_setting("30s") == "30s"
    with pytest.raises(SystemExit):
        parse_args(["--opensearch-url", "http://x", "--opensearch-pid", "1", "--index", "a"])


def test_a_short_drain_under_two_intervals_counts_their_refreshes(os_client: OpenSearch) -> None:
    ns = f"arb-{uuid.uuid4().hex[:6]}"
    try:
        apply_templates(os_client, ns, (AUDIT,))
        alias = AUDIT.alias(ns)
        bulk = os_client.bulk(body=receipt_bulk(alias, 5, 0), refresh=True)
        assert not bulk["errors"], bulk  # the strict mapping takes every field a receipt fills
        args = Namespace(index=alias, opensearch_pid=os.getpid(), seconds=3, events=20)
        every_second = drain_under(os_client, args, "1s")
        unrefreshed = drain_under(os_client, args, "-1")
        assert every_second["refreshes"] >= 1 and unrefreshed["refreshes"] == 0
        assert unrefreshed["buffer_bytes_at_end"] > 0
        assert set(every_second) >= {"node_cpu_ms_per_s", "cpu_100ms_window_max_ms", "bulk_took_median_ms"}
    finally:
        drop_namespace(os_client, ns, (AUDIT,))
