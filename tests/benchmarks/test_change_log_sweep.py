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
