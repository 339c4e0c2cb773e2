"""The move benchmark builds beliefs that keep their logs inline, and the move it times moves each
of them once, keeping every history."""

from __future__ import annotations

import uuid

from benchmarks.move_change_logs import main


def test_the_first_run_moves_every_log_and_the_second_none(opensearch_url: str) -> None:
    namespace = f"move-bench-{uuid.uuid4().hex[:8]}"
    argv = ["--opensearch-url", opensearch_url, "--size", "60", "--tenants", "4", "--entries", "3"]
    result = main([*argv, "--namespace", namespace])
    assert (result["run_1"]["scanned"], result["run_1"]["moved"], result["run_1"]["unreadable"]) == (60, 60, [])
    assert (result["run_2"]["scanned"], result["run_2"]["moved"]) == (60, 0)
    assert result["histories_intact"] is True
