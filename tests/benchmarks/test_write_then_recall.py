"""``write_then_recall``'s turns and rows (pure functions, no servers): each turn's sidecar is one
the service accepts, adding the one belief the timed recalls name, and a row reports what was timed."""

from __future__ import annotations

from benchmarks.write_then_recall import Side, _new_name, _turn
from service.extraction.sidecar import ParseStatus, split_sidecar
from service.extraction.validator import validate_sidecar


def test_a_turn_carries_a_sidecar_the_service_accepts_with_the_new_belief() -> None:
    name, alias = _new_name()
    assert name != _new_name()[0]  # every step writes a belief of its own
    turn = _turn(name, alias)
    split = split_sidecar(turn["assistant_message"])
    assert split.status is ParseStatus.PARSED and alias in split.visible
    validated = validate_sidecar(split.raw, split.status)
    assert validated.accepted, validated.rejected_reason
    [belief] = validated.new_beliefs
    assert (belief.canonical_name, belief.aliases, belief.scope) == (name, [alias], turn["scope"])


def test_a_row_reports_each_timed_recall_kind_and_the_misses() -> None:
    side = Side("v", api=None, worker=None, caller=None, tenants=["t0000"])  # type: ignore[arg-type]
    side.latencies_ms = {"first": [float(v) for v in range(1, 101)], "second": [5.0] * 100}
    side.extraction_s = [0.05] * 100
    side.missed = 2
    row = side.row()
    assert (row["steps"], row["missed"]) == (100, 2)
    assert (row["first_p50_ms"], row["first_p90_ms"], row["first_max_ms"]) == (50.0, 90.0, 100.0)
    assert (row["second_p50_ms"], row["extraction_p50_s"]) == (5.0, 0.05)
