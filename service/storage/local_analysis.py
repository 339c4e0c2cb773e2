"""A recall query analysed in the API process by OpenSearch's own analysis code (issue 16).

A recall's relevance clauses need the message's tokens under the beliefs index's search analyzers
(``VocabularyStore.analyze``). Asking the node costs one ``_mtermvectors`` round trip per recall:
~0.6 ms of the node's CPU and ~0.65 ms of wall time, most of it the request itself. OpenSearch's
analyzers must stay the only definition of analysis (no hand-written tokenizer that can drift), so
instead of copying them this module runs **the same code**: a JVM in the API process (JPype) with
the node's jars, where ``deploy/opensearch/QueryAnalysis.java`` builds the index's analyzers with
OpenSearch's ``AnalysisModule`` from the index's own settings (read from the live index) and the
same analysis plugins as the node, then tokenizes a text as the node indexes an artificial
document's field (a token's position is the sum of the position increments so far, minus one).

It is used for an index only after it has been checked against the node, once per distinct
analysis settings and node version in the process (:meth:`LocalAnalysis.checked`): the node's
OpenSearch and Lucene versions must be the jars' own, the settings may name no file (a synonym or
stop-word path the API does not have), and every analyzer the mapping names (and the recall's
word analyzer) must give the node's exact tokens on a fixed set of probe texts in many scripts.
Anything else (no JPype, no jars, another version, a difference) keeps the round trip: the
answers are then the node's, as before. ``TENURE_RECALL_LOCAL_ANALYSIS=false`` turns it off.

The JVM is started by the API's lifespan only (never in a Celery worker, which forks): one per
process, for its life, and never used in a child forked after it started.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.config import RecallDefaults

log = logging.getLogger(__name__)

# Where build.sh puts the node's jars and the compiled QueryAnalysis class.
_DEV_NODE = Path(__file__).resolve().parents[2] / "deploy" / "opensearch"
DEFAULT_CLASSPATH = (str(_DEV_NODE / "lib" / "*"), str(_DEV_NODE / "classes"))
# -Xrs: the JVM installs no handler for SIGTERM/SIGINT/SIGHUP, so the server's own shutdown keeps
# working; a small serial heap: the analyzers keep little, and no collector threads compete.
_JVM_OPTIONS = ("-Xrs", "-Xms16m", "-Xmx128m", "-XX:+UseSerialGC", "-Dlog4j2.level=ERROR")

# The separators of QueryAnalysis.groups' answer; a text holding one is analysed by the node.
_GROUP_END = "\x1e"
_TERM_SEP = "\x1f"

# Texts every analyzer is checked on against the node before the local analysis is used: English
# with stop-words and possessives, identifiers of every shape, numbers and versions, accents and
# case folding, full-width forms, Japanese, Chinese, Korean, mixed scripts, emoji and symbols.
PROBE_TEXTS = (
    "How do we set up Kafka's consumer groups with postgres-tuning and Redis eviction?",
    "We use TypeScript strict, the MongoDB raw driver, not Mongoose; CI on GitHub Actions",
    "snake_case_name CamelCaseName kebab-case-name foo.bar/baz x86_64 v2.3.1 1.2.3 ISO-8601 C++ C# .NET",
    "don\u2019t use O\u2019Reilly\u02bcs rules; the team's API's ‘quoted’ \"double\"",
    "Crème brûlée über naïve café Ångström ŁÓDŹ İstanbul straße ÆØÅ œuvre",
    "ＦＵＬＬ ｗｉｄｔｈ ａｂｃ １２３ ｶﾀｶﾅ ㍻ ①②",
    "サーバーの設定を変更したい。Kafka の consumer group をコンシューマーグループと呼ぶ",
    "データベースはPostgreSQLを使い、キャッシュはRedisです。東京都のユーザー",
    "我们使用PostgreSQL数据库和Redis缓存，部署在北京的服务器上。",
    "我們使用資料庫與快取伺服器",
    "한국어 데이터베이스 설정을 바꾸고 싶어요 postgres 서버는 서울에 있습니다",
    "🙂 emoji 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 test ™ © → ≠ ∑ $100 50% #tag @user",
    "the the a an of and or to in for with our my we i on at by up is are was be that this how what does",
    "postgres postgres postgress kafkas kafkaa rediss redisz tuning setup setups",
    "ab cd e f g hh iii jjjj kkkkk " + "z" * 300,
    "",
)


# A text's tokens: one group per position, in position order (tokens stacked at one position are
# alternatives), the terms of a group sorted.
Positions = tuple[tuple[str, ...], ...]


def grouped(at: dict[int, list[str]]) -> Positions:
    """The terms found at each position as :data:`Positions`: the one ordering both readers of an
    analysis use (the node's term vectors, ``vocabulary._by_position``; this module's answer), so
    equal tokens compare equal."""
    return tuple(tuple(sorted(at[p])) for p in sorted(at))


def _positions(raw: str) -> Positions:
    """``term[\\x1fterm...]\\x1e...`` (one group per position, in order) -> :data:`Positions`:
    split in C; only a position holding several tokens is sorted, as :func:`grouped` sorts them.
    (Parsing ``position, term`` pairs token by token cost ~0.14 ms for a 130-word message under a
    word analyzer and ~0.3 ms under a shingle one; this, ~0.02 and ~0.1 ms.)"""
    return tuple(
        tuple(sorted(group.split(_TERM_SEP))) if _TERM_SEP in group else (group,)
        for group in raw.split(_GROUP_END)[:-1]
    )


# Index settings that name one index and change nothing in its analysis (left out of the key a
# check is remembered under, so a new index with the same analysis is not probed again).
_IDENTITY = frozenset({"uuid", "provided_name", "creation_date", "history", "routing", "blocks"})


def _analysable(text: str) -> bool:
    if _GROUP_END in text or _TERM_SEP in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def analysis_settings(index_settings: Mapping[str, Any]) -> dict[str, Any]:
    """What of an index's settings (``GET <index>/_settings``' ``settings``) its analyzers are
    built from: all of them (the analysis section, and index-level limits such as
    ``max_shingle_diff`` or the version the index was created with), but its identity."""
    index = {k: v for k, v in index_settings.get("index", {}).items() if k not in _IDENTITY}
    return {"index": index}


def _names_a_file(analysis: Any) -> bool:
    """Whether the analysis settings read a file (``*_path``: synonyms, stop-words, dictionaries),
    which lives on the node and not in the API."""
    if isinstance(analysis, Mapping):
        return any(str(k).endswith("_path") or _names_a_file(v) for k, v in analysis.items())
    if isinstance(analysis, list):
        return any(_names_a_file(v) for v in analysis)
    return False


class IndexAnalysis:
    """One index's analyzers in the process (a ``QueryAnalysis`` object)."""

    def __init__(self, analyzers: Any):
        self._analyzers = analyzers

    def tokens(self, analyzer: str, field: str, text: str) -> Positions:
        return _positions(str(self._analyzers.groups(analyzer, field, text)))

    def analyze(self, doc: Mapping[str, str], analyzers: Mapping[str, str]) -> dict[str, Positions]:
        """The node's ``_mtermvectors`` answer for one artificial document, by position: each
        field (``name`` or ``name.sub``, read from the document's ``name``) under its analyzer; a
        field with no text or no token is left out, as the node leaves it out."""
        out: dict[str, Positions] = {}
        for field, analyzer in analyzers.items():
            text = doc.get(field.split(".", 1)[0])
            if text is None:
                continue
            positions = self.tokens(analyzer, field, text)
            if positions:
                out[field] = positions
        return out

    @staticmethod
    def accepts(doc: Mapping[str, str]) -> bool:
        """Whether every text can be analysed here: none holds the answer's separators, and each
        is valid Unicode (an unpaired surrogate, from a JSON ``\\ud800`` escape, cannot cross into
        the JVM; the node's path handles it as it always did)."""
        return all(_analysable(text) for text in doc.values())


@dataclass(frozen=True)
class Verdict:
    analysis: IndexAnalysis | None
    reason: str


class LocalAnalysis:
    """The JVM with the node's analysis code, and the analyzers of each index it was checked for."""

    def __init__(self, query_analysis: Any, versions: str):
        self._class = query_analysis
        self.versions = versions  # "<OpenSearch> <Lucene>" of the jars
        self._home = tempfile.mkdtemp(prefix="tenure-analysis-")
        (Path(self._home) / "config").mkdir()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._verdicts: dict[str, Verdict] = {}

    @classmethod
    def start(cls, classpath: Sequence[str] = DEFAULT_CLASSPATH) -> LocalAnalysis | None:
        """The JVM started (or the one this process already runs); None, logged, when it cannot
        be: no JPype, no jars or class on ``classpath``, or no JVM."""
        classes = [Path(p) for p in classpath if not p.endswith("*")]
        if not any((c / "QueryAnalysis.class").exists() for c in classes):
            log.info("recall analysis: by the node (QueryAnalysis.class not found on %s)", list(classpath))
            return None
        try:
            import jpype
            import jpype.config
        except ImportError:
            log.info("recall analysis: by the node (JPype is not installed)")
            return None
        try:
            if not jpype.isJVMStarted():
                # At exit the process just ends: destroying the JVM would wait for every thread
                # that ever called into it (the event loop's, the thread pool's) and hang the exit.
                jpype.config.destroy_jvm = False
                jpype.startJVM(*_JVM_OPTIONS, classpath=list(classpath), convertStrings=False, interrupt=False)
            unhook_jpype_from_python_gc()
            query_analysis = jpype.JClass("QueryAnalysis")
            versions = str(query_analysis.versions())
        except Exception as exc:  # a missing JVM, a broken classpath: the node analyses
            log.warning("recall analysis: by the node (the JVM did not start: %s)", exc)
            return None
        if not hasattr(query_analysis, "groups"):  # compiled before 2026-12-05: another answer's shape
            log.warning("recall analysis: by the node (QueryAnalysis.class predates groups(): run build.sh)")
            return None
        return cls(query_analysis, versions)

    @property
    def usable(self) -> bool:
        """False in a child forked after the JVM started: its JVM threads are not there."""
        return os.getpid() == self._pid

    def verdict_key(self, index_settings: Mapping[str, Any], node_versions: str) -> str:
        payload = json.dumps([analysis_settings(index_settings), node_versions], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()

    def known(self, key: str) -> Verdict | None:
        return self._verdicts.get(key)

    def build(self, index_settings: Mapping[str, Any], node_versions: str) -> Verdict:
        """The index's analyzers, or why they cannot be used (before the check against the node)."""
        if node_versions != self.versions:
            return Verdict(None, f"the node runs {node_versions}, the jars are {self.versions}")
        settings = analysis_settings(index_settings)
        if _names_a_file(settings["index"]["analysis"]):
            return Verdict(None, "the index's analysis reads files the API does not have")
        try:
            analyzers = self._class(json.dumps(settings), self._home)
        except Exception as exc:
            return Verdict(None, f"OpenSearch's analysis module refused the index settings: {exc}")
        return Verdict(IndexAnalysis(analyzers), "checked against the node")

    def remember(self, key: str, verdict: Verdict) -> Verdict:
        with self._lock:
            first = self._verdicts.setdefault(key, verdict)
        if first is verdict:
            level = logging.INFO if verdict.analysis is not None else logging.WARNING
            where = "in the API process" if verdict.analysis is not None else "by the node"
            log.log(level, "recall analysis: %s (%s; OpenSearch/Lucene %s)", where, verdict.reason, self.versions)
        return first


def unhook_jpype_from_python_gc() -> None:
    """Take JPype's hook off CPython's collector (``gc.callbacks``).

    JPype ties the two collectors together: on every Python collection, of any generation, its
    hook (installed twice) reads the C heap's size with ``mallinfo``, which walks glibc's free
    lists: ~1.8 ms a collection in an API worker, even a collection with nothing to walk. When
    that size has grown, it also runs ``System.gc()``, a full collection of the embedded JVM (up
    to 14-30 ms, with the GIL held). An API worker's heap grows as its recall caches fill: 13
    runs in a one-minute probe of priming, warm-up and recalls (docs/benchmarks.md, "Paced
    collections, again"). The bridge is for Java objects that hold Python ones (proxies) and so
    wait on both collectors; the analysis holds none, only strings handed back, whose Java side
    is freed when Python drops them, and the JVM collects its own small heap when it fills
    (jpype-project/jpype#1197 has the same slowdown and this remedy)."""
    import gc

    import _jpype

    hook = getattr(_jpype, "_collect", None)
    gc.callbacks[:] = [callback for callback in gc.callbacks if callback is not hook]


def start_local_analysis(recall: RecallDefaults) -> LocalAnalysis | None:
    """The API's in-process query analysis as the settings ask (None: the node analyses)."""
    if not recall.local_analysis:
        return None
    classpath = recall.analysis_classpath.split(os.pathsep) if recall.analysis_classpath else DEFAULT_CLASSPATH
    return LocalAnalysis.start(classpath)


__all__ = [
    "DEFAULT_CLASSPATH",
    "PROBE_TEXTS",
    "IndexAnalysis",
    "LocalAnalysis",
    "Positions",
    "Verdict",
    "analysis_settings",
    "grouped",
    "start_local_analysis",
]
