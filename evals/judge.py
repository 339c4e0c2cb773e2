"""Judging a case exactly as the paper's harness did (paper notes §7.3).

- ``relevantBeliefs.shouldOnlyInclude``: the relevant tier equals that set (no extra, no miss)
- ``mustInclude`` / ``mustExclude``: over pinned ∪ relevant, or over the named tier
- persona: ``nonEmpty``, ``isNull``, ``contains``, ``mustNotContain``
- sessions: ``noiseCheck.mustNotSurface`` over pinned ∪ relevant
Precision = |expected ∩ relevant| / |relevant| (None if nothing relevant came back); recall =
|expected ∩ relevant| / |expected| (None if nothing was expected);
drift = noise / (relevant+pinned).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tiers:
    """What a backend returned for one query, reduced to ids (plus scores for the report)."""

    persona: str | None
    pinned: list[str]
    relevant: list[str]
    questions: list[str]
    scores: dict[str, float] = field(default_factory=dict)
    clauses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    latency_ms: float = 0.0


@dataclass
class Verdict:
    case_id: str
    passed: bool
    failures: list[str]
    precision: float | None
    recall: float | None
    pinned_coverage: float | None
    question_precision: float | None
    question_recall: float | None
    drift: float | None
    tiers: Tiers


def _ratio(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def judge(case_id: str, expect: dict[str, Any], tiers: Tiers) -> Verdict:
    failures: list[str] = []
    pinned, relevant, questions = set(tiers.pinned), set(tiers.relevant), set(tiers.questions)
    surfaced = pinned | relevant
    tier_sets = {"pinnedFacts": pinned, "relevantBeliefs": relevant, "openQuestions": questions}

    rel = expect.get("relevantBeliefs", {})
    only = rel.get("shouldOnlyInclude")
    if only is not None and relevant != set(only):
        failures.append(f"relevantBeliefs.shouldOnlyInclude: expected {sorted(only)}, got {sorted(relevant)}")
    for tier_name in ("relevantBeliefs", "pinnedFacts", "openQuestions"):
        spec = expect.get(tier_name, {})
        # relevantBeliefs' include/exclude are judged over pinned ∪ relevant, as the paper did
        pool = surfaced if tier_name == "relevantBeliefs" else tier_sets[tier_name]
        for wanted in spec.get("mustInclude", []):
            if wanted not in pool:
                failures.append(f"{tier_name}.mustInclude: {wanted} missing")
        for banned in spec.get("mustExclude", []):
            if banned in pool:
                failures.append(f"{tier_name}.mustExclude: {banned} present")
        if "maxCount" in spec and len(tier_sets[tier_name]) > spec["maxCount"]:
            failures.append(f"{tier_name}.maxCount: {len(tier_sets[tier_name])} > {spec['maxCount']}")
        if "minCount" in spec and len(tier_sets[tier_name]) < spec["minCount"]:
            failures.append(f"{tier_name}.minCount: {len(tier_sets[tier_name])} < {spec['minCount']}")

    persona = expect.get("personaPrelude", {})
    text = tiers.persona or ""
    if persona.get("nonEmpty") and not text.strip():
        failures.append("personaPrelude.nonEmpty: persona is empty")
    if persona.get("isNull") and tiers.persona is not None:
        failures.append("personaPrelude.isNull: persona is present")
    for word in persona.get("contains", []):
        if word.lower() not in text.lower():
            failures.append(f"personaPrelude.contains: {word!r} missing")
    for word in persona.get("mustNotContain", []):
        if word.lower() in text.lower():
            failures.append(f"personaPrelude.mustNotContain: {word!r} present")

    noise_ids = set(expect.get("noiseCheck", {}).get("mustNotSurface", []))
    noise = sorted(noise_ids & surfaced)
    if noise:
        failures.append(f"noiseCheck.mustNotSurface: {noise} surfaced")

    expected = set(only) if only is not None else set(rel.get("mustInclude", [])) - pinned
    pinned_expected = set(expect.get("pinnedFacts", {}).get("mustInclude", []))
    q_expected = set(expect.get("openQuestions", {}).get("mustInclude", []))
    # drift = noise / (relevant + pinned), 0 when nothing surfaced (paper §7.3); a turn with no
    # noiseCheck has no declared noise, so its drift is 0 by definition
    drift = 0.0 if not surfaced else len(noise) / (len(relevant) + len(pinned))
    return Verdict(
        case_id=case_id,
        passed=not failures,
        failures=failures,
        precision=_ratio(len(expected & relevant), len(relevant)),
        recall=_ratio(len(expected & relevant), len(expected)),
        pinned_coverage=_ratio(len(pinned_expected & pinned), len(pinned_expected)),
        question_precision=_ratio(len(q_expected & questions), len(questions)) if q_expected else None,
        question_recall=_ratio(len(q_expected & questions), len(q_expected)),
        drift=drift,
        tiers=tiers,
    )


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
