"""Recall latency on one OpenSearch node vs a 3-node cluster, same corpus, same load.

For each size, a fresh cluster of the Maven-built node (deploy/cluster.py, 512 MB heaps), then
the load test's local topology on it (``python -m loadtest --local --opensearch-url ...``: the
API, a worker, beat, the scripted model) with a recall-only mix over the same provisioned corpus
(same tenants, users, seeded beliefs and seed), then the cluster is stopped. The figures are the
load test's recall latency of successful requests and the CPU seconds each part used.

    .venv/bin/python -m benchmarks.cluster_recall_bench --out benchmarks/results/cluster-recall.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from deploy.cluster import Cluster

REPO = Path(__file__).resolve().parents[1]


def measure(size: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / f"load-{size}.json"
    with Cluster(workdir / f"cluster-{size}", size=size, heap="512m") as cluster:
        cmd = [
            sys.executable, "-m", "loadtest", "--local", "--opensearch-url", cluster.url,
            "--mix", "recall=100", "--duration", str(args.duration), "--concurrency", str(args.concurrency),
            "--tenants", "4", "--users-per-tenant", "2", "--seed-beliefs", str(args.seed_beliefs),
            "--api-workers", "2", "--keep-data", "--out", str(out),  # the cluster is thrown away
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        subprocess.run(cmd, cwd=REPO, env=env, check=False)
    result = json.loads(out.read_text())
    recall = result["report"]["ops"]["recall"]
    return {
        "nodes": size,
        "recalls_ok": recall["successes"],
        "recalls_failed": recall["failures"],
        "throughput_ok_s": recall["throughput_ok_s"],
        "latency_ok_ms": recall["latency_ok_ms"],
        "cpu": result["report"]["extra"].get("cpu"),
        "load_average_before": result["machine"]["load_average_before"],
        "load_average_after": result["machine"]["load_average_after"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster_recall_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed-beliefs", type=int, default=50, help="per user")
    parser.add_argument("--sizes", default="1,3")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tenure-cluster-bench-") as tmp:
        runs = [measure(int(size), args, Path(tmp)) for size in args.sizes.split(",")]
    text = json.dumps({"argv": sys.argv[1:], "runs": runs}, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
