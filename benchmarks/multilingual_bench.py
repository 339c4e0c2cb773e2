"""Recall latency on the multilingual case set beside English, on one index: does the CJK analysis
chain cost more than the English one?

One fresh namespace holds the English synthetic corpus of ``recall_bench`` (default 100k beliefs
over 1,000 tenants) plus the multilingual case set's corpus (evals/data/multilingual-v1) copied
into every tenant. Queries alternate, in one shuffled stream through the real recall path
(``ContextBuilder.build``), between ``recall_bench``'s English messages (alias hits, misses, long
messages) and the multilingual case set's own questions (Japanese, Chinese, German, Spanish), each
for a random tenant. Figures per kind come from ``recall_bench.measure``.

    .venv/bin/python -m benchmarks.multilingual_bench --start-node --heap 2g --out benchmarks/results/multilingual.json

A benchmark, not a test: it prints figures and writes a JSON (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.recall_bench import (
    REPO,
    FastJSONSerializer,
    Query,
    Spec,
    TimedClient,
    draw_queries,
    load_range,
    loadavg,
    measure,
)
from deploy.devstack import Service, start_opensearch
from evals.cases import CaseSet, multilingual_case_set
from service.config import RecallDefaults, Settings
from service.domain.belief import Belief
from service.domain.text import has_hangul, has_unspaced_script
from service.recall.context import ContextBuilder
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.storage.templates import BELIEFS, apply_templates, drop_namespace


def load_multilingual(store: BeliefStore, cases: CaseSet, tenants: int) -> int:
    """The case set's corpus in every tenant (the ids are per tenant already)."""
    count = 0
    for t in range(tenants):
        beliefs = [Belief.from_record(r, tenant_id=f"t{t:04d}") for r in cases.beliefs]
        result = store.put_many(beliefs, refresh="false")
        if result.failed:
            raise RuntimeError(f"multilingual load failed: {list(result.failed.items())[:3]}")
        count += len(beliefs)
    return count


def _kind(query: str) -> str:
    """Korean (the `.ko` clauses run beside the `.cjk` ones), other unspaced scripts, or Latin."""
    if has_hangul(query):
        return "multilingual-korean"
    return "multilingual-cjk" if has_unspaced_script(query) else "multilingual-latin"


def multilingual_queries(cases: CaseSet, n: int, tenants: int, seed: int) -> list[Query]:
    """The case set's static questions, each asked in a random tenant by the case's user."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        case = rng.choice(cases.static)
        principal = cases.principal(f"t{rng.randrange(tenants):04d}", case.user_id)  # with its grants
        kind = _kind(case.query)
        out.append(Query(kind, principal, list(case.scope), case.query))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--english", type=int, default=100_000, help="English synthetic beliefs")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=4000, help="measured queries (both kinds together)")
    parser.add_argument("--warmup", type=int, default=800)
    parser.add_argument("--opensearch-url", default=None)
    parser.add_argument("--start-node", action="store_true")
    parser.add_argument("--heap", default="2g")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    cases = multilingual_case_set()
    spec = Spec(tenants=args.tenants)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    node: Service | None = None
    home = Path(tempfile.mkdtemp(prefix="bench-os-")) if args.start_node else None
    if home is not None:
        node = start_opensearch(home, heap=args.heap)
    url = node.url if node else (args.opensearch_url or Settings().opensearch_url)
    namespace = f"bench-ml-{uuid.uuid4().hex[:8]}"
    settings = Settings(opensearch_url=url, opensearch_namespace=namespace, opensearch_timeout_s=60)
    base = build_client(settings)
    client = TimedClient(hosts=[url], timeout=60, max_retries=1, pool_maxsize=8, serializer=FastJSONSerializer())
    client.took = []
    report: dict[str, Any] = {
        "benchmark": "recall latency, multilingual case set questions beside English messages, one index",
        "command": "python -m benchmarks.multilingual_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_at": started.isoformat(),
        "loadavg_before": loadavg(),
    }
    try:
        apply_templates(base, namespace)
        alias = BELIEFS.alias(namespace)
        store = BeliefStore(client, namespace)
        print(f"loading {args.english:,} English + {len(cases.beliefs)} x {args.tenants} multilingual ...", flush=True)
        load_range(base, alias, 0, args.english, spec, now, 2000)
        multilingual = load_multilingual(store, cases, args.tenants)
        base.indices.refresh(index=alias)
        report["corpus"] = {"english": args.english, "multilingual": multilingual, "tenants": args.tenants}
        total = args.warmup + args.queries
        stream = draw_queries(total // 2, args.english, spec, now, seed=1) + multilingual_queries(
            cases, total - total // 2, args.tenants, seed=2
        )
        random.Random(3).shuffle(stream)
        builder = ContextBuilder(store, RecallDefaults())
        report["result"] = measure(builder, client, stream, args.warmup, threads=1)
        for kind, v in report["result"]["by_kind_ms"].items():
            print(f"  {kind:20} n={v['n']:>5.0f}  p50 {v['p50']:.2f}  p95 {v['p95']:.2f}  p99 {v['p99']:.2f} ms")
    finally:
        report["loadavg_after"] = loadavg()
        report["finished_at"] = datetime.now(UTC).isoformat()
        drop_namespace(base, namespace)
        base.close()
        client.close()
        if node:
            node.stop()
            if home is not None:
                shutil.rmtree(home, ignore_errors=True)
        out = args.out or REPO / "benchmarks" / "results" / f"multilingual-{started:%Y%m%dT%H%MZ}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
