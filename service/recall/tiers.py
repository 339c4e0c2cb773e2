"""The recall tiers: defined once, here, as data (paper §5.2).

A recall returns the persona (rendered as the preamble, not a tier) and three injected tiers, in
injection order. Everything that lists tiers derives the list from :class:`Tier`: the
``RecallResult`` (one field per tier, named by its value), the ``POST /v1/recall`` response model
and its example, injection receipts, the proxy's turn record and ``tenure`` metadata, the
console's playground and the CLI. A new tier is one member here plus the field of that name.
"""

from __future__ import annotations

from enum import StrEnum


class Tier(StrEnum):
    PINNED = "pinned"  # pinned beliefs in scope (and the owner's user-edited ones from any personal scope)
    RELEVANT = "relevant"  # alias-weighted BM25 over names and aliases, >= min_score
    QUESTIONS = "questions"  # pinned open questions in scope, never text-searched

    @property
    def heading(self) -> str:
        """How a person reads the tier's name (the console)."""
        return _HEADINGS[self]


_HEADINGS = {Tier.PINNED: "Pinned", Tier.RELEVANT: "Relevant", Tier.QUESTIONS: "Open questions"}
