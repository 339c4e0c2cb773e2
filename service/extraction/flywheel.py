"""The alias-enrichment flywheel (paper §3.7, issue item 5), beyond entity_updates.

The sidecar's ``possible_alias_candidates`` name a surface form the user typed and the beliefs it
may refer to. The rules, conservative because a wrong alias pulls a belief into unrelated turns:

1. The surface must literally occur in the user's message of that turn, as whole words (their own
   vocabulary: not ``go`` inside "going"), must not already be a name or alias of the belief, and
   must resolve to exactly one live belief the user can see; otherwise it is dropped (no entity)
   or queued for review (ambiguous).
2. ``high`` confidence with a single named entity: applied at once.
3. ``medium``: queued as a review item; sightings are counted per distinct turn, and at
   ``alias_candidate_min_sightings`` distinct turns the alias is applied and the item resolved.
4. ``low``: queued for review only, never applied automatically.
5. A belief the author may not change (the API's rule, ``unwritable_scopes``: a shared scope without
   a grant, or its owner's personal scopes) gets no alias applied: the candidate is queued for review.
Items are keyed by (owner, belief, surface), so sightings accumulate across turns and retries of
one turn never count twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.beliefs.lifecycle import BeliefLifecycle, spoken_name, unwritable_scopes
from service.config import MemoryLoopSettings
from service.domain.belief import Belief, normalize_alias
from service.domain.text import has_unspaced_script
from service.errors import Conflict
from service.extraction.merge import MergeContext, alias_review_id, alias_review_item
from service.extraction.validator import AliasCandidate
from service.storage.lookup import BeliefLookup
from service.storage.reviews import ReviewStore


def _word_char(char: str) -> bool:
    # a character of a script written without spaces (Thai, Lao, Myanmar, Khmer, Japanese,
    # Chinese, Korean: service/domain/text.py) may touch the next word
    return char.isalnum() and not has_unspaced_script(char)


def said_as_words(surface: str, said: str) -> bool:
    """Whether ``surface`` occurs in ``said`` as whole words: not ``go`` inside "going", nor
    ``cache`` inside "cached". Where the text is written without spaces (Japanese, Chinese,
    Korean particles, Thai) a surface may touch the next word: ``セッションストアの設定``."""
    start = said.find(surface)
    while start >= 0:
        end = start + len(surface)
        joined_before = start > 0 and _word_char(said[start - 1]) and _word_char(surface[0])
        joined_after = end < len(said) and _word_char(said[end]) and _word_char(surface[-1])
        if not (joined_before or joined_after):
            return True
        start = said.find(surface, start + 1)
    return False


@dataclass(frozen=True)
class CandidateOutcome:
    surface: str
    outcome: str
    belief_id: str | None = None
    review_id: str | None = None


class AliasFlywheel:
    def __init__(self, lifecycle: BeliefLifecycle, reviews: ReviewStore, policy: MemoryLoopSettings):
        self.lifecycle = lifecycle
        self.lookup = BeliefLookup(lifecycle.store)
        self.reviews = reviews
        self.policy = policy

    def process(self, ctx: MergeContext, user_message: str, candidates: list[AliasCandidate]) -> list[CandidateOutcome]:
        said = normalize_alias(user_message)
        return [self._one(ctx, said, c) for c in candidates]

    def _one(self, ctx: MergeContext, said: str, cand: AliasCandidate) -> CandidateOutcome:
        surface = cand.surface
        if not said_as_words(surface, said):
            return CandidateOutcome(surface, "dropped: not in the user's message")
        found: dict[str, Belief] = {}
        for name in cand.possible_entities:
            for belief in self.lookup.by_name_or_alias(ctx.principal, name):
                found[belief.id] = belief
        if not found:
            return CandidateOutcome(surface, "dropped: no such belief")
        if len(found) > 1:
            first = sorted(found)[0]
            rid = self._sighting(ctx, found[first], cand, reason="ambiguous: several beliefs match")
            return CandidateOutcome(surface, "queued: ambiguous", first, rid)
        belief = next(iter(found.values()))
        if surface in belief.aliases or surface == spoken_name(belief.canonical_name):
            return CandidateOutcome(surface, "unchanged: already an alias", belief.id)
        if normalize_alias(surface) in belief.removed_aliases():
            return CandidateOutcome(surface, "dropped: taken back by a person", belief.id)
        # an alias reaches every session of the belief's scopes: one the author may not write (a
        # shared scope without a grant, the owner's personal one) leaves it to an admin's review,
        # as the API refuses the author's add_aliases with a 403
        denied = unwritable_scopes(ctx.principal, belief.scope, owner_id=belief.owner_id)
        if denied:
            reason = f"{cand.confidence}-confidence alias candidate; its author may not write {denied}"
            return CandidateOutcome(
                surface,
                "queued: scopes its author may not write",
                belief.id,
                self._sighting(ctx, belief, cand, reason=reason),
            )
        if cand.confidence == "high" and len(cand.possible_entities) == 1:
            self.apply(ctx, belief.id, surface, trigger="alias candidate (high confidence)")
            return CandidateOutcome(surface, "applied", belief.id)
        rid = self._sighting(ctx, belief, cand, reason=f"{cand.confidence}-confidence alias candidate")
        item = self.reviews.load(ctx.principal.tenant_id, rid)
        if (
            item is not None
            and cand.confidence == "medium"
            and item[0].status == "open"
            and item[0].sightings >= self.policy.alias_candidate_min_sightings
        ):
            self.apply(ctx, belief.id, surface, trigger="alias candidate (repeated sightings)")
            self._close(ctx, rid, "auto_applied", belief.id)
            return CandidateOutcome(surface, "applied: repeated sightings", belief.id, rid)
        return CandidateOutcome(surface, "queued", belief.id, rid)

    def apply(self, ctx: MergeContext, belief_id: str, surface: str, *, trigger: str) -> Belief:
        updated, _, _ = self.lifecycle.add_aliases(
            ctx.change(f"flywheel|{belief_id}|{surface}"),
            belief_id,
            [surface],
            trigger=trigger,
            tenant_wide=ctx.principal.is_admin,
            keep_removed_out=True,
        )
        return updated

    def _sighting(self, ctx: MergeContext, belief: Belief, cand: AliasCandidate, *, reason: str) -> str:
        rid = alias_review_id(ctx.principal, belief.id, cand.surface)
        for _ in range(3):
            loaded = self.reviews.load(ctx.principal.tenant_id, rid)
            if loaded is None:
                proposed = {"confidence": cand.confidence, "possible_entities": cand.possible_entities}
                if self.reviews.create(alias_review_item(ctx, belief, cand.surface, reason=reason, proposed=proposed)):
                    return rid
                continue
            item, seq, term = loaded
            if ctx.turn_id in item.turn_ids or item.status != "open":
                return rid
            item.turn_ids = [*item.turn_ids, ctx.turn_id][-50:]
            item.sightings += 1
            try:
                self.reviews.save(item, seq_no=seq, primary_term=term)
                return rid
            except Conflict:
                continue
        return rid

    def _close(self, ctx: MergeContext, rid: str, resolution: str, belief_id: str) -> None:
        loaded = self.reviews.load(ctx.principal.tenant_id, rid)
        if loaded is None:
            return
        item, seq, term = loaded
        item.status = "resolved"
        item.resolution = resolution
        item.resolved_at = ctx.now
        item.resolved_by = ctx.principal.user_id
        item.result_belief_id = belief_id
        self.reviews.save(item, seq_no=seq, primary_term=term)
