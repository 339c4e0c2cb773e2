"""Render a recall result as the injection block the proxy puts in the system prompt (paper §6.2).

Two parts, for prompt caching: ``beliefs`` (stable: instructions, persona, pinned facts) and
``dynamic`` (query-surfaced beliefs and open questions). ``why_it_matters`` is each belief's
directive; inferred, exploratory and low-confidence beliefs carry an explicit hedge.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from service.domain.belief import Belief, BeliefType, EpistemicStatus
from service.domain.text import clip
from service.recall.context import RecallResult, TierEntry

LOW_CONFIDENCE = 0.65

BELIEF_INSTRUCTIONS = "\n".join(
    [
        "You have persistent memory of this user.",
        "The <persona> block describes who they are and how they want to be engaged"
        " — standing context, not facts to quote.",
        "The <scope> block narrows that persona to the current domain.",
        "<pinned_facts> are standing constraints — treat them as hard requirements that shape every answer.",
        "<relevant_beliefs> are query-surfaced context — use them to disambiguate and inform, not as hard constraints.",
        "For each belief, the why_it_matters field is the primary action directive:"
        " it tells you what to change in your response.",
        "Beliefs with epistemic_status 'inferred' are system hypotheses — hold them loosely.",
        "Beliefs with epistemic_status 'exploratory' are unresolved — do not treat them as settled.",
        f"Beliefs with confidence below {LOW_CONFIDENCE} are low-certainty — weight them accordingly.",
        "Treat open questions as unresolved; do not invent closure.",
    ]
)

_HEDGES = {
    EpistemicStatus.INFERRED: "inferred, not confirmed by the user: hold loosely",
    EpistemicStatus.EXPLORATORY: "exploratory, not settled: do not treat as decided",
}


@dataclass(frozen=True)
class InjectionBlock:
    beliefs: str
    dynamic: str

    @property
    def text(self) -> str:
        return "\n\n".join(p for p in (self.beliefs, self.dynamic) if p)

    @property
    def beliefs_end(self) -> int:
        """``text[:beliefs_end]`` is :attr:`beliefs` (the response sends the block once)."""
        return len(self.beliefs)

    @property
    def dynamic_start(self) -> int:
        """``text[dynamic_start:]`` is :attr:`dynamic`."""
        return len(self.text) - len(self.dynamic)


def _clip(text: str, limit: int) -> str:
    """At most ``limit`` characters with an ellipsis, never cutting a grapheme in two."""
    return text if len(text) <= limit else clip(text, limit - 1).rstrip() + "…"


def project(belief: Belief, *, max_chars: int, surfaced_by_search: bool) -> dict[str, Any]:
    """The lean projection: only fields that change what the model should do."""
    out: dict[str, Any] = {
        "id": belief.id,
        "canonical_name": belief.canonical_name,
        "content": _clip(belief.content, max_chars),
        "why_it_matters": belief.why_it_matters,
    }
    if belief.type in (BeliefType.DECISION, BeliefType.OPEN_QUESTION):
        out["type"] = belief.type.value
    if belief.type is BeliefType.RELATION and belief.relation_type:
        # what links the participants (`depends_on`, `uses`) changes how the model reads the content
        out["type"] = belief.type.value
        out["relation_type"] = belief.relation_type
    if belief.epistemic_status is not EpistemicStatus.ACTIVE:
        out["epistemic_status"] = belief.epistemic_status.value
    if belief.confidence < LOW_CONFIDENCE:
        out["confidence"] = belief.confidence
    hedge = _HEDGES.get(belief.epistemic_status)
    if hedge is None and belief.confidence < LOW_CONFIDENCE:
        hedge = "low confidence: weight accordingly"
    if hedge:
        out["hedge"] = hedge
    if surfaced_by_search and belief.aliases:
        out["aliases"] = belief.aliases
    return out


# Characters a belief's text must not carry into the prompt as themselves: the angle brackets that
# open and close the injection's tags (and the sidecar markers), the ampersand, and the bidi and
# line-separator characters that can hide or reorder what follows. Inside JSON strings they are
# written as \uXXXX escapes: the same JSON value, but no tag can be opened or closed.
_PROMPT_ESCAPES = {
    ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
}
# Plain text between tags (the persona) has no escape syntax: the brackets become look-alikes.
_TEXT_ESCAPES = {ord("<"): "\u2039", ord(">"): "\u203a"} | {k: "" for k in _PROMPT_ESCAPES if chr(k) not in "<>&"}


def prompt_json(value: Any) -> str:
    """JSON for the injection block: any text in ``value`` stays inside its string."""
    return json.dumps(value, ensure_ascii=False).translate(_PROMPT_ESCAPES)


def prompt_text(text: str) -> str:
    """Plain text for a tag's body: it cannot open or close a tag."""
    return text.translate(_TEXT_ESCAPES)


def _json(entries: list[TierEntry], *, max_chars: int, searched: bool) -> str:
    return prompt_json([project(e.belief, max_chars=max_chars, surfaced_by_search=searched) for e in entries])


def render_injection(result: RecallResult, *, max_chars_per_belief: int = 400) -> InjectionBlock:
    stable = [BELIEF_INSTRUCTIONS]
    if result.persona:
        stable.append(f"<persona>{prompt_text(result.persona)}</persona>")
    if result.scopes:
        stable.append(f"<scope>{prompt_text(', '.join(result.scopes))}</scope>")
    stable.append(
        f"<pinned_facts>{_json(result.pinned, max_chars=max_chars_per_belief, searched=False)}</pinned_facts>"
    )
    dynamic = [
        f"<relevant_beliefs>{_json(result.relevant, max_chars=max_chars_per_belief, searched=True)}</relevant_beliefs>"
    ]
    if result.questions:
        questions = [
            {
                "id": e.belief.id,
                "canonical_name": e.belief.canonical_name,
                "content": _clip(e.belief.content, max_chars_per_belief),
                "scope": e.belief.scope,
            }
            for e in result.questions
        ]
        dynamic.append("### Open Questions\n" + prompt_json(questions))
    return InjectionBlock(beliefs="\n".join(stable), dynamic="\n".join(dynamic))
