"""What a recall costs the OpenSearch node, and how much of it is the injection receipts.

``fastpath_bench`` reports the node's CPU per recall as one figure. This splits it two ways, over
the loaded corpus (``fastpath_bench --load-only``) and one variant's API (one uvicorn worker, its
receipt drain beside it, as a deployment runs them):

- **receipts**: blocks of sequential sessions recalls alternate between the drain running (each
  recall's receipt is moved into the audit index within a second: bulk indexing, refreshes and
  merges on the node) and the drain paused (``SIGSTOP``: the receipts wait in the Redis outbox).
  After every block the drain is resumed and the outbox emptied before the next block starts,
  outside any measurement; so a running block's last second of receipts is moved after it (at
  ~200 recalls/s, a block of 3,000 undercounts the receipts' cost by ~1/15). The node's, the API
  worker's and the drain's CPU per recall are read from ``/proc`` around each block, so the
  machine's drift falls on both modes alike.
- **where the node's time goes** (``--jfr``): the first block with the drain running is recorded
  by the JDK's Flight Recorder in the node (``jcmd JFR.start``; the sampling period is
  ``--jfr-period-ms``; a 1 ms recording once nearly doubled the node's CPU of the run it
  covered: read its shares, not the CPU of the recorded block, and check a share that matters
  with an A/B) and the top frames of the samples are printed, by self time and inclusive.

    .venv/bin/python -m benchmarks.node_cpu_split --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --variant main=. [--jfr /tmp/node.jfr]

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import fastpath_bench as fb
from benchmarks.http_scale_bench import summarise_profile
from benchmarks.recall_bench import Query, Spec, draw_sessions
from benchmarks.recall_cost_split import Caller, latency_row
from loadtest.__main__ import process_cpu_s

MODES = ("drain-running", "drain-paused")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = fb.running_node_parser(__doc__)
    parser.add_argument("--opensearch-pid", type=int, required=True, help="the node's JVM (its CPU is read)")
    parser.add_argument("--warmup", type=int, default=3000, help="untimed sessions recalls")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per mode")
    parser.add_argument("--block", type=int, default=3000, help="recalls per block")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--jfr", type=Path, help="record the running blocks in the node to this file")
    parser.add_argument("--jfr-period-ms", type=int, default=10, help="the recording's sampling period")
    parser.add_argument("--top", type=int, default=25, help="frames printed from the recording")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/tenure-fastpath"))  # noqa: S108
    args = parser.parse_args(argv)
    if len(args.variant) != 1:
        parser.error("one --variant: the split is of one API's recalls")
    return args


@dataclass
class ModeFigures:
    """One mode's timings, and the CPU seconds each process spent over its blocks."""

    latencies_ms: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)

    def row(self, mode: str) -> dict[str, Any]:
        n = len(self.latencies_ms)
        per_recall = {f"{name}_cpu_ms": round(seconds * 1000 / n, 3) for name, seconds in sorted(self.cpu_s.items())}
        return {"mode": mode, **latency_row(self.latencies_ms), **per_recall}


def modes_of(block: int) -> tuple[str, str]:
    """The two modes in this block's order: reversed every other block, so neither always runs
    first after the outbox was emptied."""
    return MODES if block % 2 == 0 else (MODES[1], MODES[0])


def frame_name(frame: dict[str, Any]) -> str:
    method = frame["method"]
    return f"{method['type']['name'].replace('/', '.')}.{method['name']}"


def top_frames(samples: Iterable[list[str]], top: int) -> dict[str, Any]:
    """The share of samples (innermost frame first in each) whose innermost frame is each method
    (``self``), and whose stack holds it anywhere (``inclusive``, a method counted once per
    sample), the ``top`` largest of each, as percentages."""
    # http_scale_bench's py-spy summary counts the same shares, over stacks written root first
    summary = summarise_profile([(frames[::-1], 1) for frames in samples], within="", top=sys.maxsize)

    def ranked(shares: dict[str, float]) -> list[tuple[str, float]]:
        return sorted(shares.items(), key=lambda item: (-item[1], item[0]))[:top]  # ties by name: stable output

    return {
        "samples": summary["samples"],
        "self": ranked(summary["self_pct"]),
        "inclusive": ranked(summary["inclusive_pct"]),
    }


def recorded_samples(recording: Path) -> Iterator[list[str]]:
    """The execution samples of a JFR recording, as stacks of method names (``jfr print``)."""
    printed = subprocess.run(
        ["jfr", "print", "--json", "--events", "jdk.ExecutionSample", "--stack-depth", "96", str(recording)],
        check=True, capture_output=True,
    )  # fmt: skip
    for event in json.loads(printed.stdout)["recording"]["events"]:
        trace = event["values"].get("stackTrace") or {}
        yield [frame_name(f) for f in trace.get("frames", [])]


def _settings_file(period_ms: int, into: Path) -> Path:
    """JFR's ``profile`` settings with the method sampling period set (``jcmd`` takes a file)."""
    jfc = Path(os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")) / "lib/jfr/profile.jfc"
    default = '<setting name="period" control="method-sampling-java-interval">10 ms</setting>'
    text = jfc.read_text()
    if default not in text:
        raise RuntimeError(f"{jfc} does not sample methods every 10 ms as JDK 17's does: set the period by hand")
    into.write_text(text.replace(default, default.replace("10 ms", f"{period_ms} ms")))
    return into


@contextmanager
def recording(pid: int, out: Path | None, period_ms: int) -> Iterator[None]:
    """Records the node while the block runs (nothing when ``out`` is None), written to ``out``
    when the block ends."""
    if out is None:
        yield
        return
    settings = _settings_file(period_ms, out.with_suffix(".jfc"))
    subprocess.run(["jcmd", str(pid), "JFR.start", "name=node-cpu-split", f"settings={settings}", f"filename={out}"],
                   check=True, capture_output=True)  # fmt: skip
    try:
        yield
    finally:
        subprocess.run(["jcmd", str(pid), "JFR.stop", "name=node-cpu-split"], check=True, capture_output=True)


def _signal_drain(api: fb.Api, sig: signal.Signals) -> None:
    for process in api.drain.processes:
        os.killpg(process.pid, sig)


def _cpu(api: fb.Api, os_pid: int, worker: int) -> dict[str, float]:
    return {
        "opensearch": process_cpu_s(os_pid),
        "api": process_cpu_s(worker),
        "drain": sum(process_cpu_s(p) for p in api.drain.pids()),
    }


def run_block(
    api: fb.Api,
    caller: Caller,
    queries: list[Query],
    mode: str,
    args: argparse.Namespace,
    into: ModeFigures,
    jfr: Path | None = None,
) -> None:
    paused = mode == "drain-paused"
    if paused:
        _signal_drain(api, signal.SIGSTOP)
    try:
        with recording(args.opensearch_pid, jfr, args.jfr_period_ms):
            before = _cpu(api, args.opensearch_pid, caller.worker)
            for query in queries:
                t0 = time.perf_counter()
                caller.recall(query, query.message)
                into.latencies_ms.append((time.perf_counter() - t0) * 1000)
            after = _cpu(api, args.opensearch_pid, caller.worker)
    finally:
        if paused:
            _signal_drain(api, signal.SIGCONT)
    for name, seconds in after.items():
        into.cpu_s[name] = into.cpu_s.get(name, 0.0) + seconds - before[name]
    api.drain.wait_empty(below=1)  # this block's receipts leave the outbox before the next starts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = Spec(tenants=1000, users_per_tenant=5)  # fastpath_bench's corpus
    n = args.warmup + 2 * args.blocks * args.block
    queries = draw_sessions(n, args.size, spec, fb.NOW, seed=args.seed, length=10, active=64)
    warmup, rest = queries[: args.warmup], queries[args.warmup :]
    variant = fb.Variant.parse(args.variant[0])
    api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), 1,
                 args.log_dir / f"node-cpu-split-{variant.name}.log")  # fmt: skip
    figures = {mode: ModeFigures() for mode in MODES}
    try:
        asyncio.run(fb.prime(api, spec, 1))
        fb.sequential(api, warmup, 0, None)
        api.drain.wait_empty(below=1)
        caller = Caller(api)
        for b in range(args.blocks):
            for i, mode in enumerate(modes_of(b)):
                start = (2 * b + i) * args.block
                jfr = args.jfr if b == 0 and mode == "drain-running" else None
                run_block(api, caller, rest[start : start + args.block], mode, args, figures[mode], jfr)
    finally:
        api.stop()
    for mode in MODES:
        print(json.dumps({"variant": variant.name, **figures[mode].row(mode)}), flush=True)
    if args.jfr:
        print(json.dumps({"jfr": str(args.jfr), **top_frames(recorded_samples(args.jfr), args.top)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
