"""The persona prelude: who the user is and how they want to be engaged (paper §5.4).

Without an LLM configured it is rendered deterministically from the owner's universal
preferences: expertise first, then communication style, then the rest; inferred preferences are
phrased as tendencies, exploratory ones omitted. Same beliefs in, same text out.
"""

from __future__ import annotations

from service.domain.belief import Belief, EpistemicStatus, Subtype
from service.domain.text import clip


def _rank(belief: Belief) -> int:
    if belief.subtype is Subtype.EXPERTISE:
        return 0
    if belief.subtype is Subtype.STYLE:
        return 1
    return 2


def _sentence(belief: Belief) -> str:
    # one paragraph: a line break in a preference's text would start a line of the injection block
    # of its own (a markdown heading, a forged section, an instruction-like line)
    text = " ".join(belief.content.split())
    if not text.endswith((".", "!", "?")):
        text += "."
    if belief.epistemic_status is EpistemicStatus.INFERRED:
        text = f"(tendency, unconfirmed) {text}"
    return text


def render_persona(preferences: list[Belief], *, max_chars: int) -> str | None:
    """``None`` when the user has no universal preferences yet (cold start)."""
    usable = [b for b in preferences if b.epistemic_status in (EpistemicStatus.ACTIVE, EpistemicStatus.INFERRED)]
    if not usable or max_chars <= 0:
        return None
    ordered = sorted(usable, key=_rank)  # stable: keeps the store's pinned/reinforcement order
    parts: list[str] = []
    used = 0
    for belief in ordered:
        sentence = _sentence(belief)
        extra = len(sentence) + (1 if parts else 0)
        if used + extra > max_chars:
            if not parts:
                parts.append(clip(sentence, max_chars - 1).rstrip() + "…")  # between graphemes
            break
        parts.append(sentence)
        used += extra
    return " ".join(parts)
