"""Does the node's JVM or garbage collector change what a recall costs? Nodes side by side.

Each ``--node`` (``name=/path/to/java[:FLAG,FLAG...]``) is an embedded OpenSearch node on its own
copy of the loaded corpus (``fastpath_bench --load-only``; the first node runs on the state dir
itself, the others on copies made for the run and deleted after it), all up at once, each with its
own API process (one uvicorn worker) and one shared Redis. After priming and warming every API,
blocks of sequential sessions recalls go to each node in turn, the order reversed every round,
and each block records the p50/p99 and the node's and API's CPU per recall from ``/proc``. Because
the blocks alternate within seconds, the machine's drift (tens of percent within minutes here) falls
on every node alike; restarting one node per configuration does not control for it.

A GC selector among the flags (``-XX:+UseParallelGC``...) replaces the dev node's ``-XX:+UseG1GC``.
Stop every other node of the state dir first (its data dir is locked).

    .venv/bin/python -m benchmarks.node_jvm_ab --heap 4g \\
        --node jdk17-g1=/usr/lib/jvm/java-17-openjdk-amd64/bin/java \\
        --node jdk17-par=/usr/lib/jvm/java-17-openjdk-amd64/bin/java:-XX:+UseParallelGC \\
        --node jdk25-g1=/usr/lib/jvm/temurin-25-jdk-amd64/bin/java

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Query, Spec, draw_sessions
from deploy import devstack
from loadtest.__main__ import process_cpu_s

GC_SELECTOR = re.compile(r"^-XX:\+Use\w+GC$")


@dataclass(frozen=True)
class NodeConfig:
    name: str
    java: str
    extra_flags: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> NodeConfig:
        name, sep, rest = text.partition("=")
        if not sep or not name or not rest:
            raise argparse.ArgumentTypeError(f"--node wants name=/path/to/java[:FLAG,...], got {text!r}")
        java, _, flags = rest.partition(":")
        if not Path(java).is_file():
            raise argparse.ArgumentTypeError(f"no java at {java}")
        return cls(name, java, tuple(f for f in flags.split(",") if f))

    def jvm_flags(self) -> list[str]:
        picks_gc = any(GC_SELECTOR.match(f) for f in self.extra_flags)
        base = [f for f in devstack.JVM_FLAGS if not (picks_gc and GC_SELECTOR.match(f))]
        return base + list(self.extra_flags)


@dataclass
class Blocks:
    rows: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, name: str) -> dict[str, Any]:
        def median(key: str) -> float:
            return round(float(statistics.median(row[key] for row in self.rows)), 3)

        return {"node": name, "blocks": len(self.rows), "p50_ms_median": median("p50_ms"),
                "p99_ms_median": median("p99_ms"), "opensearch_cpu_ms_median": median("opensearch_cpu_ms"),
                "api_cpu_ms_median": median("api_cpu_ms")}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--node", type=NodeConfig.parse, action="append", required=True)
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/tenure-fastpath"))  # noqa: S108
    parser.add_argument("--size", type=int, default=1_000_000, help="the loaded corpus (its namespace)")
    parser.add_argument("--heap", default="4g")
    parser.add_argument("--warmup", type=int, default=3000, help="untimed sessions recalls per node")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=600, help="recalls per block")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    if len({n.name for n in args.node}) != len(args.node):
        parser.error("--node names must differ")
    return args


@contextmanager
def stack_of(args: argparse.Namespace) -> Iterator[dict[str, tuple[devstack.Service, fb.Api]]]:
    """Every node and its API, stopped (and the copies deleted) on the way out."""
    with ExitStack() as stack:
        redis = devstack.start_redis(args.state_dir / "redis", fresh=False)
        stack.callback(redis.stop)
        copies = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.state_dir, prefix="jvm-ab-")))
        started: dict[str, tuple[devstack.Service, fb.Api]] = {}
        for i, config in enumerate(args.node):
            home = args.state_dir / "opensearch"
            if i:
                home = copies / config.name
                shutil.copytree(args.state_dir / "opensearch", home, ignore=shutil.ignore_patterns("*.lock", "logs"))
            node = devstack.start_opensearch(home, heap=args.heap, timeout_s=900, fresh=False, java=config.java,
                                             jvm_flags=config.jvm_flags())  # fmt: skip
            stack.callback(node.stop)
            api = fb.Api(fb.Variant.parse("."), node.url, redis.url, fb.namespace_of(args.size), 1,
                         copies / f"api-{config.name}.log")  # fmt: skip
            stack.callback(api.stop)
            started[config.name] = (node, api)
        yield started


def block(node: devstack.Service, api: fb.Api, queries: list[Query]) -> dict[str, Any]:
    worker = api.first_worker()
    node0, api0 = process_cpu_s(node.process.pid), process_cpu_s(worker)
    figures, sent = fb.sequential(api, queries, 0, None)
    node1, api1 = process_cpu_s(node.process.pid), process_cpu_s(worker)
    return {"p50_ms": figures["p50_ms"], "p99_ms": figures["p99_ms"],
            "opensearch_cpu_ms": round((node1 - node0) * 1000 / sent, 3),
            "api_cpu_ms": round((api1 - api0) * 1000 / sent, 3)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = Spec(tenants=1000, users_per_tenant=5)  # fastpath_bench's corpus
    queries = draw_sessions(args.warmup + args.rounds * args.block, args.size, spec, fb.NOW, seed=args.seed,
                            length=10, active=64)  # fmt: skip
    warmup, timed = queries[: args.warmup], queries[args.warmup :]
    with stack_of(args) as started:
        for _, api in started.values():
            asyncio.run(fb.prime(api, spec, 1))
            fb.sequential(api, warmup, 0, None)
        measured = {name: Blocks() for name in started}
        for r in range(args.rounds):
            names = list(started) if r % 2 == 0 else list(started)[::-1]
            for name in names:  # every node gets the same recalls in a round
                row = {"round": r, "node": name, **block(*started[name], timed[r * args.block : (r + 1) * args.block])}
                measured[name].rows.append(row)
                print(json.dumps(row), flush=True)
    for name, blocks in measured.items():
        print(json.dumps(blocks.summary(name)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
