"""How often the recall caches hit on ``fastpath_bench``'s traffic: the ``tenure_cache_*`` metrics
of one API worker (service/telemetry/cache_metrics.py) scraped before and after a sequential pass.

Over the loaded corpus (``fastpath_bench --load-only``): one uvicorn worker from ``--variant``'s
tree (``name=path[:VAR=value,...]``, e.g. ``.:TENURE_RECALL_DECODE_CACHE_ENTRIES=100000``),
primed and warmed as ``fastpath_bench`` does, then ``--recalls`` of the traffic's timed phase one
after another. Prints, per cache and part, hits and misses per recall and the hit ratio, then
evictions per recall and what each cache holds at the end (entries, estimated bytes). One worker,
so one scrape sees every lookup (without ``PROMETHEUS_MULTIPROC_DIR`` a scrape reads its own
process only).

    .venv/bin/python -m benchmarks.recall_cache_hits --opensearch-url $OS --redis-url $REDIS \\
        --size 1000000 [--variant main=.] [--seed 903] [--recalls 2000]

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import fastpath_bench as fb

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    response = httpx.get(f"{url}/metrics", timeout=30)
    response.raise_for_status()
    text = response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("tenure_cache_") and not s.name.endswith("_created")
    }


def worker_rss_mb(pid: int) -> float:
    """The API worker's resident memory (``VmRSS``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def summarise(before: Samples, after: Samples, recalls: int) -> dict[str, Any]:
    """Lookups and evictions grown over the pass, per recall; entries and bytes at its end."""
    lookups: dict[str, dict[str, dict[str, float]]] = {}
    evictions: dict[str, float] = {}
    held: dict[str, dict[str, float]] = {}
    for (name, labels), now in after.items():
        label = dict(labels)
        grown = now - before.get((name, labels), 0.0)
        if name == "tenure_cache_lookups_total":
            part = lookups.setdefault(label["cache"], {}).setdefault(label["part"], {"hit": 0.0, "miss": 0.0})
            part[label["outcome"]] = grown / recalls
        elif name == "tenure_cache_evictions_total":
            evictions[label["cache"]] = round(grown / recalls, 3)
        else:
            held.setdefault(label["cache"], {})[name.removeprefix("tenure_cache_")] = now
    for parts in lookups.values():
        for counted in parts.values():
            total = counted["hit"] + counted["miss"]
            counted["hit_ratio"] = round(counted["hit"] / total, 3) if total else 0.0
            counted["hit"], counted["miss"] = round(counted["hit"], 3), round(counted["miss"], 3)
    return {"lookups_per_recall": lookups, "evictions_per_recall": evictions, "held": held}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opensearch-url", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--size", type=int, required=True, help="the loaded corpus (fastpath_bench --sizes)")
    parser.add_argument("--variant", default="main=.", help="name=path[:VAR=value,...] (fastpath_bench's)")
    parser.add_argument("--seed", type=int, default=903)
    parser.add_argument("--warmup", type=int, default=3000)
    parser.add_argument("--recalls", type=int, default=2000)
    parser.add_argument("--active-sessions", type=int, default=64, help="sessions running at once (fastpath_bench's)")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/tenure-fastpath"))  # noqa: S108
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    bench = fb.parse_args(
        ["--opensearch-url", args.opensearch_url, "--redis-url", args.redis_url, "--sizes", str(args.size),
         "--traffic", "sessions", "--warmup", str(args.warmup), "--queries", str(args.recalls),
         "--seed", str(args.seed), "--api-workers", "1", "--active-sessions", str(args.active_sessions)]
    )  # fmt: skip
    spec = fb.Spec(tenants=bench.tenants, users_per_tenant=bench.users_per_tenant)
    variant = fb.Variant.parse(args.variant)
    log = args.state_dir / f"api-cache-hits-{variant.name}.log"
    api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), 1, log)
    try:
        asyncio.run(fb.prime(api, spec, 4))
        phases = fb.Phases.split(fb.traffic(bench, "sessions", args.size, spec), bench)
        asyncio.run(fb.warm(api, phases.warmup, fb.WARM_LANES))
        rss_before = worker_rss_mb(api.first_worker())
        before = scrape(api.url)
        sequential, sent = fb.sequential_by("sync-keepalive")(api, phases.timed[: args.recalls], 0, None)
        rss = {"after_warmup": rss_before, "after": worker_rss_mb(api.first_worker())}
        result = {"size": args.size, "variant": args.variant, "seed": args.seed, "recalls": sent,
                  "active_sessions": args.active_sessions, "worker_rss_mb": rss,
                  "errors": sequential["errors"], **summarise(before, scrape(api.url), max(sent, 1))}  # fmt: skip
    finally:
        api.stop()
    print(f"{args.size} beliefs, {sent} recalls ({result['errors']} errors), variant {args.variant}")
    for cache, parts in sorted(result["lookups_per_recall"].items()):
        for part, counted in sorted(parts.items()):
            hit, miss, ratio = counted["hit"], counted["miss"], counted["hit_ratio"]
            print(f"  {cache:17} {part:9} hit {hit:6.2f} miss {miss:6.2f} ratio {ratio}")
    print("  evictions per recall:", result["evictions_per_recall"])
    print("  held:", json.dumps(result["held"]), "worker RSS MB:", rss)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
