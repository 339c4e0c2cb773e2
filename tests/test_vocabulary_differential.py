"""Differential test of the relevance path (issue 16): recall by the tenant's own vocabulary (exact
weighted terms) against today's Lucene query (fuzzy and shingle match clauses), each run with its
tenant alone in a fresh index, must return the same ids, in the same order, with the same scores
(bit for bit): on the paper's 72 cases, the multilingual set, and >= 10,000 generated messages
over a generated corpus (short, long, misspelt, multi-word, code-heavy). Generated messages run
as batched ``_msearch`` requests to keep CI time small. Any difference fails the test and must be
listed and justified in docs/benchmarks.md."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opensearchpy import OpenSearch

from evals.cases import CaseSet, multilingual_case_set, paper_case_set
from evals.generated import generated_beliefs, generated_messages
from evals.runner import run_case_set
from service.config import Settings
from service.recall.query import clean_query
from service.recall.vocabulary import VocabularyMatcher
from service.storage import access, calls, queries
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.storage.local_analysis import LocalAnalysis
from service.storage.templates import apply_templates, drop_namespace
from tests.conftest import SuiteBackend, fingerprint, principal

GENERATED_MESSAGES = 10_200
GENERATED_BELIEFS = 600
BATCH = 100
PARTS = 8  # the generated messages run as eight tests, each well inside the per-test timeout on a busy box
TENANT = "generated"

Alone = Callable[[], BeliefStore]


@pytest.fixture
def alone(os_client: OpenSearch, store: BeliefStore, local_analysis: LocalAnalysis) -> Iterator[Alone]:
    """Fresh namespaces (their own index, no other tenant on any shard), dropped afterwards; the
    recall query analysed in process, as the API does."""
    made: list[str] = []

    def make() -> BeliefStore:
        ns = f"diff-{uuid.uuid4().hex[:8]}"
        apply_templates(os_client, ns)
        made.append(ns)
        return BeliefStore(os_client, ns, store.versions, local_analysis)

    yield make
    for ns in made:
        drop_namespace(os_client, ns)


@pytest.mark.parametrize("case_set", [paper_case_set(), multilingual_case_set()], ids=lambda c: c.name)
def test_case_sets_identical_on_both_paths(alone: Alone, suite_backend: SuiteBackend, case_set: CaseSet) -> None:
    runs = {}
    for path in ("lucene", "vocabulary"):
        store = alone()
        backend = suite_backend(store, relevance=path, name=path)
        runs[path] = run_case_set(case_set, backend, store, static_tenant="static", session_tenant="session")
    lucene, vocabulary = runs["lucene"], runs["vocabulary"]
    assert lucene.passed == vocabulary.passed == case_set.total
    differences = [(a, b) for a, b in zip(fingerprint(lucene), fingerprint(vocabulary), strict=True) if a != b]
    assert differences == []


def _hits(client: OpenSearch, alias: str, routing: str, bodies: list[dict[str, Any] | None]) -> list[list[Any]]:
    """One ``_msearch`` for the bodies; ``None`` (no clause can match) answers no hits."""
    lines: list[dict[str, Any]] = []
    for body in bodies:
        if body is not None:
            lines += [{"index": alias, "routing": routing}, body]
    responses = iter(client.msearch(body=lines)["responses"] if lines else [])
    out: list[list[Any]] = []
    for body in bodies:
        if body is None:
            out.append([])
            continue
        response = next(responses)
        assert "error" not in response, response
        out.append([(h["_id"], h["_score"]) for h in response["hits"]["hits"]])
    return out


@dataclass
class Generated:
    store: BeliefStore
    matcher: VocabularyMatcher
    texts: list[str]


@pytest.fixture(scope="module")
def generated(
    os_client: OpenSearch, store: BeliefStore, settings: Settings, local_analysis: LocalAnalysis
) -> Iterator[Generated]:
    """The generated corpus of one tenant alone in its own index, and the cleaned messages; the
    vocabulary path analyses them in process, as the API does (tests/test_local_analysis.py: the
    same tokens as the node's)."""
    ns = f"diff-{uuid.uuid4().hex[:8]}"
    apply_templates(os_client, ns)
    # a patient client: 20,000 searches and the corpus load share the box with the rest of CI
    patient = build_client(settings.model_copy(update={"opensearch_timeout_s": 300.0}))
    try:
        alone = BeliefStore(patient, ns, store.versions, local_analysis)
        beliefs = generated_beliefs(TENANT, "ann", GENERATED_BELIEFS)
        for start in range(0, len(beliefs), 100):
            assert not alone.put_many(beliefs[start : start + 100], refresh="true").failed
        limit = settings.recall.max_query_chars
        texts = [clean_query(m, max_chars=limit).text for m in generated_messages(beliefs, GENERATED_MESSAGES)]
        yield Generated(alone, VocabularyMatcher.for_store(alone, settings.recall), [t for t in texts if t])
    finally:
        drop_namespace(os_client, ns)
        patient.close()


def test_enough_generated_messages(generated: Generated) -> None:
    assert len(generated.texts) >= 10_000


@pytest.mark.parametrize("part", range(PARTS))
def test_generated_messages_identical_on_both_paths(generated: Generated, settings: Settings, part: int) -> None:
    every = generated.texts
    store, texts = generated.store, every[part * len(every) // PARTS : (part + 1) * len(every) // PARTS]
    me = principal(TENANT, "ann")
    filters = access.for_principal(me, ScopeView.everything())
    limits = settings.recall

    def body(text: str, clauses: list[dict[str, Any]] | None) -> dict[str, Any]:
        return queries.relevant_body(
            filters, text, size=limits.max_beliefs, min_score=limits.min_score, clauses=clauses
        )

    differences: list[tuple[str, Any, Any]] = []
    answered = fuzzy = long_messages = 0
    for start in range(0, len(texts), BATCH):
        batch = texts[start : start + BATCH]
        lucene = _hits(store.client, store.alias, TENANT, [body(t, None) for t in batch])
        resolved = generated.matcher.clauses_many(me, batch)
        bodies = [body(t, c) if c else None for t, c in zip(batch, resolved, strict=True)]
        vocabulary = _hits(store.client, store.alias, TENANT, bodies)
        for text, clauses, a, b in zip(batch, resolved, lucene, vocabulary, strict=True):
            if a != b:
                differences.append((text, a, b))
            answered += bool(a)
            fuzzy += bool(a) and '"boost": 0.' in json.dumps(clauses)  # a one-edit term was in play
            long_messages += len(text.split()) > queries.MAX_FUZZY_WORDS
    assert differences[:5] == [] and len(differences) == 0
    # the generated set reaches every part of the relevance clauses, not just the easy cases
    assert answered > len(texts) // 2
    assert fuzzy > len(texts) // 10
    assert long_messages > len(texts) // 10
    assert calls.run(store.client, store.vocabulary.local_analysis_reads()) is not None  # analysed in process
