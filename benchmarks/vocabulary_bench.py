"""Relevance path A/B: recall latency with the Lucene query vs the tenant's own vocabulary.

One index (``recall_bench``'s corpus: N beliefs over 1,000 tenants), one Redis for the tenant write
versions, the same messages for both paths, alternating rounds (so machine load hits both alike).
Also reports what the vocabularies cost: build time per tenant (cold recalls) and estimated memory.

    .venv/bin/python -m benchmarks.vocabulary_bench --start-node --sizes 10000,100000 \
        --out benchmarks/results/vocab.json

``--matching``: the API's CPU for vocabulary matching alone, in process, this tree against a
baseline tree (``--baseline``, e.g. ``git archive main service | tar -x -C /tmp/before``): the same
recorded message analyses and the same units per tenant, each tree's own ``FieldVocabulary`` and
``VocabularyMatcher._render``, alternating rounds; also the Python side of a vocabulary read
(``tenant_units``: this process's CPU per aggregation, the node's time excluded) and of the
structure's build, a restored structure's pre-filters (the first recall after a write), and
bytes per tenant. Every rendered clause list is compared with the
baseline's (byte-identical JSON), every read's units too.

    .venv/bin/python -m benchmarks.vocabulary_bench --matching --baseline /tmp/before --start-node \
        --tenants 10 --sizes 10000 --queries 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import inspect
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

from benchmarks.recall_bench import (
    Spec,
    add_server_arguments,
    draw_queries,
    load_range,
    loadavg,
    measure,
    recall_clients,
    report_head,
    result_path,
    start_servers,
    wind_down,
)
from loadtest.stats import percentile
from service.config import RecallDefaults
from service.domain.principal import Principal
from service.recall import vocabulary as vocabulary_module
from service.recall.context import ContextBuilder
from service.recall.query import clean_query
from service.recall.vocabulary import (
    FUZZY_FIELDS,
    SPACED_PHRASE_FIELDS,
    VOCABULARY_FIELDS,
    WORD_FIELDS,
    FieldVocabulary,
    VocabularyCache,
    VocabularyMatcher,
)
from service.storage import calls
from service.storage.beliefs import BeliefStore
from service.storage.templates import BELIEFS, apply_templates, drop_namespace
from service.storage.vocabulary import TenantUnits, VocabularyStore
from service.write_versions import TenantWriteVersions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=1000, help="measured queries per round and path")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--matching", action="store_true", help="in-process matching A/B against --baseline")
    parser.add_argument("--baseline", type=Path, default=None, help="--matching: the tree to compare with")
    parser.add_argument("--profile", type=Path, default=None, help="--matching: cProfile stats of this tree's renders")
    add_server_arguments(parser, heap="1g", redis_url=True)
    args = parser.parse_args(argv)
    if args.matching:
        return matching(args, argv)

    spec = Spec(tenants=args.tenants)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    servers = start_servers("vocab-bench-", args)
    url, redis_url = servers.opensearch_url, servers.redis_url
    namespace = f"vbench-{uuid.uuid4().hex[:8]}"
    base, client = recall_clients(url, namespace, pool_maxsize=32)
    redis_client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    what = "relevance path A/B: ContextBuilder.build with the Lucene query vs the tenant vocabulary"
    report: dict[str, Any] = {**report_head("vocabulary_bench", what, argv, started), "stages": []}
    try:
        apply_templates(base, namespace)
        alias = BELIEFS.alias(namespace)
        store = BeliefStore(client, namespace, TenantWriteVersions(redis_client, namespace))
        defaults = RecallDefaults()
        loaded = 0
        for size in sorted(int(s) for s in args.sizes.split(",")):
            print(f"loading {loaded:,}..{size:,} beliefs ...", flush=True)
            load_range(base, alias, loaded, size, spec, now, 2000)
            loaded = size
            base.indices.refresh(index=alias)
            queries = draw_queries(args.warmup + args.queries, loaded, spec, now, seed=size)
            matcher = VocabularyMatcher.for_store(store, defaults)  # a cold cache per stage
            builders = {
                "lucene": ContextBuilder(store, defaults),
                "vocabulary": ContextBuilder(store, defaults, matcher),
            }
            stage: dict[str, Any] = {"beliefs": loaded, "rounds": []}
            for r in range(args.rounds):
                for path, builder in builders.items():
                    m = measure(builder, client, queries, args.warmup, threads=1)
                    stage["rounds"].append({"round": r, "path": path, **m, "loadavg": loadavg()})
                    print(
                        f"  {loaded:>9,} round {r} {path:>10}: p50 {m['p50_ms']:.2f} p95 {m['p95_ms']:.2f} "
                        f"p99 {m['p99_ms']:.2f} ms, {m['throughput_qps']:.0f} q/s; by kind p50 {m['by_kind_p50_ms']}",
                        flush=True,
                    )
            stats = matcher.cache.stats
            sizes = [e.approx_bytes for e in matcher.cache.entries()]
            builds = [e.build_ms for e in matcher.cache.entries()]
            stage["vocabulary"] = {
                "builds": stats.builds,
                "hits": stats.hits,
                "build_ms_mean": stats.build_ms_total / max(1, stats.builds),
                "build_ms_p50": percentile(builds, 50) if builds else 0.0,
                "build_ms_max": stats.build_ms_max,
                "tenants_cached": len(matcher.cache),
                "bytes_per_tenant_mean": sum(sizes) / max(1, len(sizes)),
                "bytes_total": matcher.cache.cached_bytes,
            }
            print(f"  vocabulary cache: {json.dumps(stage['vocabulary'])}", flush=True)
            report["stages"].append(stage)
    finally:
        drop_namespace(base, namespace)
        base.close()
        client.close()
        redis_client.close()
        wind_down(report, result_path(args.out, "vocab", started), servers)
    return 0


# ------------------------------------------------------------------------------ --matching


def _module(tree: Path, relative: str, name: str) -> ModuleType:
    """A module of another tree, loaded under its own name (its imports resolve in this tree)."""
    spec = importlib.util.spec_from_file_location(name, tree / relative)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {tree / relative}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _fields(field_class: Any, groups: dict[str, list[str]], units: TenantUnits) -> dict[str, Any]:
    """A tree's per-field vocabularies from one read, built as its ``TenantVocabulary.build`` does:
    groups with the same terms share one structure (with the fuzzy fields' flag where the tree has
    one, if any of them is fuzzy)."""
    fuzzy: dict[frozenset[str], bool] = {}
    for group, names in groups.items():
        terms = frozenset(units.groups.get(group, ()))
        fuzzy[terms] = fuzzy.get(terms, False) or any(n in FUZZY_FIELDS for n in names)
    ranged = "ranges" in inspect.signature(field_class.build).parameters
    built = {t: field_class.build(t, ranges=r) if ranged else field_class.build(t) for t, r in fuzzy.items()}
    return {name: built[frozenset(units.groups.get(group, ()))] for group, names in groups.items() for name in names}


def _stats_us(samples: list[float]) -> dict[str, float]:
    return {
        "mean_us": round(statistics.fmean(samples) * 1e6, 2),
        "p50_us": round(percentile(samples, 50) * 1e6, 2),
        "p99_us": round(percentile(samples, 99) * 1e6, 2),
    }


def _timed(calls_: list[Callable[[], Any]]) -> list[float]:
    out = []
    for call in calls_:
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def _render_rounds(runs: dict[str, list[Callable[[], Any]]], kinds: list[str], rounds: int) -> list[dict[str, Any]]:
    """Each side's renders in alternating rounds: per-query time, overall and by message kind."""
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        for side in ("before", "after"):
            samples = _timed(runs[side])
            by_kind = {
                k: _stats_us([s for s, kind in zip(samples, kinds, strict=True) if kind == k])
                for k in sorted(set(kinds))
            }
            out.append({"round": r, "side": side, **_stats_us(samples), "by_kind": by_kind, "loadavg": loadavg()})
            print(f"  render round {r} {side:>6}: {json.dumps(out[-1])}", flush=True)
    return out


def _build_costs(
    classes: dict[str, Any],
    vocabularies: dict[str, dict[str, dict[str, Any]]],
    groups: dict[str, list[str]],
    units: dict[str, TenantUnits],
    rounds: int,
) -> dict[str, Any]:
    """The structures' build time per tenant (Python only, from the same reads) and their bytes."""
    out: dict[str, Any] = {}
    for side, field_class in classes.items():
        times: list[float] = []
        for _ in range(rounds):
            times += _timed([lambda u=u, fc=field_class: _fields(fc, groups, u) for u in units.values()])
        sizes = [
            sum(f.approx_bytes() for f in {id(f): f for f in fields.values()}.values())
            for fields in vocabularies[side].values()
        ]
        out[side] = {**_stats_us(times), "bytes_per_tenant_mean": round(statistics.fmean(sizes))}
    return out


def _restore_costs(
    classes: dict[str, Any], vocabularies: dict[str, dict[str, dict[str, Any]]], rounds: int
) -> dict[str, Any]:
    """What a restored vocabulary costs the first recall after a write: each distinct structure
    restored from its terms and offsets (what ``TenantVocabulary.decode`` does once the entry is
    decompressed) and its pre-filter computed, per tenant, for every group and for the groups an
    English message reaches (the word and spaced-phrase fields; the CJK and Korean groups wait for
    a message in those scripts)."""
    english = set(WORD_FIELDS + SPACED_PHRASE_FIELDS)
    out: dict[str, Any] = {}
    for side, field_class in classes.items():
        per_reach: dict[str, list[Callable[[], Any]]] = {"all_groups": [], "english_groups": []}
        for fields in vocabularies[side].values():
            for reach, names in (("all_groups", set(fields)), ("english_groups", english)):
                distinct = list({id(f): f for n, f in fields.items() if n in names}.values())
                per_reach[reach].append(
                    lambda d=distinct, fc=field_class: [
                        fc.restore(f.joined, f.offsets, ranges=f.ranges).pre_filter for f in d
                    ]
                )
        out[side] = {reach: _stats_us([t for _ in range(rounds) for t in _timed(c)]) for reach, c in per_reach.items()}
    return out


def _read_costs(
    readers: dict[str, Any], principals: dict[str, Principal], units: dict[str, TenantUnits], rounds: int
) -> tuple[dict[str, Any], bool]:
    """Each reader's ``tenant_units``: this process's CPU per aggregation (parse and collect; the
    node's time is not ours) and the wall time; and whether every read equals ``units``."""
    cpu: dict[str, list[float]] = {side: [] for side in readers}
    wall: dict[str, list[float]] = {side: [] for side in readers}
    same = True
    for _ in range(rounds):
        for side, reader in readers.items():
            for tenant, principal in principals.items():
                cpu0, wall0 = time.process_time(), time.perf_counter()
                got = calls.run(reader.client, reader.tenant_units(principal))
                cpu[side].append(time.process_time() - cpu0)
                wall[side].append(time.perf_counter() - wall0)
                same = same and got.groups == units[tenant].groups and got.documents == units[tenant].documents
    return {side: {"cpu": _stats_us(cpu[side]), "wall": _stats_us(wall[side])} for side in readers}, same


def matching(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.baseline is None:
        raise SystemExit("--matching needs --baseline TREE")
    before_vocab = _module(args.baseline, "service/recall/vocabulary.py", "baseline_recall_vocabulary")
    before_store_mod = _module(args.baseline, "service/storage/vocabulary.py", "baseline_storage_vocabulary")
    spec = Spec(tenants=args.tenants)
    size = int(args.sizes.split(",")[-1])
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    servers = start_servers("vocab-matching-", args)
    namespace = f"vmatch-{uuid.uuid4().hex[:8]}"
    base, client = recall_clients(servers.opensearch_url, namespace, pool_maxsize=4)
    what = "vocabulary matching in process: this tree vs --baseline (render, structure build, aggregation parse)"
    report: dict[str, Any] = {**report_head("vocabulary_bench", what, argv, started), "baseline": str(args.baseline)}
    try:
        apply_templates(base, namespace)
        alias = BELIEFS.alias(namespace)
        print(f"loading {size:,} beliefs over {spec.tenants} tenants ...", flush=True)
        load_range(base, alias, 0, size, spec, now, 2000)
        store = VocabularyStore(client, alias)
        before_store = before_store_mod.VocabularyStore(client, alias)
        after = VocabularyMatcher(store, VocabularyCache(store, None))
        before = before_vocab.VocabularyMatcher(store, before_vocab.VocabularyCache(store, None))
        analyzers = store.search_analyzers()
        groups = store.mapping().groups(VOCABULARY_FIELDS)
        principals = {f"t{t:04d}": Principal(tenant_id=f"t{t:04d}", user_id="u0") for t in range(spec.tenants)}
        units = {t: calls.run(client, store.tenant_units(p)) for t, p in principals.items()}
        vocabularies = {
            "before": {t: _fields(before_vocab.FieldVocabulary, groups, u) for t, u in units.items()},
            "after": {t: _fields(FieldVocabulary, groups, u) for t, u in units.items()},
        }
        queries = draw_queries(args.queries, size, spec, now, seed=size)
        recorded = []
        for q in queries:
            text = clean_query(q.message).text
            plan = after._plan(text, analyzers)
            recorded.append((q, plan, calls.run(client, store.analyze(q.principal, plan.requests))))
        print(f"recorded {len(recorded)} analyses; checking identical clauses ...", flush=True)

        def render(side: str, matcher: Any, q: Any, plan: Any, analyses: Any) -> Any:
            tree = before_vocab if side == "before" else vocabulary_module
            vocabulary = tree.TenantVocabulary(
                q.principal.tenant_id, 0, vocabularies[side][q.principal.tenant_id], 0, 0.0, 0
            )
            return lambda: matcher._render(plan, analyses, vocabulary)

        runs = {
            side: [render(side, m, q, plan, a) for q, plan, a in recorded]
            for side, m in (("before", before), ("after", after))
        }
        differing = sum(json.dumps(b()) != json.dumps(a()) for b, a in zip(runs["before"], runs["after"], strict=True))
        report["clauses_differing"] = differing
        report["render"] = _render_rounds(runs, [q.kind for q, _, _ in recorded], args.rounds)
        report["render_summary"] = {
            side: round(statistics.median(x["mean_us"] for x in report["render"] if x["side"] == side), 2)
            for side in ("before", "after")
        }
        if args.profile is not None:
            profiler = cProfile.Profile()
            profiler.runcall(_timed, runs["after"])
            profiler.dump_stats(args.profile)
        classes = {"before": before_vocab.FieldVocabulary, "after": FieldVocabulary}
        report["structure_build"] = _build_costs(classes, vocabularies, groups, units, args.rounds)
        print(f"  structure build: {json.dumps(report['structure_build'])}", flush=True)
        report["restore"] = _restore_costs(classes, vocabularies, args.rounds)
        print(f"  restore with pre-filters: {json.dumps(report['restore'])}", flush=True)
        report["read"], same = _read_costs({"before": before_store, "after": store}, principals, units, args.rounds)
        report["read_units_identical"] = same
        print(f"  read: {json.dumps(report['read'])}, identical {same}", flush=True)
        print(f"clauses differing: {differing} of {len(recorded)}; render mean us {report['render_summary']}")
    finally:
        drop_namespace(base, namespace)
        base.close()
        client.close()
        wind_down(report, result_path(args.out, "vocab-matching", started), servers)
    return 0 if report.get("clauses_differing") == 0 and report.get("read_units_identical") else 1


if __name__ == "__main__":
    raise SystemExit(main())
