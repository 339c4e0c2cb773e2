"""What one API process may hold at most, for the deployment files' memory limits (compose and
Helm): its base and its caches at their configured bounds (docs/operations.md "Recall caches",
"Query analysis in the API process").

Measured (2026-12-07, the 1M benchmark corpus, 1,000 tenants of 1,000 beliefs, one worker after
5,000 recalls, ``benchmarks/recall_cache_hits.py``): 522 MB of RSS with the tier cache at 64 MB,
552 MB at 128 MB, 608 MB at 256 MB. The bounds below are estimates that count shared beliefs once
per entry, so the sum overstates what a process holds; a limit under it could still be fine for
smaller tenants, but would OOM-kill a deployment whose caches fill."""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest

from service.config import RecallDefaults, Settings, environment_names

# the interpreter, the app and the analysis JVM (128 MB heap cap, the CJK dictionaries) at rest
BASE_MB = 225
# a decoded belief of the benchmark corpus with its text (docs/operations.md "Recall caches")
DECODED_BELIEF_KB = 4.5

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(k|ki|m|mi|g|gi)?b?$", re.IGNORECASE)
_MB_PER_UNIT = {"": 1 / 2**20, "k": 1 / 1024, "ki": 1 / 1024, "m": 1, "mi": 1, "g": 1024, "gi": 1024}


def process_budget_mb(recall: RecallDefaults) -> float:
    caches = recall.vocabulary_cache_mb + recall.tier_cache_mb + recall.message_tier_cache_mb + recall.analysis_cache_mb
    return BASE_MB + caches + recall.decode_cache_entries * DECODED_BELIEF_KB / 1024


def settings_of(environment: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a deployment's environment gives the service (none from this process's)."""
    for name in environment_names():
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Settings(_env_file=None)  # type: ignore[call-arg]


def size_mb(text: str) -> float:
    """``1536m``, ``1g`` (compose), ``1536Mi``, ``1Gi`` (Kubernetes) in MB."""
    found = _SIZE.match(text.strip())
    if found is None:
        raise ValueError(f"not a memory size: {text!r}")
    return float(found.group(1)) * _MB_PER_UNIT[(found.group(2) or "").lower()]
