"""The first recall after a belief write: what the tenant's next message pays once a worker has
extracted its last turn, with and without the workers' vocabulary prebuild.

A session in team use: a turn is answered, a worker extracts its sidecar (the tenant's write version
moves), the user reads the answer and types, and the session's next recall arrives. Without the
prebuild (``TENURE_RECALL_VOCABULARY_PREBUILD=false``) the API process that serves that recall
builds the tenant's vocabulary on the request; with it (``service/recall/prebuild.py``) the worker
built it right after the extraction, and the API restores it from Redis. ``fastpath_bench``
never sees either: its traffic writes nothing.

Every ``--variant`` (``fastpath_bench``'s ``name=path[:VAR=value,...]``) gets its own API (one
uvicorn worker, so every request of a variant meets the same process), its own Celery worker
(prefork, one process, the deployment's command) and its own queues, over the loaded corpus
(``fastpath_bench --load-only``: 1,000 tenants of ~1,000 beliefs at 1M). Variants take turns, one
step each, each on tenants of its own (alternate tenants of one shuffled list); a step is:

1. a recall of the tenant (untimed: its vocabulary at the current version is in the process),
2. a turn posted with a sidecar that adds one belief (``POST /v1/turns``), or with ``--write rest``
   the belief itself (``POST /v1/beliefs``: the API writes, and asks a worker for the prebuild),
3. waiting for the turn's extraction (``GET /v1/turns/{id}``), then ``--think-s`` (the user typing),
4. ``first``: a recall naming the new belief's alias (timed; it must recall the belief),
5. ``second``: another message naming it, at the same version (timed: the steady state; not the
   same message, which the analysis and tier caches would answer without OpenSearch).

    .venv/bin/python -m benchmarks.write_then_recall --opensearch-url $OS --redis-url $REDIS \\
        --variant prebuild=. --variant no-prebuild=.:TENURE_RECALL_VOCABULARY_PREBUILD=false

Each step writes one belief into a tenant of the loaded corpus (``wtr_*`` names; they stay).
This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tenure_client import Tenure

from benchmarks import fastpath_bench as fb
from deploy.localstack import celery_worker_args
from loadtest.stats import percentile
from service.extraction.sidecar import BEGIN, END

KINDS = ("first", "second")
SCOPES = ["domain:code"]
FINAL = {"done", "failed", "skipped"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = fb.running_node_parser(__doc__)
    parser.add_argument("--steps", type=int, default=60, help="steps per variant")
    parser.add_argument("--think-s", type=float, default=1.0, help="from the extraction to the next recall")
    parser.add_argument(
        "--write", choices=("turn", "rest"), default="turn",
        help="turn: a turn whose sidecar a worker extracts; rest: POST /v1/beliefs (the API writes)",
    )  # fmt: skip
    parser.add_argument("--tenants", type=int, default=1000, help="the corpus's tenants (t0000 ...)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/tenure-fastpath"))  # noqa: S108
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


class Caller:
    """One variant's API through the SDK: a client per tenant (its ``u0``'s key) on one shared
    connection pool, no retries (an error is an error)."""

    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=60)
        self.clients: dict[str, Tenure] = {}

    def client(self, tenant: str) -> Tenure:
        if tenant not in self.clients:
            self.clients[tenant] = Tenure(self.url, fb.key_of(tenant, "u0")[1], http_client=self.http, max_retries=0)
        return self.clients[tenant]

    def recall(self, tenant: str, message: str) -> tuple[float, list[str]]:
        started = time.perf_counter()
        answer = self.client(tenant).recall_json(message, scopes=SCOPES)
        took_ms = (time.perf_counter() - started) * 1000
        return took_ms, [b["canonical_name"] for b in answer["tiers"]["relevant"]]


@dataclass
class Side:
    """One variant: its API, its extraction worker, its connection and what it measured."""

    name: str
    api: fb.Api
    worker: subprocess.Popen[bytes]
    caller: Caller
    tenants: list[str]
    write: str = "turn"
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    extraction_s: list[float] = field(default_factory=list)
    missed: int = 0  # recalls that did not recall the new belief

    def step(self, index: int, think_s: float, *, timed: bool = True) -> None:
        tenant = self.tenants[index % len(self.tenants)]
        self.caller.recall(tenant, "what did we settle about the release?")  # the current version, held
        name, alias = _new_name()
        client = self.caller.client(tenant)
        if self.write == "turn":
            turn = client.post_turn(**_turn(name, alias))
            extraction_s = self._wait_extracted(tenant, turn.turn_id)
        else:  # the belief itself, through the REST API (stored when the call returns)
            client.beliefs.create(**_belief(name, alias))
            extraction_s = 0.0
        time.sleep(think_s)
        # two different messages: the second is no repeat (a repeat is answered from the caches)
        messages = (f"how should we configure {alias} for the next release?", f"does {alias} need a migration first?")
        for kind, message in zip(KINDS, messages, strict=True):
            took_ms, names = self.caller.recall(tenant, message)
            if timed:
                self.latencies_ms[kind].append(took_ms)
                self.missed += name not in names
        if timed:
            self.extraction_s.append(extraction_s)

    def _wait_extracted(self, tenant: str, turn_id: str) -> float:
        started = time.monotonic()
        while time.monotonic() - started < 60:
            status = self.caller.client(tenant).get_turn(turn_id).extraction_status
            if status in FINAL:
                if status != "done":
                    raise RuntimeError(f"turn {turn_id} of {tenant}: {status}")
                return time.monotonic() - started
            time.sleep(0.1)  # under the per-key rate limit (20/s), however long the first extraction takes
        raise RuntimeError(f"turn {turn_id} of {tenant} not extracted in 60 s (is the {self.name} worker up?)")

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"variant": self.name, "steps": len(self.latencies_ms["first"]), "missed": self.missed}
        for kind in KINDS:
            values = sorted(self.latencies_ms[kind])
            for q in (50, 90, 99):
                out[f"{kind}_p{q}_ms"] = round(percentile(values, q), 2)
            out[f"{kind}_max_ms"] = round(values[-1], 2)
        out["extraction_p50_s"] = round(percentile(sorted(self.extraction_s), 50), 3)
        return out


def _new_name() -> tuple[str, str]:
    """A belief name and an alias no tenant of the corpus holds (so the recall's hit is this one)."""
    tag = uuid.uuid4().hex[:8]
    return f"wtr_{tag}_pipeline", f"wtr{tag}"


def _belief(name: str, alias: str) -> dict[str, Any]:
    return {
        "type": "decision", "canonical_name": name, "content": f"The {alias} pipeline ships behind a flag.",
        "why_it_matters": f"Gate {alias} changes.", "scope": SCOPES, "aliases": [alias],
    }  # fmt: skip


def _turn(name: str, alias: str) -> dict[str, Any]:
    belief = {
        **_belief(name, alias), "subtype": None, "confidence": 0.8, "epistemic_status": "active",
        "resolves_open_question": None,
    }  # fmt: skip
    sidecar = {
        "turn_signal": "substantive", "topic_shift": False, "topic_label": "release", "new_beliefs": [belief],
        "belief_updates": [], "entity_updates": [], "possible_alias_candidates": [], "resolved_open_questions": [],
        "new_open_questions": [], "style_signals": [],
    }  # fmt: skip
    answer = f"Noted: {alias} ships behind a flag.{BEGIN}{json.dumps(sidecar)}{END}"
    return {"model": "gpt-4o", "scope": SCOPES, "session_id": f"wtr-{uuid.uuid4().hex[:6]}",
            "user_message": f"we settled {alias}", "assistant_message": answer}  # fmt: skip


def _worker(variant: fb.Variant, args: argparse.Namespace, prefix: str, log: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(variant.source),
        "TENURE_OPENSEARCH_URL": args.opensearch_url,
        "TENURE_REDIS_URL": args.redis_url,
        "TENURE_OPENSEARCH_NAMESPACE": fb.namespace_of(args.size),
        "TENURE_AUTH_API_KEY_PEPPER": fb.PEPPER,
        **variant.env,
    }
    worker = celery_worker_args(prefix, name=f"wtr-{variant.name}", loglevel="WARNING")
    return subprocess.Popen([str(variant.python()), "-m", *worker], cwd=variant.source, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


@contextmanager
def sides(args: argparse.Namespace) -> Iterator[list[Side]]:
    tenants = [f"t{t:04d}" for t in range(args.tenants)]
    random.Random(args.seed).shuffle(tenants)
    variants = [fb.Variant.parse(text) for text in args.variant]
    with ExitStack() as stack:
        started: list[Side] = []
        for k, variant in enumerate(variants):
            # its own queues: a variant's turns are extracted by its own worker only
            prefix = f"{fb.namespace_of(args.size)}-wtr-{variant.name}"
            variant.env.setdefault("TENURE_CELERY_QUEUE_PREFIX", prefix)
            log = stack.enter_context((args.log_dir / f"wtr-{variant.name}.log").open("ab"))
            api = fb.Api(variant, args.opensearch_url, args.redis_url, fb.namespace_of(args.size), 1,
                         args.log_dir / f"wtr-api-{variant.name}.log")  # fmt: skip
            stack.callback(api.stop)
            worker = _worker(variant, args, variant.env["TENURE_CELERY_QUEUE_PREFIX"], log)
            stack.callback(fb._terminate, worker)
            caller = Caller(api.url)
            stack.callback(caller.http.close)
            started.append(Side(variant.name, api, worker, caller, tenants[k :: len(variants)], args.write))
        yield started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with sides(args) as started:
        for side in started:  # the worker is up when a first turn is extracted
            side.step(0, args.think_s, timed=False)
        for index in range(1, args.steps + 1):
            order = started if index % 2 else started[::-1]
            for side in order:
                side.step(index, args.think_s)
        rows = [side.row() for side in started]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
