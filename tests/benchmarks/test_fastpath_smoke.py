"""``fastpath_bench`` end to end, in miniature: 600 beliefs over 20 tenants of 10 users (enough
keys for the closed-loop ceiling to stay under each key's rate limit), the API served from this
tree (uvicorn, its in-process analysis, the receipt drain's Celery beat and worker) against the
session's real node and Redis, a few seconds of each pass.

The figures mean nothing at this size and are not asserted (docs/benchmarks.md keeps the real
ones, from the full run by script). What is asserted is that the benchmark itself works: every
pass answered without an error, the CPU split read the API and the load client, the receipts
reached the audit index, and the result carries the machine's speed. The issue's proof depends
on this script; a change that broke it would otherwise surface only at the next full run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opensearchpy import OpenSearch

from benchmarks.fastpath_bench import main, namespace_of

SIZE = 600


@pytest.mark.timeout(420)
def test_a_short_run_measures_every_pass(opensearch_url: str, redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "fastpath.json"
    argv = [
        "--opensearch-url", opensearch_url, "--redis-url", redis_url, "--state-dir", str(tmp_path),
        "--sizes", str(SIZE), "--tenants", "20", "--users-per-tenant", "10", "--traffic", "sessions",
        "--prime-connections", "1", "--warmup", "60", "--queries", "120", "--seq-client", "sync-keepalive",
        "--rate", "40", "--paced-s", "2", "--paced-grace-s", "10", "--ceiling-s", "2", "--ceiling-calls", "400",
        "--clients", "2", "--seed", "5", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0

    data = json.loads(out.read_text())
    for when in ("before", "after"):
        speed = data["machine_speed"][when]
        assert 0 < speed["loop_s_min"] <= speed["loop_s_median"]
    (stage,) = data["stages"]
    assert stage["beliefs"] == SIZE
    (run,) = stage["variants"]
    assert run["traffic"] == "sessions" and run["primed"]

    sequential, paced, ceiling = run["sequential"], run["paced"], run["ceiling"]
    assert sequential["errors"] == 0 and sequential["n"] == 120 and sequential["p50_ms"] > 0
    assert paced["errors"] == 0 and paced["sent"] == 80 and paced["error_causes"] == {}
    assert paced["n"] == 80 and [row[1] for row in paced["timeline"]] == [40, 40]
    assert ceiling["errors"] == 0 and ceiling["n"] > 0 and ceiling["recalls_per_s"] > 0
    # the CPU split read the API and the load client (the node's and Redis's pids are not given:
    # a run against servers it did not start may not know them)
    assert run["cpu_ms_per_recall"]["api"] > 0
    assert paced["run_queue"]["api"]["slices"] > 0 and paced["run_queue"]["client"]["slices"] > 0

    # every recall left its receipt, and the drain moved them all into the audit index before the
    # API stopped (the count read just after the ceiling may hold the last tick's worth)
    assert run["receipt_outbox"]["drained_at_end_s"] >= 0
    client = OpenSearch(opensearch_url)
    audit = f"{namespace_of(SIZE)}-audit"
    client.indices.refresh(index=audit)
    recalls = client.count(index=audit, body={"query": {"term": {"action": "recall"}}})["count"]
    assert recalls >= sequential["n"] + paced["n"] + ceiling["n"]
