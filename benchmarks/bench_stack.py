"""Keep one OpenSearch node and one Redis up for a series of benchmark runs, on a kept state dir.

The HTTP benchmarks (``fastpath_bench``, ``recall_cache_hits``, ``audit_refresh_bench``, …) take
``--opensearch-url`` / ``--redis-url`` and the two processes' pids for the CPU split. Between runs
the node keeps its corpora (1M beliefs take ~10 minutes to build), so it is started once on the
state dir and restarted on the same data after a reboot. This module does that with the same
``deploy/devstack.py`` calls the tests use (the node's JVM options included), writes the four
values to ``<state-dir>/stack.env`` and prints them; the processes run in their own sessions and
outlive this command until ``down``. (``deploy/localstack.py`` starts the whole topology, API and
workers included, for as long as the process that holds it: the benchmarks start their own API
per variant and need only these two servers, across many runs.)

    .venv/bin/python -m benchmarks.bench_stack up --heap 4g          # prints OS=… REDIS=… OS_PID=… REDIS_PID=…
    set -a; . /tmp/tenure-fastpath/stack.env; set +a
    .venv/bin/python -m benchmarks.fastpath_bench --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --redis-pid $REDIS_PID --sizes 1000000 --load-only
    .venv/bin/python -m benchmarks.bench_stack down

Redis starts empty each time unless ``--keep-redis``: what the benchmarks keep in it (rate-limit
counters, vocabularies, receipts) is rebuilt by their warm-up, and a replayed append-only file
would make one run's start differ from another's. ``--gc-log FILE`` adds the node's unified GC
log (``-Xlog:gc``), for attributing a paced pass's slow seconds to young collections.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from deploy.devstack import JVM_FLAGS, process_alive, start_opensearch, start_redis, stop_pid

DEFAULT_STATE_DIR = Path("/tmp/tenure-fastpath")  # noqa: S108 - the benchmarks' shared default
ENV_FILE = "stack.env"


def read_env(state_dir: Path) -> dict[str, str]:
    """The values ``up`` wrote, or an empty dict when nothing was started there."""
    path = state_dir / ENV_FILE
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: shlex.split(value)[0] if value else "" for key, value in pairs}


def _running(pid: str | None, state_dir: Path) -> bool:
    """Whether ``pid`` is still a server ``up`` started there: alive, and its command line (the
    node's) or its working directory (Redis's: it rewrites its command line and changes into its
    ``--dir``) names the state dir. After a reboot the number may belong to another process, which
    ``down`` must never stop."""
    if not pid or not process_alive(pid):
        return False
    where = str(state_dir.resolve())
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        working_dir = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False

    def inside(path: str) -> bool:  # the dir itself or below it, not a sibling sharing its prefix
        return path == where or path.startswith(where + os.sep) or f"={where}{os.sep}" in path

    return inside(working_dir) or any(inside(argument) for argument in arguments)


def up(state_dir: Path, *, heap: str, gc_log: Path | None, keep_redis: bool) -> dict[str, str]:
    """Both servers already running: the same pair. Otherwise both are (re)started, the node on
    its data dir when there is one."""
    env = read_env(state_dir)
    if _running(env.get("OS_PID"), state_dir) and _running(env.get("REDIS_PID"), state_dir):
        return env
    down(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir = state_dir.resolve()
    home = state_dir / "opensearch"
    flags = [*JVM_FLAGS, *([f"-Xlog:gc*:file={gc_log}:uptime,tid"] if gc_log else [])]
    node = start_opensearch(home, heap=heap, timeout_s=900, fresh=not home.exists(), jvm_flags=flags)
    redis = start_redis(state_dir / "redis", fresh=not keep_redis)
    env = {
        "OS": node.url,
        "REDIS": redis.url,
        "OS_PID": str(node.process.pid),
        "REDIS_PID": str(redis.process.pid),
    }
    (state_dir / ENV_FILE).write_text("".join(f"{key}={shlex.quote(value)}\n" for key, value in env.items()))
    return env


def down(state_dir: Path) -> None:
    """Stop both processes (the node flushes its data); the state dir stays for the next ``up``."""
    env = read_env(state_dir)
    for key in ("OS_PID", "REDIS_PID"):
        if _running(env.get(key), state_dir):
            stop_pid(int(env[key]), timeout_s=120)
    (state_dir / ENV_FILE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "env"))
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--heap", default="4g", help="the node's heap (4g holds the 10k, 100k and 1M corpora)")
    parser.add_argument("--gc-log", type=Path, help="also write the node's GC log there")
    parser.add_argument("--keep-redis", action="store_true", help="replay Redis's append-only file")
    args = parser.parse_args(argv)
    if args.command == "down":
        down(args.state_dir)
        return 0
    if args.command == "up":
        env = up(args.state_dir, heap=args.heap, gc_log=args.gc_log, keep_redis=args.keep_redis)
    else:
        env = read_env(args.state_dir)
        if not env:
            print(f"nothing started under {args.state_dir}", file=sys.stderr)
            return 1
    print(" ".join(f"{key}={value}" for key, value in env.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
