"""Sequential recall over HTTP against a running node, for quick A/B runs of source trees or
settings (``fastpath_bench`` measures everything; this only its sequential pass, in ~1 minute).

Each ``--variant`` (``fastpath_bench``'s ``name=path[:VAR=value,...]``) is started in turn under
uvicorn with one worker and the receipt drain (``fastpath_bench.Api``), sent ``--warmup`` session
recalls untimed, then the next ``--queries`` timed; the variants alternate for ``--rounds``
rounds, so drift of the machine falls on both. The corpus and accounts must already be loaded
(``fastpath_bench --load-only``); a node started from that state dir serves them.

    .venv/bin/python -m benchmarks.sequential_ab --opensearch-url $OS --redis-url $REDIS \\
        --variant freeze-startup=.:TENURE_GC_THAW_INTERVAL_S=0 --variant default=. --rounds 2

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import fastpath_bench as fb
from benchmarks.recall_bench import Spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = fb.running_node_parser(__doc__)
    parser.add_argument("--traffic", choices=("sessions", "random"), default="sessions")
    parser.add_argument("--warmup", type=int, default=3000)
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-s", type=float, default=90.0, help="per pass")
    parser.add_argument("--log", type=Path, default=Path("/tmp/tenure-fastpath/sequential-ab-api.log"))  # noqa: S108
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    calls = fb.parse_args(["--queries", str(args.queries), "--warmup", str(args.warmup), "--seed", str(args.seed)])
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)  # fastpath_bench's corpus
    queries = fb.traffic(calls, args.traffic, args.size, spec)
    warmup, timed = queries[: args.warmup], queries[args.warmup : args.warmup + args.queries]
    rows = []
    for round_no in range(1, args.rounds + 1):
        for text in args.variant:
            variant = fb.Variant.parse(text)
            api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), 1, args.log)
            try:
                api.drain.wait_empty()
                fb.sequential(api, warmup, 0, args.max_s)
                result, _ = fb.sequential(api, timed, 0, args.max_s)
            finally:
                api.stop()
            rows.append({"round": round_no, "variant": variant.name, "env": variant.env, **result})
            print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
