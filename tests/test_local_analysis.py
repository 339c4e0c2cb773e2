"""The recall query analysed in the API process by the node's own analysis code (issue 16,
``service/storage/local_analysis.py``): the same tokens as the node's ``_mtermvectors`` for every
search analyzer of the name fields, on the paper's and the multilingual cases' messages and on
generated ones; used only after the check against the node; anything it cannot vouch for (another
version, a file in the settings, a different analyzer, a text holding its separators) is
analysed by the node. ``tests/test_vocabulary_differential.py`` runs the relevance path with it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from opensearchpy import OpenSearch

from evals.cases import multilingual_case_set, paper_case_set
from evals.generated import generated_beliefs, generated_messages
from service.config import RecallDefaults, Settings
from service.errors import ValidationFailed
from service.recall.query import clean_query
from service.storage import calls
from service.storage.beliefs import BeliefStore
from service.storage.client import build_async_client, close_async_client
from service.storage.local_analysis import (
    PROBE_TEXTS,
    IndexAnalysis,
    LocalAnalysis,
    _positions,
    grouped,
    start_local_analysis,
)
from service.storage.queries import WORD_ANALYZER
from service.storage.vocabulary import AnalysisRequest, NameMapping, VocabularyStore
from service.telemetry import metrics
from tests.conftest import principal

NAME_FIELDS = ("canonical_name", "aliases")


@pytest.fixture
def vocabulary(os_client: OpenSearch, settings: Settings, local_analysis: LocalAnalysis) -> VocabularyStore:
    return BeliefStore(os_client, settings.opensearch_namespace, local_analysis=local_analysis).vocabulary


def _checked(vocabulary: VocabularyStore) -> IndexAnalysis:
    analysis = calls.run(vocabulary.client, vocabulary.local_analysis_reads())
    assert analysis is not None, "the in-process analysis was not checked in against the node"
    return analysis


def _name_analyzers(mapping: NameMapping) -> dict[str, str]:
    return {f: a for f, a in mapping.search_analyzers.items() if f.split(".", 1)[0] in NAME_FIELDS}


def _messages() -> list[str]:
    sets = (paper_case_set(), multilingual_case_set())
    cases = [c.query for s in sets for c in s.static]
    cases += [t.user_message for s in sets for session in s.sessions for t in session.turns]
    generated = list(generated_messages(generated_beliefs("t", "ann", 200), 1500))
    raw = [m for m in cases + generated if m]
    cleaned = [clean_query(m, max_chars=RecallDefaults().max_query_chars).text for m in raw]
    return raw + [c for c in cleaned if c] + list(PROBE_TEXTS)


def test_the_jars_are_the_nodes_version(local_analysis: LocalAnalysis, os_client: OpenSearch) -> None:
    version = os_client.info()["version"]
    assert local_analysis.versions == f"{version['number']} {version['lucene_version']}"


def test_every_name_analyzer_gives_the_nodes_tokens(vocabulary: VocabularyStore) -> None:
    """Every name field under its own search analyzer, and the recall's word analyzer (which the
    recall applies to ``aliases``), on ~3,400 messages in many scripts: field by field, position by
    position, the node's answer."""
    analysis = _checked(vocabulary)
    fields = _name_analyzers(vocabulary.mapping())
    assert {"canonical_name.phrase", "aliases.shingle", "aliases.cjk", "aliases.ko"} <= set(fields)
    texts = _messages()
    assert len(texts) > 3000
    requests = [AnalysisRequest(dict.fromkeys(NAME_FIELDS, t), fields) for t in texts]
    requests += [AnalysisRequest({"aliases": t}, {"aliases": WORD_ANALYZER}) for t in texts]
    differences: list[tuple[Any, ...]] = []
    tokens = 0
    for start in range(0, len(requests), 100):
        batch = requests[start : start + 100]
        node = calls.run(vocabulary.client, vocabulary.node_analyze("t", batch))
        for request, expected in zip(batch, node, strict=True):
            mine = analysis.analyze(request.doc, request.analyzers)
            tokens += sum(len(p) for p in expected.values())
            if mine != expected:
                differences.append((request.doc, mine, expected))
    assert differences[:3] == [] and len(differences) == 0
    assert tokens > 100_000  # the texts were analysed into something (not two empty answers)


def test_the_jvm_never_runs_on_pythons_collections(local_analysis: LocalAnalysis) -> None:
    """JPype's own hook would read the C heap on every Python collection and, as the heap grows
    (an API worker's caches filling), run a full collection of the JVM with the GIL held. With it
    taken off, a growing heap and full collections leave the JVM alone; starting again (the JVM
    already runs) keeps it off."""
    import gc

    import _jpype

    assert LocalAnalysis.start() is not None
    assert _jpype._collect not in gc.callbacks
    runs_before = _jpype.gcStats()["triggered"]  # the System.gc() calls JPype's hook made
    kept = []
    for _ in range(6):  # ~120 MB more of C heap, in steps, with a full collection after each
        kept.append([bytes(4096) for _ in range(5000)])
        gc.collect()
    assert _jpype.gcStats()["triggered"] == runs_before
    del kept


def test_the_jvms_answer_is_read_as_the_nodes_positions_are() -> None:
    """``QueryAnalysis.groups`` answers one group per position; the tokens stacked at a position
    are sorted as :func:`grouped` sorts the node's term vectors, in whatever order the analyzer
    emitted them, so the two compare equal by construction."""
    assert _positions("") == ()
    assert _positions("b\x1fa\x1fa b\x1ec\x1e") == (("a", "a b", "b"), ("c",))
    assert _positions("b\x1fa\x1ec\x1e") == grouped({3: ["b", "a"], 7: ["c"]})
    assert _positions("\x1ez\x1e") == (("",), ("z",))  # an empty token keeps its position


def test_a_recall_query_is_analysed_in_process(vocabulary: VocabularyStore) -> None:
    me = principal("t-local", "ann")
    request = AnalysisRequest(
        {"canonical_name": "Kafka consumer groups", "aliases": "kafka"}, {"aliases": WORD_ANALYZER}
    )
    _checked(vocabulary)
    in_process, by_node = (metrics.QUERY_ANALYSIS.labels(where=w)._value.get() for w in ("process", "node"))
    answer = calls.run(vocabulary.client, vocabulary.analyze(me, [request, AnalysisRequest({}, {})]))
    assert answer == [{"aliases": (("kafka",),)}, {}]
    assert metrics.QUERY_ANALYSIS.labels(where="process")._value.get() == in_process + 1
    assert metrics.QUERY_ANALYSIS.labels(where="node")._value.get() == by_node


def test_a_text_holding_the_separators_is_analysed_by_the_node(vocabulary: VocabularyStore) -> None:
    me = principal("t-local", "ann")
    _checked(vocabulary)
    request = AnalysisRequest({"aliases": "kafka\x1e7\x1fredis tuning"}, {"aliases": WORD_ANALYZER})
    by_node = metrics.QUERY_ANALYSIS.labels(where="node")._value.get()
    answer = calls.run(vocabulary.client, vocabulary.analyze(me, [request]))
    assert metrics.QUERY_ANALYSIS.labels(where="node")._value.get() == by_node + 1
    assert answer == calls.run(vocabulary.client, vocabulary.node_analyze("t-local", [request]))


def test_an_unpaired_surrogate_never_reaches_the_jvm(vocabulary: VocabularyStore) -> None:
    """A lone surrogate (a JSON ``\\ud800`` escape decodes to one) cannot cross into the JVM: the
    text takes the node's path, whose encoder refuses it (a 422, never a 500; the API refuses such a query with
    a 422 before recall: tests/api/test_local_analysis_http.py)."""
    me = principal("t-local", "ann")
    _checked(vocabulary)
    assert not IndexAnalysis.accepts({"aliases": "kaf\ud800ka tuning"})
    assert IndexAnalysis.accepts({"aliases": "kafka tuning", "canonical_name": "サーバー 🙂"})
    request = AnalysisRequest({"aliases": "kaf\ud800ka tuning"}, {"aliases": WORD_ANALYZER})
    with pytest.raises(ValidationFailed, match="cannot encode"):  # the encoder's refusal, as a 422
        calls.run(vocabulary.client, vocabulary.analyze(me, [request]))


def test_another_node_version_is_refused(
    local_analysis: LocalAnalysis, os_client: OpenSearch, settings: Settings
) -> None:
    settings_of = os_client.indices.get_settings(index=f"{settings.opensearch_namespace}-beliefs")
    index_settings = next(iter(settings_of.values()))["settings"]
    verdict = local_analysis.build(index_settings, "2.19.7 9.12.3")
    assert verdict.analysis is None and "2.19.7" in verdict.reason
    assert local_analysis.build(index_settings, local_analysis.versions).analysis is not None


def test_settings_that_read_a_file_are_refused(
    local_analysis: LocalAnalysis, os_client: OpenSearch, settings: Settings
) -> None:
    settings_of = os_client.indices.get_settings(index=f"{settings.opensearch_namespace}-beliefs")
    index_settings = next(iter(settings_of.values()))["settings"]
    analysis = index_settings["index"]["analysis"]
    with_file = {
        "index": {
            **index_settings["index"],
            "analysis": {
                **analysis,
                "filter": {
                    **analysis["filter"],
                    "team_synonyms": {"type": "synonym", "synonyms_path": "analysis/synonyms.txt"},
                },
            },
        }
    }
    verdict = local_analysis.build(with_file, local_analysis.versions)
    assert verdict.analysis is None and "files" in verdict.reason


def test_an_analyzer_that_differs_from_the_nodes_is_not_used(
    local_analysis: LocalAnalysis, vocabulary: VocabularyStore, os_client: OpenSearch
) -> None:
    """Settings whose word analyzer lost its lower-casing stand in for a plugin that differs from
    the node's: the probe finds it, and the index is analysed by the node."""
    mapping = vocabulary.mapping()
    index = mapping.indices[0]
    index_settings = os_client.indices.get_settings(index=index)[index]["settings"]
    analyzers = index_settings["index"]["analysis"]["analyzer"]
    words = analyzers["tenure_query_words"]
    altered = {
        "index": {
            **index_settings["index"],
            "analysis": {
                **index_settings["index"]["analysis"],
                "analyzer": {
                    **analyzers,
                    "tenure_query_words": {**words, "filter": [f for f in words["filter"] if f != "lowercase"]},
                },
            },
        }
    }
    built = local_analysis.build(altered, local_analysis.versions)
    assert built.analysis is not None
    difference = calls.run(os_client, vocabulary._probe(built.analysis, mapping))
    assert difference is not None and "tenure_query_words" in difference
    assert calls.run(os_client, vocabulary._probe(_checked(vocabulary), mapping)) is None


def test_off_by_setting_and_unusable_after_a_fork(local_analysis: LocalAnalysis) -> None:
    assert start_local_analysis(RecallDefaults(local_analysis=False)) is None
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the JVM's threads are not in a forked child: it must not call into it
        os.write(write, b"1" if not local_analysis.usable else b"0")
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"1"
    assert local_analysis.usable


def test_a_missing_class_leaves_the_analysis_to_the_node(tmp_path: Any) -> None:
    assert LocalAnalysis.start((str(tmp_path / "lib" / "*"), str(tmp_path / "classes"))) is None


def test_checked_again_on_the_event_loop_after_the_mapping_is_read_again(
    vocabulary: VocabularyStore, settings: Settings
) -> None:
    """The API's recalls run on the event loop: once a minute the mapping is read again and the
    check's reads (settings, the node's version) go through the asynchronous client; the verdict
    is remembered, so nothing is probed again."""
    first = _checked(vocabulary)
    vocabulary._mapping_read_at = 0.0  # as a minute later

    async def check() -> IndexAnalysis | None:
        client = build_async_client(settings)  # inside the loop, as the app's lifespan makes it
        try:
            return await calls.arun(client, vocabulary.local_analysis_reads())
        finally:
            await close_async_client(client)

    assert asyncio.run(check()) is first
