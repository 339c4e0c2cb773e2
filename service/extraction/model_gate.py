"""The model gate (the paper's "tier gate", §4.3): which answering models are trusted to write sidecars.

Named "model gate" here so that "tier" means one thing in this code base: the recall tiers
(pinned, relevant, questions: ``service/recall/tiers.py``). The paper's word survives only where
it is on the wire: each family's ``tier`` key in ``model_not_supported`` details and the
unknown-family warning text; the old setting names are still read (``service/config.py``).

Families and version floors come from settings (the paper's table by default). A known family
below its floor (or with a version we cannot read) is, in strict mode, refused with
``model_not_supported``; otherwise (the proxy's default) it is served *without* sidecar extraction,
with a warning. An unknown family is allowed with a warning; a tenant with extraction switched off
is never gated.
Versions are parsed per family into ``(major, minor)``; unlike the paper's regexes, newer ids such
as ``gpt-4.1`` or ``gpt-5`` parse correctly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum

from service.config import ModelFamily
from service.errors import ErrorCode, TenureError

Version = tuple[int, int]

# gpt ids whose number does not say their generation; checked in order before the generic parse.
_GPT_NAMED: tuple[tuple[re.Pattern[str], Version], ...] = (
    (re.compile(r"^gpt-4o-mini"), (4, 4)),
    (re.compile(r"^gpt-4o"), (4, 5)),
    (re.compile(r"^gpt-4-turbo"), (4, 1)),
    (re.compile(r"^gpt-4\.1"), (4, 6)),  # released after gpt-4o
    (re.compile(r"^gpt-4\.5"), (4, 7)),
    (re.compile(r"^gpt-4(?:-\d|$)"), (4, 0)),
    (re.compile(r"^gpt-3"), (3, 0)),
)
_GPT_GENERIC = re.compile(r"^gpt-(\d+)(?:\.(\d+))?")
# claude-opus-4-5-20251101, claude-sonnet-4-20250514, claude-3-5-sonnet-20241022, claude-3-opus
_CLAUDE_NEW = re.compile(r"claude-[a-z]+-(\d+)(?:[-.](\d{1,2}))?(?=-|$|:|@)")
_CLAUDE_OLD = re.compile(r"claude-(\d+)(?:[-.](\d{1,2}))?-[a-z]+")


class GateOutcome(StrEnum):
    VERIFIED = "verified"
    UNKNOWN_FAMILY = "unknown_family"
    BELOW_FLOOR = "below_floor"  # served, but its sidecars are not trusted: no extraction
    EXTRACTION_OFF = "extraction_off"


@dataclass(frozen=True)
class GateDecision:
    outcome: GateOutcome
    family: str | None = None
    version: Version | None = None
    warning: str | None = None

    @property
    def extract(self) -> bool:
        return self.outcome not in (GateOutcome.EXTRACTION_OFF, GateOutcome.BELOW_FLOOR)


class ModelNotSupported(TenureError):
    code = ErrorCode.MODEL_NOT_SUPPORTED


def parse_version(family: str, model: str) -> Version | None:
    """``(major, minor)`` of ``model`` within ``family``; None when it cannot be read."""
    model = model.lower()
    if family == "gpt":
        for pattern, version in _GPT_NAMED:
            if pattern.match(model):
                return version
        found = _GPT_GENERIC.match(model)
        return (int(found.group(1)), int(found.group(2) or 0)) if found else None
    if family in ("claude", "bedrock-claude"):
        found = _CLAUDE_NEW.search(model) or _CLAUDE_OLD.search(model)
        return (int(found.group(1)), int(found.group(2) or 0)) if found else None
    found = re.search(r"(\d+)(?:[.-](\d+))?", model)
    return (int(found.group(1)), int(found.group(2) or 0)) if found else None


def _floor(value: str) -> Version:
    major, _, minor = value.partition(".")
    return int(major), int(minor or 0)


class ModelGate:
    def __init__(self, families: list[ModelFamily], *, strict: bool = True):
        self.families = [(f, re.compile(f.detect, re.IGNORECASE)) for f in families]
        self.strict = strict

    def check(self, model: str, *, extraction_enabled: bool = True, strict: bool | None = None) -> GateDecision:
        """Decide for one request. Below a floor: :class:`ModelNotSupported` when ``strict`` (default:
        the gate's own setting), else served without extraction (``BELOW_FLOOR``, with a warning)."""
        if not extraction_enabled:
            return GateDecision(GateOutcome.EXTRACTION_OFF)
        for family, detect in self.families:
            if not detect.search(model):
                continue
            if family.floor is None:
                return GateDecision(GateOutcome.VERIFIED, family.name)
            version = parse_version(family.name, model)
            floor = _floor(family.floor)
            if version is not None and version >= floor:
                return GateDecision(GateOutcome.VERIFIED, family.name, version)
            if not (self.strict if strict is None else strict):
                return GateDecision(GateOutcome.BELOW_FLOOR, family.name, version, self._below_floor(model, family))
            why = "cannot determine its version" if version is None else "is below the floor"
            raise ModelNotSupported(
                f"model {model!r} {why} of family {family.name!r} (needs >= {family.floor}) for belief extraction",
                details={"supported_families": self.supported()},
            )
        return GateDecision(GateOutcome.UNKNOWN_FAMILY, warning=self._warning(model))

    def supported(self) -> list[dict[str, str | int | None]]:
        # "tier" is the paper's key for the family's grade; kept on the wire (422 details) as it was
        return [{"family": f.name, "detect": f.detect, "floor": f.floor, "tier": f.grade} for f, _ in self.families]

    @staticmethod
    def _below_floor(model: str, family: ModelFamily) -> str:
        # the same header-safe quoting as _warning
        return (
            f"Model {json.dumps(model[:100])} is below the {json.dumps(family.name)} floor {family.floor}: "
            "answered without memory extraction."
        )

    @staticmethod
    def _warning(model: str) -> str:
        # the text goes into an HTTP header: json.dumps quotes it and escapes anything outside
        # printable ASCII (non-latin-1 letters, CR/LF), so a client-chosen model name can neither
        # break the response nor inject a header. The wording is the paper's, verbatim.
        return f"Model {json.dumps(model[:100])} is not in a verified tier. Sidecar extraction may be unreliable."
