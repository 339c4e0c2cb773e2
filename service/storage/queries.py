"""Query bodies for belief recall. Pure functions: each takes the :class:`~access.AccessFilters`
the chokepoint built for the caller, so none can be built without them.

Boost constants follow the paper's Atlas Search query (§3.4); each is a named constant with the
reason it has the weight it has. Because the search fields use the ``boolean`` similarity, a hit's
score is the sum of ``boost x fuzzy factor`` over the whole units it matched: 14 for a canonical
name or a multi-word alias, 5 for a single-word alias (x0.8-0.95 when matched with one edit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.domain import scopes as scope_rules
from service.domain.belief import BeliefType, Lifecycle, Subtype
from service.domain.text import has_hangul, has_unspaced_script
from service.storage.access import AccessFilters

# A canonical name is the belief's own deliberate name; matching it whole is the strongest
# evidence there is that the query is about this belief.
CANONICAL_BOOST = 14.0
# The same, for multi-word canonical names matched by a 2-3 word shingle of the query
# (stop-words removed first, so "the error handling" still reaches error_handling).
CANONICAL_PHRASE_BOOST = 14.0
# Single-word aliases are loose handles (abbreviations, counter-signals like "mongoose", generic
# words like "error"): worth enough to clear MIN_SCORE alone, never enough to outrank a name.
ALIAS_WORD_BOOST = 5.0
# A multi-word alias matched whole ("class hierarchies", "allkeys-lru") is as specific as a name.
ALIAS_PHRASE_BOOST = 14.0
# One edit for terms of 4+ characters, exact below (the paper: "short aliases like k8s, TS and GHA
# use exact matching only"; a 3-letter word with a 2-letter prefix guard has little room for a
# typo and each fuzzy word costs an automaton); the first two characters must match (prefix
# guard), so mango never reaches mongo.
FUZZINESS = "AUTO:4,10000"
PREFIX_LENGTH = 2
MAX_FUZZY_EXPANSIONS = 20

CLAUSES = ("canonical_name", "canonical_name.phrase", "aliases", "aliases.shingle")

# Text in a script without spaces between words (Japanese, Chinese, Thai, ...) is searched on the
# ``.cjk*`` sub-fields instead: the ICU tokenizer segments names and query alike, a name is still
# one whole unit, and the query's 2-6 word shingles must equal it (index_templates/README.md).
# Latin-script words inside such text keep the one-edit fuzz of English text (``.cjk_latin``);
# every other token matches exactly (``.cjk``), because one kanji or hanzi is a whole word:
# テスト方法 must never reach テスト方針, nor 数据集 数据库. Each sub-field carries its own search
# analyzer, so no clause names an analyzer: an index not yet upgraded to these fields (before
# ``tenure reindex beliefs``) answers such queries with no hits instead of an error.
#
# Korean separates words with spaces but attaches particles and endings to them (레디스의 설정 is
# 레디스 + 의 + 설정): the ICU tokenizer keeps 레디스의 as one word, which no name equals. Text with
# Hangul therefore also runs the ``.ko`` clauses (nori tokenizer, particles and endings dropped,
# names still whole units), beside the ``.cjk`` ones (index_templates/README.md has the measurement).

LIVE = {"term": {"lifecycle": Lifecycle.LIVE.value}}
# Read-only views leave these out of a stored source: the change log and its ref (they only matter
# to a read that writes the belief back, or shows its history: those read the whole document and
# its log document, service/storage/change_logs.py; ``change_log`` itself is only still in
# documents written before the log moved out) and the derived, indexed-only fields the model
# ignores on load (``lifecycle``, ``content_hash``; the analysed ``vocabulary_units`` are kept out
# of ``_source`` by the mapping).
SOURCE_EXCLUDES = ["change_log", "change_log_ref", "lifecycle", "content_hash"]
# The recall tiers take the whole stored source instead: any ``_source`` filter makes OpenSearch
# parse every hit's source and write it out again, and that cost more than the ~100 bytes a hit it
# saved (1M beliefs, the same searches: OpenSearch CPU per search -19 to -20 % with the filter
# tiers, -12 to -17 % for the relevant tier alone; docs/benchmarks.md, benchmarks/source_filter_ab.py).
# Recall decodes a hit without those fields, an inline change log included
# (service/storage/unreadable.py, DecodedBeliefs), so the beliefs are the same as with the filter.
_WHOLE_SOURCE = True

# What a read of beliefs by id uses of a search answer (no hits: no ``hits`` key).
BY_IDS_FILTER_PATH = "hits.hits._id,hits.hits._source"


def found_hits(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The hits of a search answer (or of one ``_msearch`` item), also when ``filter_path`` left
    no ``hits`` key because there were none."""
    hits: list[dict[str, Any]] = result.get("hits", {}).get("hits", [])
    return hits


# Single words are matched after dropping the phrase-side stop-words ("the", "what", ...): no alias
# is a stop-word, and fuzzing them only costs (one Levenshtein automaton per word and field) and
# risks false hits ("for" -> "fork"). Multi-word clauses keep every word so shingles stay adjacent.
WORD_ANALYZER = "tenure_query_terms"


# Long messages: only the first words are fuzz-matched (each fuzzy word costs a Levenshtein
# automaton per field, which dominates the latency of a 100-word message); later words still match
# exactly. Front-biased like the paper's 1000-character clamp: the intent is usually stated first.
MAX_FUZZY_WORDS = 32


def distinct_words(text: str) -> str:
    """Each whitespace-separated word once, in order. A word repeated in a long message would
    otherwise add its boost again and cost another fuzzy expansion per field."""
    seen: set[str] = set()
    out: list[str] = []
    for word in text.split():
        key = word.lower()
        if key not in seen:
            seen.add(key)
            out.append(word)
    return " ".join(out)


def relevance_clauses(
    text: str,
    *,
    fuzzy: bool = True,
    use_aliases: bool = True,
    word_analyzer: str | None = WORD_ANALYZER,
    korean: bool | None = None,
) -> list[dict[str, Any]]:
    """The four relevance clauses. ``word_analyzer=None`` searches words with each field's own
    search analyzer (the standard-analyzer ablation needs that). Text in a script written
    without spaces gets the ``.cjk`` clauses instead (:func:`unspaced_clauses`)."""
    if has_unspaced_script(text):
        return unspaced_clauses(text, fuzzy=fuzzy, use_aliases=use_aliases, korean=korean)
    words = distinct_words(text).split()
    head, tail = (words[:MAX_FUZZY_WORDS], words[MAX_FUZZY_WORDS:]) if fuzzy else ([], words)

    def word(field: str, boost: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for part, fuzz in ((head, True), (tail, False)):
            if not part:
                continue
            body: dict[str, Any] = {"query": " ".join(part), "boost": boost, "_name": field}
            if word_analyzer is not None:
                body["analyzer"] = word_analyzer
            if fuzz:
                body.update(fuzziness=FUZZINESS, prefix_length=PREFIX_LENGTH, max_expansions=MAX_FUZZY_EXPANSIONS)
            out.append({"match": {field: body}})
        return out

    def phrase(field: str, boost: float) -> dict[str, Any]:
        return {"match": {field: {"query": text, "boost": boost, "_name": field}}}

    clauses = [*word("canonical_name", CANONICAL_BOOST), phrase("canonical_name.phrase", CANONICAL_PHRASE_BOOST)]
    if use_aliases:
        clauses += [*word("aliases", ALIAS_WORD_BOOST), phrase("aliases.shingle", ALIAS_PHRASE_BOOST)]
    return clauses


def unspaced_clauses(
    text: str, *, fuzzy: bool = True, use_aliases: bool = True, korean: bool | None = None
) -> list[dict[str, Any]]:
    """Relevance clauses on the ``.cjk*`` sub-fields, with the same boosts as
    :func:`relevance_clauses`: Latin words (fuzzy), every other word (exact), and the 2-6 word
    shingles that reach multi-word names and aliases. Text with Hangul also gets the ``.ko*``
    sub-fields (``korean``: default, whether the text has Hangul): the same words and shingles as
    the Korean analyzer segments them, particles and endings removed."""
    if korean is None:
        korean = has_hangul(text)

    def match(field: str, boost: float, fuzz: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"query": text, "boost": boost, "_name": field}
        if fuzz:
            body.update(fuzziness=FUZZINESS, prefix_length=PREFIX_LENGTH, max_expansions=MAX_FUZZY_EXPANSIONS)
        return {"match": {field: body}}

    def field_clauses(field: str, word_boost: float, shingle_boost: float) -> list[dict[str, Any]]:
        return [
            match(f"{field}.cjk_latin", word_boost, fuzz=fuzzy),
            match(f"{field}.cjk", word_boost),
            match(f"{field}.cjk_shingle", shingle_boost),
            *([match(f"{field}.ko", word_boost), match(f"{field}.ko_shingle", shingle_boost)] if korean else []),
        ]

    clauses = field_clauses("canonical_name", CANONICAL_BOOST, CANONICAL_PHRASE_BOOST)
    if use_aliases:
        clauses += field_clauses("aliases", ALIAS_WORD_BOOST, ALIAS_PHRASE_BOOST)
    return clauses


# ------------------------------------------------------------------ exact weighted terms
# The relevance clauses above, with every query word already resolved to the indexed terms it
# reaches (service/recall/vocabulary.py): no fuzzy rewrite and no shingle clause runs in the
# engine. The nesting mirrors what the match queries become in Lucene (one bool per clause, one
# sub-query per query position), so the engine adds up the same float32 numbers in the same
# groups and the scores are bit for bit those of the Lucene query.

TermWeights = tuple[tuple[str, float], ...]  # indexed terms one query position reaches, with factor


@dataclass(frozen=True)
class WeightedClause:
    """One relevance clause resolved to terms. ``alternatives``: the terms at one position score
    once (shingles: Lucene's SynonymQuery); otherwise each reached term adds (fuzzy expansions)."""

    name: str
    field: str
    boost: float
    positions: tuple[TermWeights, ...]
    alternatives: bool


def _term(field: str, term: str, factor: float) -> dict[str, Any]:
    body: dict[str, Any] = {"value": term}
    if factor != 1.0:
        body["boost"] = factor
    return {"term": {field: body}}


def _position_query(clause: WeightedClause, reached: TermWeights) -> dict[str, Any]:
    terms = [_term(clause.field, term, factor) for term, factor in reached]
    if len(terms) == 1:
        return terms[0]
    if clause.alternatives:
        return {"dis_max": {"queries": terms}}
    return {"bool": {"should": terms}}


def weighted_term_clauses(clauses: list[WeightedClause]) -> list[dict[str, Any]]:
    """The ``should`` clauses of :func:`relevant_body` for resolved clauses; positions that reach
    no term, and clauses with none left, are dropped (they could match nothing)."""
    out: list[dict[str, Any]] = []
    for clause in clauses:
        parts = [_position_query(clause, reached) for reached in clause.positions if reached]
        if parts:
            out.append({"bool": {"should": parts, "boost": clause.boost, "_name": clause.name}})
    return out


def _not_relevant_tier(exclude_ids: list[str] | None) -> list[dict[str, Any]]:
    """What the relevant tier never returns: open questions and expertise (their own tiers), and
    ``exclude_ids``."""
    must_not: list[dict[str, Any]] = [
        {"term": {"type": BeliefType.OPEN_QUESTION.value}},
        {"term": {"subtype": Subtype.EXPERTISE.value}},
    ]
    if exclude_ids:
        must_not.append({"terms": {"id": exclude_ids}})
    return must_not


def relevant_body(
    filters: AccessFilters,
    text: str,
    *,
    size: int,
    min_score: float,
    exclude_ids: list[str] | None = None,
    explain: bool = False,
    clauses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Text search over names and aliases only. Open questions and expertise never come back
    here (they have their own tiers), nor does anything that is not live."""
    must_not = _not_relevant_tier(exclude_ids)
    return {
        "size": size,
        "min_score": min_score,
        "track_total_hits": False,
        "explain": explain,
        "_source": _WHOLE_SOURCE,
        "seq_no_primary_term": True,  # the stored version: hits are decoded once per version
        "query": filters.query(
            LIVE,
            must_not=must_not,
            should=clauses if clauses is not None else relevance_clauses(text),
            minimum_should_match=1,
        ),
        "sort": ["_score", {"last_reinforced_at": {"order": "desc", "missing": "_last"}}, {"id": "asc"}],
    }


# The name of the zero-weight probe in :func:`near_miss_body`: a hit it matches lies inside the
# session's scopes.
IN_SESSION = "in_session_scopes"


def near_miss_body(
    filters: AccessFilters,
    in_session: dict[str, Any],
    text: str,
    *,
    size: int,
    exclude_ids: list[str],
    clauses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Explain only: what the relevant tier's search matches among *everything the principal may
    see* (``filters``), with no threshold and no lifecycle filter, so the explain view can say why
    each was not injected (below the threshold, outside the session's scopes, superseded ...).
    Scores are the relevant tier's own (the same clauses, summed the same way); ``in_session``
    (the session's visibility clause) is a named probe with no weight."""
    must_not = _not_relevant_tier(exclude_ids)
    relevance = clauses if clauses is not None else relevance_clauses(text)
    return {
        "size": size,
        "track_total_hits": False,
        "_source": {"excludes": SOURCE_EXCLUDES},
        "query": filters.query(
            must_not=must_not,
            must=[{"bool": {"should": relevance, "minimum_should_match": 1}}],
            should=[{"constant_score": {"filter": in_session, "boost": 0.0, "_name": IN_SESSION}}],
        ),
        "sort": ["_score", {"id": "asc"}],
    }


def pinned_body(filters: AccessFilters, *, size: int) -> dict[str, Any]:
    """Pinned facts: live, pinned, never open questions, never universal (that is the persona's
    job); ``filters`` from :func:`access.for_pinned` (in the session's scopes, or the owner's
    user-edited ones from any personal scope)."""
    return {
        "size": size,
        "track_total_hits": False,
        "_source": _WHOLE_SOURCE,
        "seq_no_primary_term": True,  # the stored version: hits are decoded once per version
        "query": filters.query(
            LIVE,
            {"term": {"pinned": True}},
            must_not=[
                {"term": {"type": BeliefType.OPEN_QUESTION.value}},
                {"terms": {"scope": list(scope_rules.UNIVERSAL_LABELS)}},
            ],
        ),
        "sort": [
            {"user_edited": {"order": "desc"}},
            {"last_reinforced_at": {"order": "desc", "missing": "_last"}},
            {"id": "asc"},
        ],
    }


def open_questions_body(filters: AccessFilters, *, size: int) -> dict[str, Any]:
    """Pinned, live open questions in the session's scopes. Never text-searched."""
    return {
        "size": size,
        "track_total_hits": False,
        "_source": _WHOLE_SOURCE,
        "seq_no_primary_term": True,  # the stored version: hits are decoded once per version
        "query": filters.query(LIVE, {"term": {"pinned": True}}, {"term": {"type": BeliefType.OPEN_QUESTION.value}}),
        "sort": [{"last_reinforced_at": {"order": "desc", "missing": "_last"}}, {"id": "asc"}],
    }


def persona_body(filters: AccessFilters, *, size: int = 80) -> dict[str, Any]:
    """Universal preferences of the owner (filters already restrict to user:universal)."""
    return {
        "size": size,
        "track_total_hits": False,
        "_source": _WHOLE_SOURCE,
        "seq_no_primary_term": True,  # the stored version: hits are decoded once per version
        "query": filters.query(
            LIVE,
            {"term": {"type": BeliefType.PREFERENCE.value}},
            {"terms": {"epistemic_status": ["active", "inferred"]}},
        ),
        "sort": [
            {"pinned": {"order": "desc"}},
            {"reinforcement_count": {"order": "desc"}},
            {"last_reinforced_at": {"order": "desc", "missing": "_last"}},
            {"id": "asc"},
        ],
    }


def by_ids_body(
    filters: AccessFilters, ids: list[str], *, live_only: bool, include_change_log: bool = True
) -> dict[str, Any]:
    """The given beliefs. ``include_change_log=False``: sources without the change log and the
    derived fields (read-only views: such a belief must never be written back)."""
    extra = [LIVE] if live_only else []
    body: dict[str, Any] = {
        "size": len(ids),
        "track_total_hits": False,
        "query": filters.query(*extra, {"terms": {"id": ids}}),
    }
    if not include_change_log:
        body["_source"] = {"excludes": SOURCE_EXCLUDES}
    return body


def merged_into_body(filters: AccessFilters, merged_ids: list[str], *, size: int) -> dict[str, Any]:
    """The beliefs a compaction retired into one of ``merged_ids`` (their ``superseded_by``)."""
    return {
        "size": size,
        "track_total_hits": False,
        "query": filters.query({"terms": {"superseded_by": merged_ids}}),
        "sort": [{"id": {"order": "asc"}}],
        "seq_no_primary_term": True,
    }


LIST_SORT: list[dict[str, Any]] = [{"created_at": {"order": "asc"}}, {"id": {"order": "asc"}}]


def list_body(
    filters: AccessFilters,
    narrowing: list[dict[str, Any]],
    *,
    text: str | None,
    size: int,
    search_after: list[Any] | None,
    include_change_log: bool = False,
) -> dict[str, Any]:
    """A page of beliefs in a stable order (created_at, id) for cursor pagination. ``text``
    narrows to beliefs whose names or aliases match it (the same analyzers as recall, no fuzz)."""
    query = filters.query(*narrowing)
    if text and has_unspaced_script(text):
        query["bool"]["must"] = [{"bool": {"should": unspaced_clauses(text, fuzzy=False), "minimum_should_match": 1}}]
    elif text:
        query["bool"]["must"] = [{"multi_match": {"query": text, "fields": list(CLAUSES)}}]
    body: dict[str, Any] = {"size": size, "track_total_hits": False, "query": query, "sort": LIST_SORT}
    if not include_change_log:
        body["_source"] = {"excludes": SOURCE_EXCLUDES}
    if search_after is not None:
        body["search_after"] = search_after
    return body
