"""``python -m loadtest``: provision, load, verify, report (see loadtest/README.md).

Against a running deployment (compose runs exactly this)::

    python -m loadtest --url http://api:8000 --bootstrap --concurrency 32 --duration 120 --out /results/load.json

or against a whole local topology it starts itself (``deploy/localstack.py``)::

    python -m loadtest --local --duration 120 --concurrency 32 --api-workers 2 --out results.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from loadtest.arguments import add_stack_arguments
from loadtest.cleanup import drop_stack_data
from loadtest.generator import LoadConfig, parse_mix, provision, run_load, verify
from loadtest.report import LoadReport
from loadtest.verification import Verification

REPO = Path(__file__).resolve().parents[1]
RSS_INTERVAL_S = 2.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__.split("\n")[0])
    target = p.add_argument_group("target (one of --url or --local)")
    target.add_argument("--url", help="the API's base URL")
    target.add_argument("--key", help="an operator API key")
    target.add_argument(
        "--bootstrap", action="store_true", help="create an operator key through the service layer (TENURE_* env)"
    )
    target.add_argument("--local", action="store_true", help="start deploy/localstack.py's topology and use it")
    add_stack_arguments(target, api_workers=2)  # --opensearch-url, --redis-url: with --local
    target.add_argument("--worker-concurrency", type=int, default=2)
    target.add_argument("--state-dir", type=Path, help="--local: where the stack keeps data and logs")
    target.add_argument(
        "--keep-data", action="store_true", help="--local: keep the run's indices and keys in reused servers"
    )
    load = p.add_argument_group("load")
    load.add_argument("--tenants", type=int, default=4)
    load.add_argument("--users-per-tenant", type=int, default=2)
    load.add_argument("--concurrency", type=int, default=32, help="closed model: workers; open model: in-flight cap")
    load.add_argument("--rate", type=float, help="open model: target requests per second")
    load.add_argument("--duration", type=float, default=60.0, help="seconds")
    load.add_argument("--mix", type=parse_mix, default=parse_mix("recall=80,write=15,turn=5"))
    load.add_argument("--seed-beliefs", type=int, default=20, help="per user, written during provisioning")
    load.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for extraction")
    p.add_argument("--out", type=Path, help="write the full JSON (report, verification, machine) here")
    p.add_argument("--allow-errors", action="store_true", help="exit 0 despite request errors if verification passes")
    return p


def say(text: str) -> None:
    """Progress and results on stdout (the JSON goes to --out)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def wait_ready(url: str, timeout_s: float = 180.0) -> None:
    """Compose may start us before the API answers; wait for /readyz rather than fail provisioning."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url.rstrip('/')}/readyz", timeout=3).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"{url} not ready within {timeout_s:.0f} s")


def bootstrap_key() -> str:
    from service.cli import bootstrap
    from service.config import get_settings

    return str(bootstrap(get_settings(), "loadtest")["key"])


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "commit": commit, "argv": sys.argv[1:]}


def config_from(args: argparse.Namespace, url: str, key: str) -> LoadConfig:
    return LoadConfig(
        url=url,
        operator_key=key,
        tenants=args.tenants,
        users_per_tenant=args.users_per_tenant,
        concurrency=args.concurrency,
        rate=args.rate,
        duration_s=args.duration,
        mix=args.mix,
        seed_beliefs_per_user=args.seed_beliefs,
        request_timeout_s=args.timeout,
        seed=args.seed,
    )


class RssSampler:
    """Peak and end RSS of each stack process, sampled while the load runs."""

    def __init__(self, sample: Callable[[], dict[str, int]]) -> None:
        self.sample = sample
        self.peak: dict[str, int] = {}
        self.end: dict[str, int] = {}
        self.samples = 0

    def take(self) -> None:
        self.end = dict(self.sample())
        self.samples += 1
        for name, value in self.end.items():
            self.peak[name] = max(self.peak.get(name, 0), value)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.take)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RSS_INTERVAL_S)
        await asyncio.to_thread(self.take)

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "interval_s": RSS_INTERVAL_S, "peak_bytes": self.peak, "end_bytes": self.end}


TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of one live process (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def machine_cpu_s(cpu_line: str) -> tuple[float, float, float]:
    """(busy, total, stolen) CPU seconds of the whole machine since boot, from /proc/stat's first
    ``cpu`` line. Busy counts stolen time: the hypervisor gave that core to another guest while
    this one had work, so it was neither idle nor ours (``steal``, the 8th value)."""
    values = [int(v) for v in cpu_line.split()[1:]]
    total = sum(values[:8])
    idle = values[3] + values[4]
    return (total - idle) / TICKS, total / TICKS, values[7] / TICKS


def _machine_cpu_s() -> tuple[float, float, float]:
    return machine_cpu_s(Path("/proc/stat").read_text().splitlines()[0])


class CpuMeter:
    """Where the CPU went during the run: each stack component, the generator, and everything
    else on the machine (other people's jobs on a shared box show up as "other")."""

    def __init__(self, pids: Callable[[], dict[str, list[int]]]) -> None:
        self.pids = pids
        self.start: dict[str, float] = {}
        self.machine_start = (0.0, 0.0, 0.0)
        self.wall_start = 0.0

    def snapshot(self) -> dict[str, float]:
        usage = {name: sum(process_cpu_s(pid) for pid in pids) for name, pids in self.pids().items()}
        usage["loadgen"] = process_cpu_s(os.getpid())
        return usage

    def begin(self) -> None:
        self.start = self.snapshot()
        self.machine_start = _machine_cpu_s()
        self.wall_start = time.monotonic()

    def finish(self) -> dict[str, Any]:
        end = self.snapshot()
        busy, total, stolen = (b - a for a, b in zip(self.machine_start, _machine_cpu_s(), strict=True))
        used = {name: round(end[name] - self.start.get(name, 0.0), 1) for name in end}
        return {
            "wall_s": round(time.monotonic() - self.wall_start, 1),
            "cpu_s": used,
            "machine_busy_cpu_s": round(busy, 1),
            "machine_total_cpu_s": round(total, 1),
            "machine_stolen_cpu_s": round(stolen, 1),
            "other_processes_cpu_s": round(busy - sum(used.values()), 1),
        }


async def drive(
    config: LoadConfig, drain_timeout_s: float, sampler: RssSampler | None = None, cpu: CpuMeter | None = None
) -> tuple[LoadReport, Verification]:
    say(f"provisioning {config.tenants} tenants x {config.users_per_tenant} users ...")
    fleet = await provision(config)
    say(f"running {config.duration_s:.0f} s ...")
    done = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(done)) if sampler else None
    if cpu:
        cpu.begin()
    try:
        report = await run_load(config, fleet)
    finally:
        done.set()
        if sampling:
            await sampling
    if sampler:
        report.extra["rss"] = sampler.to_json()
    if cpu:
        report.extra["cpu"] = cpu.finish()
        say("cpu seconds during the run: " + json.dumps(report.extra["cpu"]))
    say(report.format_summary())
    say("verifying ...")
    verification = await verify(config, fleet, report, drain_timeout_s=drain_timeout_s)
    say(verification.format_summary())
    return report, verification


def run_local(args: argparse.Namespace) -> tuple[LoadReport, Verification, dict[str, Any]]:
    from deploy.localstack import LocalStack, StackConfig

    root = args.state_dir or Path(tempfile.mkdtemp(prefix="tenure-loadtest-"))
    stack_config = StackConfig(
        root=root,
        opensearch_url=args.opensearch_url,
        redis_url=args.redis_url,
        api_workers=args.api_workers,
        worker_concurrency=args.worker_concurrency,
    )
    say(f"starting the local stack in {root} ...")
    with LocalStack(stack_config) as stack:
        config = config_from(args, stack.api_url, stack.operator_key())
        report, verification = asyncio.run(
            drive(config, args.drain_timeout, RssSampler(stack.rss_bytes), CpuMeter(stack.pids))
        )
        stack_info = {
            "root": str(root),
            "namespace": stack_config.namespace,
            "owned": list(stack.owned),
            "api_workers": args.api_workers,
            "worker_concurrency": args.worker_concurrency,
        }
        settings = stack.settings()
    # after the stack stopped: a live worker or API would re-create queue keys
    if (args.opensearch_url or args.redis_url) and not args.keep_data:
        drop_stack_data(settings)
    return report, verification, stack_info


def run_remote(args: argparse.Namespace) -> tuple[LoadReport, Verification, dict[str, Any]]:
    if not args.url:
        raise SystemExit("give --url (with --key or --bootstrap) or --local")
    wait_ready(args.url)
    key = bootstrap_key() if args.bootstrap else args.key
    if not key:
        raise SystemExit("--url needs --key or --bootstrap")
    report, verification = asyncio.run(drive(config_from(args, args.url, key), args.drain_timeout))
    return report, verification, {"url": args.url}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    load_before = os.getloadavg()
    report, verification, target = run_local(args) if args.local else run_remote(args)
    result = {
        "machine": {**machine(), "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "target": target,
        "report": report.to_json(),
        "verification": verification.to_json(),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        say(f"wrote {args.out}")
    failed = not verification.ok or (report.total_errors > 0 and not args.allow_errors)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
