"""``recall_cache_hits``' arithmetic: lookups grown over the pass per recall, hit ratios, and
what the caches hold at its end (the end-to-end path, one API worker over the loaded corpus, is
``fastpath_bench``'s, which ``test_fastpath_smoke`` runs)."""

from __future__ import annotations

from benchmarks.recall_cache_hits import Samples, summarise


def _lookup(cache: str, part: str, outcome: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("tenure_cache_lookups_total", (("cache", cache), ("outcome", outcome), ("part", part)))


def test_grown_lookups_per_recall_and_what_is_held_at_the_end() -> None:
    before: Samples = {
        _lookup("tiers", "filters", "hit"): 10,
        _lookup("tiers", "filters", "miss"): 4,
        ("tenure_cache_evictions_total", (("cache", "tiers"),)): 2,
        ("tenure_cache_entries", (("cache", "tiers"),)): 50,
    }
    after: Samples = {
        _lookup("tiers", "filters", "hit"): 28,
        _lookup("tiers", "filters", "miss"): 6,
        _lookup("tiers", "relevant", "miss"): 10,
        ("tenure_cache_evictions_total", (("cache", "tiers"),)): 7,
        ("tenure_cache_entries", (("cache", "tiers"),)): 40,
        ("tenure_cache_estimated_bytes", (("cache", "tiers"),)): 4096,
    }
    summary = summarise(before, after, recalls=10)
    assert summary["lookups_per_recall"] == {
        "tiers": {
            "filters": {"hit": 1.8, "miss": 0.2, "hit_ratio": 0.9},
            "relevant": {"hit": 0.0, "miss": 1.0, "hit_ratio": 0.0},
        }
    }
    assert summary["evictions_per_recall"] == {"tiers": 0.5}
    assert summary["held"] == {"tiers": {"entries": 40, "estimated_bytes": 4096}}
