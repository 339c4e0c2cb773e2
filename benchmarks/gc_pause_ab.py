"""Pauses of the API's processes under paced load, variants side by side: what each collection
costs, how often the process stalls, and what that does to the paced latency.

Every ``--variant`` (``fastpath_bench``'s ``name=path[:VAR=value,...]``) runs at the same time in
its own API (``--api-workers`` uvicorn workers, its own receipt drain) against the loaded corpus
(``fastpath_bench --load-only``), with ``benchmarks/process_monitor`` on its ``PYTHONPATH``: each
API process records its collections and stalls. After priming and warming every API, one open
loop of ``--rate`` recalls/s sends request k to variant k mod n, so the variants share the
machine's drift (tens of percent within minutes here) request by request instead of minute by
minute. Latency counts from each request's due time, as in ``fastpath_bench``'s paced pass.

Per variant: the paced p50/p99/p99.9/max and errors; the API's and the node's CPU per recall from
``/proc`` (the node's is shared, so one figure for the run); and from the monitor, per API worker
and summed: collections over 2 ms, the longest one's CPU, all collections' CPU, stalls over 30 ms
and the longest, and the frozen objects and RSS at the end.

    .venv/bin/python -m benchmarks.gc_pause_ab --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --rate 100 --seconds 120 \\
        --variant lazy=.:TENURE_GC_COLLECT_INTERVAL_S=0 --variant paced=.

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Awaitable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec, draw_sessions
from loadtest.__main__ import process_cpu_s
from loadtest.stats import latency_block

MONITOR = Path(__file__).resolve().parent / "process_monitor"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = fb.running_node_parser(__doc__)
    parser.add_argument("--opensearch-pid", type=int, help="the node's JVM, for its CPU per recall")
    parser.add_argument("--rate", type=float, default=100.0, help="recalls/s over all variants")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3000, help="sequential recalls per variant first")
    parser.add_argument("--grace-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    return parser.parse_args(argv)


def monitored(variant: fb.Variant, monitor_dir: Path) -> fb.Variant:
    """The variant with the process monitor first on its path, writing into ``monitor_dir``."""
    env = {**variant.env, "PYTHONPATH": f"{MONITOR}:{variant.source}", "TENURE_BENCH_MONITOR_DIR": str(monitor_dir)}
    return replace(variant, env=env)


@dataclass
class Side:
    """One variant under test: its API, where its processes write their timelines, what it got."""

    api: fb.Api
    monitor_dir: Path
    tally: fb.Tally = field(default_factory=fb.Tally)
    cpu_s: float = 0.0

    def api_cpu_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.api.pids())


async def interleaved(sides: list[Side], queries: list[Query], rate: float, seconds: float, grace_s: float) -> None:
    """Request k is due at start + k/rate and goes to side k mod n; each side over its own
    ``fb.MAX_IN_FLIGHT`` connections, shedding beyond them like ``fastpath_bench``'s paced pass."""
    async with contextlib.AsyncExitStack() as stack:
        callers = [await stack.enter_async_context(fb.lanes_to(s.api, fb.MAX_IN_FLIGHT)) for s in sides]

        def request(k: int, due: float) -> Awaitable[None]:
            return sides[k % len(sides)].tally.send(callers[k % len(sides)], queries[k % len(queries)], due)

        unanswered, _ = await fb.open_loop(rate, int(rate * seconds), seconds + grace_s, request)
    for k in unanswered:
        sides[k % len(sides)].tally.fail("unanswered")


def timeline(path: Path, since: float, until: float) -> list[list[Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if since <= r[1] <= until]


def ask_frozen_counts(monitor_dir: Path) -> None:
    """Ask every monitored process of ``monitor_dir`` for its frozen objects (``SIGUSR1``: a walk
    of the permanent generation that holds the GIL, so only after the measured window)."""
    for path in monitor_dir.glob("*.jsonl"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(path.stem), signal.SIGUSR1)


def frozen_after(path: Path, until: float) -> int | None:
    """The frozen objects a process reported after the window (:func:`ask_frozen_counts`)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    answers = [r[2] for r in rows if r[0] == "frozen" and r[1] >= until]
    return answers[-1] if answers else None


def worker_figures(events: list[list[Any]], frozen: int | None = None) -> dict[str, Any]:
    """What one process's timeline says about the measured window (``frozen``: its frozen objects
    just after it)."""
    collections = [e for e in events if e[0] == "gc" and e[3] > 2]
    stalls = [e[2] for e in events if e[0] == "lag" and e[2] > 30]
    heap = [e for e in events if e[0] == "heap"]
    return {
        "collections_over_2ms": len(collections),
        "longest_collection_cpu_ms": round(max((e[4] for e in collections), default=0.0), 1),
        "longest_collection_wall_ms": round(max((e[3] for e in collections), default=0.0), 1),
        "collections_cpu_ms": round(sum(e[4] for e in events if e[0] == "gc"), 1),
        "stalls_over_30ms": len(stalls),
        "longest_stall_ms": round(max(stalls, default=0.0), 1),
        "frozen_objects": frozen,
        "rss_mb": round(heap[-1][2] / 1024, 1) if heap else None,
    }


def row(name: str, side: Side, since: float, until: float, node_cpu_ms: float | None) -> dict[str, Any]:
    tally = side.tally
    answered = len(tally.timings)
    workers = {
        p.stem: worker_figures(timeline(p, since, until), frozen_after(p, until))
        for p in sorted(side.monitor_dir.glob("*.jsonl"))
    }
    # uvicorn's own process only supervises; a worker counts even when no collection ran in the
    # window (a lazy worker may have none in 90 s), its stalls included
    api_workers = {pid: w for pid, w in workers.items() if int(pid) != side.api.process.pid}
    return {
        "variant": name,
        "paced": {**latency_block(tally.timings), "errors": sum(tally.causes.values()), "causes": tally.causes},
        "api_cpu_ms_per_recall": round(side.cpu_s * 1000 / max(answered, 1), 3),
        "node_cpu_ms_per_recall_all_variants": node_cpu_ms,
        "longest_collection_cpu_ms": max((w["longest_collection_cpu_ms"] for w in api_workers.values()), default=0.0),
        "collections_cpu_ms": round(sum(w["collections_cpu_ms"] for w in api_workers.values()), 1),
        "stalls_over_30ms": sum(w["stalls_over_30ms"] for w in api_workers.values()),
        "longest_stall_ms": max((w["longest_stall_ms"] for w in api_workers.values()), default=0.0),
        "workers": api_workers,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = Spec(tenants=1000, users_per_tenant=5)  # fastpath_bench's corpus
    paced_n = int(args.rate * args.seconds)
    queries = draw_sessions(args.warmup + paced_n, args.size, spec, fb.NOW, seed=args.seed, length=10, active=64)
    warmup, measured = queries[: args.warmup], queries[args.warmup :]
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="gc-pause-") as tmp:
        sides: dict[str, Side] = {}
        for text in args.variant:
            variant = fb.Variant.parse(text)
            monitor_dir = Path(tmp) / variant.name
            monitor_dir.mkdir()
            log = args.log_dir / f"gc-pause-{variant.name}.log"
            api = fb.Api(monitored(variant, monitor_dir), args.opensearch_url, args.redis_url,
                         fb.namespace_of(args.size), args.api_workers, log)  # fmt: skip
            stack.callback(api.stop)
            sides[variant.name] = Side(api, monitor_dir)
        for side in sides.values():
            asyncio.run(fb.prime(side.api, spec, 4))
            fb.sequential(side.api, warmup, 0, None)
        node0 = process_cpu_s(args.opensearch_pid) if args.opensearch_pid else 0.0
        cpu0 = {name: side.api_cpu_s() for name, side in sides.items()}
        since = time.time()
        asyncio.run(interleaved(list(sides.values()), measured, args.rate, args.seconds, args.grace_s))
        until = time.time()
        for name, side in sides.items():
            side.cpu_s = side.api_cpu_s() - cpu0[name]
        answered = sum(len(s.tally.timings) for s in sides.values())
        node_cpu_ms = None
        if args.opensearch_pid:
            node_cpu_ms = round((process_cpu_s(args.opensearch_pid) - node0) * 1000 / max(answered, 1), 3)
        for side in sides.values():
            ask_frozen_counts(side.monitor_dir)
        time.sleep(1.5)  # the monitors' last flush
        rows = [row(name, side, since, until, node_cpu_ms) for name, side in sides.items()]
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if k != "workers"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
