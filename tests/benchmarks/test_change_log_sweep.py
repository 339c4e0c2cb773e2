"""The sweep benchmark builds what it claims (beliefs naming their logs, every n-th log an orphan)
and the sweep it times removes exactly the orphans, then nothing."""

from __future__ import annotations

import uuid

from benchmarks.change_log_sweep import main


def test_the_first_sweep_removes_the_orphans_and_the_second_none(opensearch_url: str) -> None:
    namespace = f"sweep-bench-{uuid.uuid4().hex[:8]}"
    argv = ["--opensearch-url", opensearch_url, "--size", "300", "--tenants", "7", "--orphan-every", "10"]
    result = main([*argv, "--namespace", namespace])
    assert result["sweep_1"]["removed"] == 30
    assert result["sweep_2"]["removed"] == 0
    assert result["left"] == 270


def test_a_sweep_with_a_budget_takes_several_passes_and_removes_the_same(opensearch_url: str) -> None:
    namespace = f"sweep-bench-{uuid.uuid4().hex[:8]}"
    argv = ["--opensearch-url", opensearch_url, "--size", "60", "--tenants", "3", "--orphan-every", "10"]
    result = main([*argv, "--namespace", namespace, "--budget-s", "0.000001", "--work-fraction", "0.5"])
    assert (result["sweep_1"]["removed"], result["sweep_1"]["passes"]) == (6, 3)  # one tenant a pass
    assert result["sweep_2"]["removed"] == 0
    assert result["left"] == 54
