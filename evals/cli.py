"""``tenure-eval`` / ``python -m evals``: a case set against several recall backends side by side.

Loads the case set into a fresh namespace per backend on a real OpenSearch, runs every static
case and session turn, judges them as the paper's harness did, writes ``report.json``,
``report.md`` and PNG charts, prints one summary line per backend, and exits non-zero when a
gated backend (``--gate bm25``) did not pass every case. See evals/README.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from opensearchpy import OpenSearch

from evals.backends import (
    SPECS,
    ProcessResources,
    default_backends,
    drop_backend_namespace,
    make_backend,
    prepare_namespace,
    vector_available,
)
from evals.cases import MULTILINGUAL_DIR, PAPER_DIR, CaseSet, load_case_set
from evals.report import BackendRun, build_report, load_categories, write_reports
from evals.runner import run_case_set
from service.config import Settings
from service.storage.beliefs import BeliefStore
from service.storage.client import build_client
from service.storage.local_analysis import start_local_analysis

REPO = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_GATE_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tenure-eval",
        description="Run a case set against recall backends side by side and write a report.",
    )
    p.add_argument(
        "--cases",
        type=Path,
        action="append",
        default=None,
        help=(
            "case set directory, repeatable (default: the paper's, then ours in evals/data/multilingual-v1; "
            "the first set's report goes to --out, each further one to --out/<set name>/)"
        ),
    )
    p.add_argument("--name", default=None, help="name of a single case set in the report (default: the directory name)")
    p.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated, from {', '.join(SPECS)} (default: bm25 + ablations, + vector if installed)",
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default: evals/out/<timestamp>/)")
    p.add_argument("--opensearch-url", default=None, help="default: TENURE_OPENSEARCH_URL from the settings")
    p.add_argument(
        "--redis-url",
        default=None,
        help="the Redis the BM25 backends keep write versions in, as the API does (default: TENURE_REDIS_URL)",
    )
    p.add_argument(
        "--start-node", action="store_true", help="start a throw-away OpenSearch node (and Redis) for this run"
    )
    p.add_argument("--heap", default="1g", help="heap of the node started by --start-node")
    p.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="BACKEND",
        help="exit non-zero unless BACKEND passes every case (repeatable, or comma-separated)",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="embedding cache of the vector backend")
    p.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the unrecorded warm-up pass (latency of the first backend will include cold start)",
    )
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--keep-indices", action="store_true", help="do not drop the run's namespaces")
    return p


def _start_node(heap: str) -> tuple[Any, Any]:
    """A throw-away OpenSearch node and Redis via deploy/devstack.py (repo dev tooling, not an
    installed package), under one temporary directory."""
    if str(REPO) not in sys.path and (REPO / "deploy" / "devstack.py").exists():
        sys.path.insert(0, str(REPO))
    from deploy.devstack import start_opensearch, start_redis

    home = Path(tempfile.mkdtemp(prefix="tenure-eval-os-"))
    node = start_opensearch(home / "home", heap=heap)
    try:
        return node, start_redis(home / "redis")
    except BaseException:
        node.stop()
        raise


def _process_resources(settings: Settings) -> ProcessResources | None:
    """Redis and the in-process query analysis, as an API process holds them (None: Redis does
    not answer)."""
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        client.close()
        return None
    return ProcessResources(client, start_local_analysis(settings.recall))


def _split(values: list[str]) -> list[str]:
    return [v.strip() for raw in values for v in raw.split(",") if v.strip()]


def run_backend(
    client: OpenSearch,
    settings: Settings,
    case_set: CaseSet,
    name: str,
    run_id: str,
    *,
    process: ProcessResources | None,
    progress: Any,
    cache_dir: Path | None,
    keep: bool,
) -> BackendRun:
    spec = SPECS[name]
    namespace = f"eval-{run_id}-{name}"
    extras: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    process = None if spec.needs_vector else process
    try:
        store = prepare_namespace(client, namespace, spec, settings.recall, process)
        backend = make_backend(spec, store, settings.recall, cache_dir=cache_dir)
        builder_store: BeliefStore = getattr(getattr(backend, "builder", None), "store", store)

        def on_case(_backend: str, case_id: str) -> None:
            embed_ms = getattr(builder_store, "last_embed_ms", None)
            if embed_ms is not None:  # the vector backend: query-embedding time and candidates
                extras[case_id] = {
                    "embed_ms": round(float(embed_ms), 2),
                    "candidates": getattr(builder_store, "last_candidates", None),
                }
            if progress is not None:
                progress.set_postfix_str(case_id[:40], refresh=False)
                progress.update(1)

        result = run_case_set(
            case_set,
            backend,
            builder_store,
            static_tenant=f"static-{run_id}",
            session_tenant=f"session-{run_id}",
            progress=on_case,
        )
    finally:
        if not keep:
            drop_backend_namespace(client, namespace, process)
    return BackendRun(
        result=result,
        description=spec.description,
        extras=extras,
        elapsed_s=time.perf_counter() - started,
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = _split([args.backends]) if args.backends else default_backends()
    gates = _split(args.gate)
    unknown = [n for n in [*names, *gates] if n not in SPECS]
    if unknown:
        print(f"tenure-eval: unknown backend(s) {unknown}; choose from {list(SPECS)}", file=sys.stderr)
        return EXIT_USAGE
    if "vector" in names and not vector_available():
        print(
            "tenure-eval: the vector backend needs the 'vector' extra: "
            "python3.11 -m venv .venv-vector && .venv-vector/bin/pip install -e '.[evals,vector]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for gate in gates:
        if gate not in names:
            names.append(gate)
    directories: list[Path] = args.cases or [PAPER_DIR, MULTILINGUAL_DIR]
    case_sets: list[CaseSet] = []
    for directory in directories:
        if not (directory / "beliefs.seed.json").exists():
            print(f"tenure-eval: {directory} is not a case set (no beliefs.seed.json)", file=sys.stderr)
            return EXIT_USAGE
        try:
            case_sets.append(load_case_set(directory, args.name if len(directories) == 1 else None))
        except (KeyError, ValueError, TypeError) as exc:
            print(f"tenure-eval: cannot read the case set in {directory}: {exc!r}", file=sys.stderr)
            return EXIT_USAGE

    started = datetime.now(UTC)
    out_dir = args.out or REPO / "evals" / "out" / started.strftime("%Y%m%dT%H%M%SZ")
    node, node_redis = _start_node(args.heap) if args.start_node else (None, None)
    base = Settings()
    settings = base.model_copy(
        update={
            "opensearch_url": node.url if node else (args.opensearch_url or base.opensearch_url),
            "redis_url": node_redis.url if node_redis else (args.redis_url or base.redis_url),
        }
    )
    process = _process_resources(settings)
    if process is None and (args.warmup or any(not SPECS[n].needs_vector for n in names)):
        print(
            f"tenure-eval: Redis at {settings.redis_url} does not answer; the BM25 backends run recall as "
            "the API does, with the tenants' write versions in Redis (--redis-url, or --start-node)",
            file=sys.stderr,
        )
        _stop(node, node_redis)
        return EXIT_USAGE
    client = build_client(settings)
    failed_gates: list[str] = []
    try:
        version = client.info()["version"]["number"]
        for index, (directory, case_set) in enumerate(zip(directories, case_sets, strict=True)):
            target = out_dir if index == 0 else out_dir / case_set.name
            runs, meta = _run_case_set(client, settings, process, case_set, names, args, argv, version, node, gates)
            report = build_report(case_set, runs, load_categories(case_set, directory), meta)
            paths = write_reports(report, target, charts=not args.no_charts)
            for run in runs.values():
                print(run.result.summary_line())
            print(f"report: {paths['markdown']}  json: {paths['json']}")
            for gate in gates:
                r = runs[gate].result
                if r.passed != r.total:
                    failed_gates.append(gate)
                    print(f"GATE FAILED: {gate} on {case_set.name} passed {r.passed}/{r.total}", file=sys.stderr)
    finally:
        client.close()
        if process is not None:
            process.redis.close()
        _stop(node, node_redis)
    return EXIT_GATE_FAILED if failed_gates else EXIT_OK


def _stop(node: Any, node_redis: Any) -> None:
    """Stop what --start-node started and remove its directory."""
    for service in (node_redis, node):
        if service is not None:
            service.stop()
    if node is not None:
        shutil.rmtree(node.home.parent, ignore_errors=True)


def _run_case_set(
    client: OpenSearch,
    settings: Settings,
    process: ProcessResources | None,
    case_set: CaseSet,
    names: list[str],
    args: argparse.Namespace,
    argv: list[str] | None,
    version: str,
    node: Any,
    gates: list[str],
) -> tuple[dict[str, BackendRun], dict[str, Any]]:
    """Every backend on one case set (after an unrecorded warm-up), and the report's metadata."""
    started = datetime.now(UTC)
    run_id = uuid.uuid4().hex[:8]
    runs: dict[str, BackendRun] = {}
    progress: Any = None
    try:
        if not args.no_progress:
            from tqdm import tqdm

            progress = tqdm(total=case_set.total * len(names), unit="case", file=sys.stderr, dynamic_ncols=True)
        if args.warmup:
            # one unrecorded bm25 pass so the first measured backend does not pay the node's
            # cold start (JIT, caches) in its latency figures
            run_backend(
                client,
                settings,
                case_set,
                "bm25",
                f"{run_id}w",
                process=process,
                progress=None,
                cache_dir=None,
                keep=False,
            )
        for name in names:
            if progress is not None:
                progress.set_description(f"{case_set.name} {name}")
            runs[name] = run_backend(
                client,
                settings,
                case_set,
                name,
                run_id,
                process=process,
                progress=progress,
                cache_dir=args.cache_dir,
                keep=args.keep_indices,
            )
    finally:
        if progress is not None:
            progress.close()
    meta = {
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "tenure-eval " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "run_id": run_id,
        "opensearch": {
            "url": "throw-away node (--start-node)" if node else settings.opensearch_url,
            "version": version,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        },
        # what the BM25 backends' recall ran with besides the settings (service/recall/stack.py)
        "redis": {"url": "throw-away (--start-node)" if node else settings.redis_url},
        "query_analysis": "in process (the node's analysis code, checked against the node)"
        if process is not None and process.local_analysis is not None
        else "by the node",
        "recall_defaults": settings.recall.model_dump(),
        "gates": gates,
    }
    return runs, meta


if __name__ == "__main__":
    sys.exit(main())
