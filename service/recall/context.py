"""The context builder: (principal, session scopes, query, budget) -> the four tiers (paper §5.2).

1. persona prelude    universal preferences, rendered (§5.4)
2. pinned facts       pinned, in scope (or the owner's user-edited ones from any personal scope)
3. relevant beliefs   alias-weighted BM25 over names/aliases, >= min_score, filling what pinned left
4. open questions     pinned open questions in scope (never text-searched)
plus one hop of relation expansion: a relation hit brings in the beliefs it links, under the same
filters; a linked open question joins tier 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from opensearchpy import AsyncOpenSearch
from pydantic import BaseModel, ConfigDict, Field

from service.config import RecallDefaults
from service.domain.belief import Belief, BeliefType, Lifecycle, Subtype
from service.domain.principal import Principal
from service.recall.persona import render_persona
from service.recall.query import CleanQuery, clean_query
from service.recall.tier_cache import TierCache
from service.recall.tiers import Tier
from service.recall.vocabulary import VocabularyMatcher
from service.storage import calls
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore, ClauseMatch, NearMiss, ScoredBelief, TierMemo
from service.storage.calls import Reads

# How many versions past a superseded participant the relation hop follows (a read each).
MAX_SUCCESSOR_HOPS = 8


class RecallBudget(BaseModel):
    """Per-request caps; anything unset falls back to the deployment's defaults."""

    max_beliefs: int | None = Field(None, ge=0, le=200, alias="maxBeliefs")
    max_pinned_facts: int | None = Field(None, ge=0, le=100, alias="maxPinnedFacts")
    max_questions: int | None = Field(None, ge=0, le=100, alias="maxQuestions")
    max_chars_per_belief: int | None = Field(None, ge=40, le=10_000, alias="maxCharsPerBelief")
    max_persona_chars: int | None = Field(None, ge=0, le=10_000, alias="maxPersonaChars")
    min_score: float | None = Field(None, ge=0.0, le=1000.0, alias="minScore")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def resolve(self, defaults: RecallDefaults) -> RecallDefaults:
        # model_copy, not a new RecallDefaults(): constructing pydantic-settings re-reads the
        # environment (~2.5 ms), and the overrides were already validated by this model
        overrides = {k: v for k, v in self.model_dump().items() if v is not None}
        return defaults.model_copy(update=overrides) if overrides else defaults


def resolve_budget(budget: RecallBudget | None, defaults: RecallDefaults) -> RecallDefaults:
    """The limits of one recall: ``defaults`` with ``budget``'s overrides. Most recalls send no
    budget: they get ``defaults`` as they are, without an empty model built and dumped each time."""
    return defaults if budget is None else budget.resolve(defaults)


@dataclass(frozen=True)
class TierEntry:
    belief: Belief
    score: float | None = None
    clauses: tuple[ClauseMatch, ...] = ()
    via_relation: str | None = None


@dataclass
class RecallResult:
    scopes: list[str]
    query: CleanQuery
    persona: str | None
    # one field per Tier, named by its value (checked below)
    pinned: list[TierEntry]
    relevant: list[TierEntry]
    questions: list[TierEntry]
    truncated: bool = False
    notes: list[dict[str, Any]] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)  # stored documents skipped (unloadable)

    def tiers(self) -> dict[Tier, list[TierEntry]]:
        """The injected tiers by name, in injection order (the persona is rendered apart, as the
        preamble). Receipts, the proxy's turn record and its response metadata, the recall
        response and the console all read this."""
        return {tier: getattr(self, tier.value) for tier in Tier}

    def tier_ids(self) -> dict[str, list[str]]:
        """The injected ids by tier name (plain strings: this goes into records and JSON)."""
        return {tier.value: [e.belief.id for e in entries] for tier, entries in self.tiers().items()}

    @property
    def pinned_ids(self) -> list[str]:
        return [e.belief.id for e in self.pinned]

    @property
    def relevant_ids(self) -> list[str]:
        return [e.belief.id for e in self.relevant]

    @property
    def question_ids(self) -> list[str]:
        return [e.belief.id for e in self.questions]

    @property
    def injected_ids(self) -> list[str]:
        return [belief_id for ids in self.tier_ids().values() for belief_id in ids]


# RecallResult.tiers() reads one field per tier: a tier without its field fails at import
if missing := {tier.value for tier in Tier} - {f.name for f in fields(RecallResult)}:
    raise TypeError(f"RecallResult has no field for the tiers {sorted(missing)}")


def _why_not(miss: NearMiss, min_score: float) -> dict[str, str]:
    """The first reason a matched belief was not injected: its lifecycle, the session's scopes,
    the threshold, or (all passed) the budget."""
    belief = miss.belief
    if belief.lifecycle is Lifecycle.SUPERSEDED:
        return {"reason": "superseded", "outcome": f"not injected: superseded by {belief.superseded_by}"}
    if belief.lifecycle is not Lifecycle.LIVE:
        return {"reason": belief.lifecycle.value, "outcome": f"not injected: {belief.lifecycle.value}"}
    if not miss.in_session:
        scopes = ", ".join(belief.scope)
        return {"reason": "out_of_scope", "outcome": f"filtered by scope: {scopes} is outside this session's scopes"}
    if miss.score < min_score:
        return {"reason": "below_threshold", "outcome": f"below the threshold: score {miss.score:.2f} < {min_score:g}"}
    return {"reason": "budget", "outcome": "not injected: above the threshold, beyond the max_beliefs budget"}


class ContextBuilder:
    """``matcher``: relevance from the tenant's own vocabulary (service/recall/vocabulary.py),
    else the Lucene fuzzy/shingle query. ``tier_cache``: reuse the filter tiers, and the relevant
    tier of a repeated message (not for ``explain``), until the tenant writes (only builds that
    pass the tenant's ``write_version`` use it; service/recall/tier_cache.py)."""

    def __init__(
        self,
        store: BeliefStore,
        defaults: RecallDefaults,
        matcher: VocabularyMatcher | None = None,
        tier_cache: TierCache | None = None,
    ):
        self.store = store
        self.defaults = defaults
        # Set: relevance is matched from the tenant's own vocabulary and sent as exact weighted
        # terms (service/recall/vocabulary.py); unset: the Lucene fuzzy/shingle query.
        self.matcher = matcher
        self.tier_cache = tier_cache

    def build(
        self,
        principal: Principal,
        scopes: list[str],
        message: str,
        budget: RecallBudget | None = None,
        **options: Any,
    ) -> RecallResult:
        """:meth:`build_reads` run with the synchronous client (tasks, console, evals, scripts).
        Without the tenant's ``write_version`` the vocabulary's is read from Redis here (the filter
        tiers are then not cached), as the API's path has it from the rate limit."""
        if self.matcher is not None:
            version = options.get("write_version")
            if version is None:
                options["vocabulary_version"] = self.matcher.current_version(principal.tenant_id)
        return calls.run(self.store.client, self.build_reads(principal, scopes, message, budget, **options))

    async def abuild(
        self,
        client: AsyncOpenSearch,
        principal: Principal,
        scopes: list[str],
        message: str,
        budget: RecallBudget | None = None,
        **options: Any,
    ) -> RecallResult:
        """:meth:`build_reads` run with the asynchronous client (the API and the proxy, on the
        event loop): the same requests, the same result."""
        return await calls.arun(client, self.build_reads(principal, scopes, message, budget, **options))

    def build_reads(
        self,
        principal: Principal,
        scopes: list[str],
        message: str,
        budget: RecallBudget | None = None,
        *,
        explain: bool = False,
        search_clauses: list[dict[str, Any]] | None = None,
        write_version: int | None = None,
        vocabulary_version: int | None = None,
    ) -> Reads[RecallResult]:
        """The tiers for one message, as OpenSearch requests (:mod:`service.storage.calls`).
        ``write_version``: the tenant's, read with the rate limit: the filter tiers and the
        vocabulary may come from the caches; ``vocabulary_version`` (without it): only the
        vocabulary may."""
        limits = resolve_budget(budget, self.defaults)
        memo = self.tier_cache.bind(principal.tenant_id, write_version) if self.tier_cache is not None else None
        view = ScopeView.session(scopes)
        query = clean_query(message, max_chars=limits.max_query_chars)
        # clauses from the tenant's own vocabulary are exact terms: the relevant tier's answer then
        # depends on the tenant's documents only and may be cached (given clauses may be anything)
        exact = search_clauses is None and self.matcher is not None
        if search_clauses is None and self.matcher is not None and query.text and limits.max_beliefs > 0:
            version = write_version if write_version is not None else vocabulary_version
            search_clauses = yield from self.matcher.clauses_reads(principal, query.text, version=version)
        hits = yield from self.store.recall_candidates_reads(
            principal,
            view,
            query.text,
            max_relevant=limits.max_beliefs,
            max_pinned=limits.max_pinned_facts,
            max_questions=limits.max_questions,
            min_score=limits.min_score,
            explain=explain,
            clauses=search_clauses,
            memo=memo,
            cache_relevant=exact,
        )
        relevant = [TierEntry(h.belief, h.score, h.clauses) for h in hits.relevant]
        questions = [TierEntry(b) for b in hits.questions]
        yield from self._expand_relations(
            principal, view, hits.relevant, relevant, questions, limits.max_questions, memo
        )

        pinned_ids = {b.id for b in hits.pinned}
        notes: list[dict[str, Any]] = []
        if explain:
            notes += [
                {"id": e.belief.id, "tier": Tier.RELEVANT.value, "outcome": "deduplicated: already pinned"}
                for e in relevant
                if e.belief.id in pinned_ids
            ]
        relevant = [e for e in relevant if e.belief.id not in pinned_ids]
        combined = [TierEntry(b) for b in hits.pinned] + relevant
        truncated = len(combined) > limits.max_beliefs
        kept = combined[: limits.max_beliefs]
        if explain and truncated:
            notes += [
                {
                    "id": e.belief.id,
                    "tier": (Tier.PINNED if e.score is None else Tier.RELEVANT).value,
                    "outcome": "evicted: budget max_beliefs",
                }
                for e in combined[limits.max_beliefs :]
            ]
        n_pinned = min(len(hits.pinned), len(kept))
        if explain and query.text and limits.max_beliefs > 0:
            explained = {n["id"] for n in notes} | {e.belief.id for e in [*kept, *questions]}
            notes += yield from self._near_misses(
                principal, view, query.text, limits.min_score, explained, search_clauses
            )
        return RecallResult(
            scopes=list(view.labels or []),
            query=query,
            persona=render_persona(hits.persona, max_chars=limits.max_persona_chars),
            pinned=kept[:n_pinned],
            relevant=kept[n_pinned:],
            questions=questions,
            truncated=truncated,
            notes=notes,
            quarantined=list(dict.fromkeys(hits.quarantined)),  # one document may match several tiers
        )

    def _near_misses(
        self,
        principal: Principal,
        view: ScopeView,
        text: str,
        min_score: float,
        explained: set[str],
        clauses: list[dict[str, Any]] | None,
    ) -> Reads[list[dict[str, Any]]]:
        """Why candidates the message named were not injected, for the explain view: only
        beliefs this principal may see (the chokepoint's filters), so a preview as a colleague
        never shows the admin's own or another colleague's beliefs."""
        misses = yield from self.store.near_misses_reads(
            principal, view, text, exclude_ids=sorted(explained), clauses=clauses
        )
        return [
            {
                "id": m.belief.id,
                "name": m.belief.canonical_name,
                "tier": "relevant",
                "score": round(m.score, 2),
                "matched": [c.clause for c in m.clauses],
                **_why_not(m, min_score),
            }
            for m in misses
            if m.belief.id not in explained
        ]

    def _expand_relations(
        self,
        principal: Principal,
        view: ScopeView,
        hits: list[ScoredBelief],
        relevant: list[TierEntry],
        questions: list[TierEntry],
        max_questions: int,
        memo: TierMemo | None,
    ) -> Reads[None]:
        """One hop: beliefs linked by a relation hit join the relevant tier (questions join tier 4);
        the read by id may come from the tier cache (``memo``) like the tiers."""
        relations = [h for h in hits if h.belief.type is BeliefType.RELATION]
        if not relations:
            return
        wanted = [pid for r in relations for pid in r.belief.participants]
        linked = yield from self._current_versions(principal, view, wanted, memo)
        seen = {e.belief.id for e in relevant} | {e.belief.id for e in questions}
        # each relation's participants follow it (they carry its score): the budget, which cuts the
        # relevant tier from its end, keeps them before weaker hits
        brought: dict[str, list[TierEntry]] = {}
        for relation in relations:
            for pid in relation.belief.participants:
                belief = linked.get(pid)
                if belief is None or belief.id in seen or belief.subtype is Subtype.EXPERTISE:
                    continue
                seen.add(belief.id)
                if belief.type is BeliefType.OPEN_QUESTION:
                    if len(questions) < max_questions:
                        questions.append(TierEntry(belief, via_relation=relation.belief.id))
                else:
                    brought.setdefault(relation.belief.id, []).append(
                        TierEntry(
                            belief,
                            relation.score,
                            (ClauseMatch(_relation_clause(relation.belief), relation.score, relation.belief.id),),
                            relation.belief.id,
                        )
                    )
        relevant[:] = [each for entry in relevant for each in (entry, *brought.get(entry.belief.id, ()))]

    def _current_versions(
        self, principal: Principal, view: ScopeView, ids: list[str], memo: TierMemo | None
    ) -> Reads[dict[str, Belief]]:
        """The live version of each belief ``ids`` names, by the id named: the belief itself, or
        the version that superseded it (a participant is named by id, and a belief changes only by
        a new version: without this, updating a belief cut it off every relation naming it). Read
        under the caller's filters, like the beliefs named; followed only where the new version
        names the old one back (or both come from one compaction), at most
        :data:`MAX_SUCCESSOR_HOPS` versions on. One read when nothing named was superseded."""
        current: dict[str, Belief] = {}
        # the id named -> (the id to read now, the version it supersedes: None for the one named)
        reading: dict[str, tuple[str, Belief | None]] = {pid: (pid, None) for pid in ids}
        for _ in range(MAX_SUCCESSOR_HOPS + 1):
            if not reading:
                break
            wanted = [read for read, _ in reading.values()]
            found = yield from self.store.get_many_reads(principal, wanted, view=view, live_only=False, memo=memo)
            by_id = {b.id: b for b in found}
            following: dict[str, tuple[str, Belief | None]] = {}
            for named, (read, older) in reading.items():
                belief = by_id.get(read)
                if belief is None or (older is not None and not _succeeds(belief, older)):
                    continue
                if belief.is_live:
                    current[named] = belief
                elif belief.lifecycle is Lifecycle.SUPERSEDED and belief.superseded_by:
                    following[named] = (belief.superseded_by, belief)
            reading = following
        return current


def _succeeds(new: Belief, old: Belief) -> bool:
    """``new`` is the version that superseded ``old`` (which names it in ``superseded_by``): it names
    ``old`` back, or a compaction merged ``old`` into it (the merged belief names only the source it
    kept), with the same owner. A one-sided link is not followed."""
    named_back = new.supersedes == old.id or bool(new.compaction_note and old.compaction_note)
    return named_back and new.owner_id == old.owner_id and new.tenant_id == old.tenant_id


def _relation_clause(relation: Belief) -> str:
    """The explain clause of a belief brought in by a relation: ``relation``, or with the relation's
    type, ``relation.depends_on``."""
    return f"relation.{relation.relation_type}" if relation.relation_type else "relation"
