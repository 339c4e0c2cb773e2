"""A benchmark variant from another tree must analyse recall messages the way the running tree does:
a worktree without the built analysis class would quietly send every message to the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fastpath_bench import Variant


def _tree(root: Path, *, java: bool, built: bool) -> Path:
    deploy = root / "deploy" / "opensearch"
    deploy.mkdir(parents=True)
    if java:
        (deploy / "QueryAnalysis.java").write_text("class QueryAnalysis {}")
    if built:
        (deploy / "classes").mkdir()
        (deploy / "classes" / "QueryAnalysis.class").write_bytes(b"\xca\xfe\xba\xbe")
    return root


def test_a_tree_whose_analysis_class_was_never_built_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "fresh-worktree", java=True, built=False)
    with pytest.raises(SystemExit, match="no QueryAnalysis.class"):
        Variant.parse(f"before={tree}")


def test_a_built_tree_an_older_tree_and_an_explicit_classpath_are_taken(tmp_path: Path) -> None:
    built = _tree(tmp_path / "built", java=True, built=True)
    older = _tree(tmp_path / "older", java=False, built=False)  # before in-process analysis existed
    fresh = _tree(tmp_path / "fresh", java=True, built=False)
    assert Variant.parse(f"a={built}").source == built
    assert Variant.parse(f"b={older}").source == older
    explicit = Variant.parse(f"c={fresh}:TENURE_RECALL_ANALYSIS_CLASSPATH=/opt/analysis/*")
    assert explicit.env == {"TENURE_RECALL_ANALYSIS_CLASSPATH": "/opt/analysis/*"}
