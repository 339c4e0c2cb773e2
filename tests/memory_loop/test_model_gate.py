"""The model gate with the paper's table (and a stricter version parser)."""

from __future__ import annotations

import pytest

from service.config import MemoryLoopSettings, ModelFamily
from service.errors import ErrorCode
from service.extraction.model_gate import GateOutcome, ModelGate, ModelNotSupported

GATE = ModelGate(MemoryLoopSettings().model_families)


@pytest.mark.parametrize(
    "model",
    [
        "claude-opus-4-5-20251101",
        "claude-sonnet-4-5",
        "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "amazon.nova-pro-v1:0",
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-5",
        "o3-mini",
        "o4",
    ],
)
def test_verified(model: str) -> None:
    decision = GATE.check(model)
    assert decision.outcome is GateOutcome.VERIFIED
    assert decision.extract
    assert decision.warning is None


@pytest.mark.parametrize(
    "model",
    [
        "claude-3-5-sonnet-20241022",
        "claude-sonnet-4-20250514",
        "gpt-4",
        "gpt-4-turbo",
        "gpt-3.5-turbo",
        "anthropic.claude-3-haiku-20240307-v1:0",
        "claude-unknownname",
    ],
)
def test_known_family_below_floor_is_refused(model: str) -> None:
    with pytest.raises(ModelNotSupported) as info:
        GATE.check(model)
    assert info.value.code is ErrorCode.MODEL_NOT_SUPPORTED
    assert {f["family"] for f in info.value.details["supported_families"]} >= {"claude", "gpt"}


def test_unknown_family_is_allowed_with_a_warning() -> None:
    decision = GATE.check("llama-3.1-70b")
    assert decision.outcome is GateOutcome.UNKNOWN_FAMILY
    assert decision.extract
    assert decision.warning == 'Model "llama-3.1-70b" is not in a verified tier. Sidecar extraction may be unreliable.'


def test_extraction_off_is_never_gated() -> None:
    assert not GATE.check("gpt-3.5-turbo", extraction_enabled=False).extract


def test_configurable_table_and_non_strict_mode() -> None:
    gate = ModelGate([ModelFamily(name="llama", detect=r"^llama-", floor="3.1")])
    assert gate.check("llama-3.1-70b").outcome is GateOutcome.VERIFIED
    with pytest.raises(ModelNotSupported):
        gate.check("llama-2-70b")
    assert ModelGate(MemoryLoopSettings().model_families, strict=False).check("gpt-4").warning


def test_warning_is_header_safe_for_any_model_name() -> None:
    """The warning travels in an HTTP header: non-latin-1 letters and CR/LF must be escaped."""
    from service.extraction.model_gate import ModelGate

    warning = ModelGate._warning("Ā\r\nSet-Cookie: x=1")
    warning.encode("ascii")  # raises if anything non-ASCII survived
    assert "\r" not in warning and "\n" not in warning and "\\u0100" in warning


def test_below_the_floor_without_strict_mode_is_served_without_extraction() -> None:
    decision = GATE.check("gpt-4", strict=False)
    assert decision.outcome is GateOutcome.BELOW_FLOOR and not decision.extract
    assert decision.warning and "below the" in decision.warning and "\n" not in decision.warning
    with pytest.raises(ModelNotSupported):
        GATE.check("gpt-4", strict=True)
    assert GATE.check("gpt-4o", strict=False).extract  # above the floor nothing changes
