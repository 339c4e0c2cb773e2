"""``node_cpu_split``'s pure parts: the modes' order, a mode's row, the recording's top frames and
its settings (no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.node_cpu_split import MODES, ModeFigures, _settings_file, frame_name, modes_of, parse_args, top_frames

ARGS = ["--opensearch-url", "http://os", "--redis-url", "redis://r", "--opensearch-pid", "1"]


def test_one_variant_only() -> None:
    assert parse_args([*ARGS, "--variant", "main=."]).variant == ["main=."]
    with pytest.raises(SystemExit):
        parse_args([*ARGS, "--variant", "main=.", "--variant", "other=/tmp"])


def test_the_modes_take_turns_at_going_first() -> None:
    assert [modes_of(b) for b in range(4)] == [MODES, MODES[::-1], MODES, MODES[::-1]]
    assert set(MODES) == {"drain-running", "drain-paused"}


def test_a_row_is_per_recall() -> None:
    figures = ModeFigures(latencies_ms=[float(v) for v in range(1, 201)], cpu_s={"opensearch": 0.3, "api": 0.6})
    assert figures.row("drain-paused") == {
        "mode": "drain-paused",
        "n": 200,
        "p50_ms": 101.0,
        "p99_ms": 199.0,
        "api_cpu_ms": 3.0,
        "opensearch_cpu_ms": 1.5,
    }


def test_top_frames_count_the_innermost_frame_as_self_and_a_method_once_per_stack() -> None:
    samples = [
        ["Lucene.seek", "TermQuery.createWeight", "Search.query"],
        ["Lucene.seek", "Lucene.seek", "Search.query"],  # recursion: counted once inclusively
        ["Json.write", "Search.respond"],
        [],  # a sample without a stack is not a sample of any method
        ["Lucene.seek", "Search.query"],
    ]
    top = top_frames(samples, 2)
    assert top["samples"] == 4
    assert top["self"] == [("Lucene.seek", 75.0), ("Json.write", 25.0)]
    assert top["inclusive"] == [("Lucene.seek", 75.0), ("Search.query", 75.0)]
    assert top_frames([], 5) == {"samples": 0, "self": [], "inclusive": []}


def test_a_frame_is_named_by_its_class_and_method() -> None:
    frame = {"method": {"type": {"name": "org/apache/lucene/search/TermQuery"}, "name": "createWeight"}}
    assert frame_name(frame) == "org.apache.lucene.search.TermQuery.createWeight"


def test_the_recording_settings_are_the_jdks_profile_with_the_period_asked(tmp_path: Path) -> None:
    written = _settings_file(2, tmp_path / "s.jfc").read_text()
    assert '<setting name="period" control="method-sampling-java-interval">2 ms</setting>' in written
    assert 'method-sampling-java-interval">10 ms' not in written
    assert '<event name="jdk.ExecutionSample">' in written
