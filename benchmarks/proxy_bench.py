"""Memory-loop figures: the proxy's added latency over calling the upstream directly, and
extraction throughput of one Celery worker.

- Non-streaming: p50/p99 of a chat completion through the proxy (auth, recall over the paper's
  29-belief corpus, system prompt, upstream call, sidecar split, turn recorded, extraction
  enqueued) minus the same request sent straight to the scripted upstream.
- Streaming: time to first content token, proxy vs direct.
- Extraction: sidecars merged per second by one worker (prefork, concurrency 1) draining a queue
  of recorded turns, each sidecar with a new belief, an entity update and a reinforcement.
- With ``--in-flight N``: N chats in flight at once against an upstream that answers after
  ``--delay-ms`` (a model's time), over N keep-alive connections: the app process's CPU per chat
  (from ``/proc``) and the added p50/p99 over the delay. What the proxy's upstream client costs
  grows with the calls it holds (httpx's pool scanned them all per request; httpx2's does not).
  ``--app-source DIR`` runs the app from another checkout (the upstream and the load stay this
  one's), for a before/after.

Real OpenSearch and Redis (started fresh unless URLs are given), the real app served by uvicorn
and the scripted OpenAI-compatible upstream (loadtest/scripted_llm.py) each in their own process on
loopback, as deployed; the load generator is a third process.

    .venv/bin/python -m benchmarks.proxy_bench                       # own OpenSearch + Redis
    .venv/bin/python -m benchmarks.proxy_bench --opensearch-url http://127.0.0.1:9250 \\
        --redis-url redis://127.0.0.1:6399/3 -n 500

This is a benchmark, not a test: it prints figures (and writes them as JSON with --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
from pydantic import SecretStr
from tenure_client import Tenure

from deploy.devstack import free_port, start_opensearch, start_redis
from deploy.localstack import celery_worker_args
from evals.cases import paper_case_set
from evals.runner import load_corpus
from loadtest.__main__ import process_cpu_s
from loadtest.http import make_client
from loadtest.stats import percentile
from service.api.http_protocol import uvicorn_http_option
from service.api.state import Services
from service.config import AuthSettings, CelerySettings, MemoryLoopSettings, Settings
from service.extraction.queue import TaskQueue
from service.extraction.sidecar import BEGIN, END
from service.storage.client import build_client
from service.storage.templates import FAMILIES, apply_templates, drop_namespace
from service.storage.turns import TurnRecord, TurnStore

REPO = Path(__file__).resolve().parents[1]
ANSWER = "For a pure cache use allkeys-lru; keep volatile-lru if some keys must persist. " * 3


def sidecar(i: int) -> str:
    body = {
        "turn_signal": "substantive",
        "topic_shift": False,
        "topic_label": "redis eviction",
        "new_beliefs": [
            {
                "type": "decision",
                "subtype": None,
                "canonical_name": f"bench_decision_{i}",
                "content": f"Decision number {i}.",
                "why_it_matters": "Shapes benchmark answers.",
                "scope": ["domain:code"],
                "confidence": 0.8,
                "epistemic_status": "active",
                "aliases": [f"bench {i}"],
                "resolves_open_question": None,
            }
        ],
        "belief_updates": [{"belief_id": "b-kubernetes-entity", "change": "reinforced"}],
        "entity_updates": [{"canonical_name": "redis_cache", "new_aliases": [f"eviction {i % 20}"]}],
        "possible_alias_candidates": [],
        "resolved_open_questions": [],
        "new_open_questions": [],
        "style_signals": [],
    }
    return f"{BEGIN}{json.dumps(body)}{END}"


@contextmanager
def stack(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    services = []
    with tempfile.TemporaryDirectory(prefix="tenure-proxy-bench-") as tmp:
        os_url, redis_url = args.opensearch_url, args.redis_url
        if not os_url:
            svc = start_opensearch(Path(tmp) / "os", heap=args.heap)
            services.append(svc)
            os_url = svc.url
        if not redis_url:
            rsvc = start_redis(Path(tmp) / "redis")
            services.append(rsvc)
            redis_url = rsvc.url
        try:
            yield os_url, redis_url
        finally:
            for s in services:
                s.stop()


def env_for(settings: Settings) -> dict[str, str]:
    return {
        "TENURE_OPENSEARCH_URL": settings.opensearch_url,
        "TENURE_OPENSEARCH_NAMESPACE": settings.opensearch_namespace,
        "TENURE_REDIS_URL": settings.redis_url,
        "TENURE_CELERY_QUEUE_PREFIX": settings.celery.queue_prefix,
        "TENURE_AUTH_API_KEY_PEPPER": settings.auth.api_key_pepper.get_secret_value(),
        "TENURE_LOOP_UPSTREAM_BASE_URL": settings.loop.upstream_base_url or "",
        "TENURE_LOOP_UPSTREAM_API_KEY": "sk-upstream",
        # measure the proxy, not the per-credential rate limit (20/s by default)
        "TENURE_API_RATE_LIMIT_PER_S": "100000",
        "TENURE_API_RATE_LIMIT_BURST": "1000000",
        "TENURE_API_TENANT_RATE_LIMIT_PER_S": "1000000",
        "TENURE_API_TENANT_RATE_LIMIT_BURST": "10000000",
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
    }


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


@contextmanager
def processes(
    settings: Settings,
    upstream_port: int,
    app_port: int,
    tmp: Path,
    app_env: dict[str, str] | None = None,
    *,
    source: Path = REPO,
    delay_ms: float = 0.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """The scripted upstream and the app (uvicorn), each in its own process, as deployed; yields
    the app's. ``app_env``: settings for the app only (``--app-env``); ``source``: the checkout the
    app runs from (the upstream is always this one's); ``delay_ms``: the upstream's time per answer."""
    reply = tmp / "reply.txt"
    reply.write_text(ANSWER + sidecar(0))
    upstream = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtest.scripted_llm",
            "--port",
            str(upstream_port),
            "--content-file",
            str(reply),
            "--delay-ms",
            str(delay_ms),
        ],
        cwd=REPO,
        env=env_for(settings),
    )
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "service.app:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(app_port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--http",
            uvicorn_http_option(),
        ],
        cwd=source,
        env={**env_for(settings), "PYTHONPATH": str(source), **(app_env or {})},
    )
    try:
        wait_http(f"http://127.0.0.1:{app_port}/readyz", timeout=180)  # start-up takes a minute on a busy box
        yield app
    finally:
        for proc in (app, upstream):
            proc.terminate()
            proc.wait(timeout=30)


def first_token_s(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> float:
    started = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: {") and '"content"' in line:
                elapsed = time.perf_counter() - started
                for _ in lines:
                    pass
                return elapsed
    raise RuntimeError("no content in stream")


def latency(args: argparse.Namespace, upstream: str, base: str, key: str) -> dict[str, Any]:
    messages = chat_messages()
    headers = {"Authorization": f"Bearer {key}"}
    direct_h = {"Authorization": "Bearer sk-upstream"}
    out: dict[str, Any] = {}
    with httpx.Client(timeout=30) as client:

        def body(i: int, stream: bool) -> dict[str, Any]:
            return {
                "model": "gpt-4o",
                "stream": stream,
                "messages": [{"role": "user", "content": messages[i % len(messages)]}],
                "metadata": {"session_id": "bench", "scope": "domain:code"},
            }

        for i in range(args.warmup):
            client.post(f"{base}/v1/chat/completions", json=body(i, False), headers=headers).raise_for_status()
            client.post(f"{upstream}/chat/completions", json=body(i, False), headers=direct_h).raise_for_status()
        direct, proxied = [], []
        for i in range(args.n):  # interleaved so drift in the machine affects both alike
            t = time.perf_counter()
            client.post(f"{upstream}/chat/completions", json=body(i, False), headers=direct_h).raise_for_status()
            direct.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = client.post(f"{base}/v1/chat/completions", json=body(i, False), headers=headers)
            proxied.append(time.perf_counter() - t)
            r.raise_for_status()
            assert BEGIN not in r.text
        ttft_direct, ttft_proxy = [], []
        for i in range(args.n // 2):
            ttft_direct.append(first_token_s(client, f"{upstream}/chat/completions", body(i, True), direct_h))
            ttft_proxy.append(first_token_s(client, f"{base}/v1/chat/completions", body(i, True), headers))
    ms = 1000.0
    for name, d, p in (("non_streaming", direct, proxied), ("streaming_ttft", ttft_direct, ttft_proxy)):
        out[name] = {
            "n": len(d),
            "direct_p50_ms": percentile(d, 50) * ms,
            "direct_p99_ms": percentile(d, 99) * ms,
            "proxy_p50_ms": percentile(p, 50) * ms,
            "proxy_p99_ms": percentile(p, 99) * ms,
            "added_p50_ms": (percentile(p, 50) - percentile(d, 50)) * ms,
            "added_p99_ms": (percentile(p, 99) - percentile(d, 99)) * ms,
            "added_mean_ms": (statistics.mean(p) - statistics.mean(d)) * ms,
        }
    return out


def chat_messages() -> list[str]:
    """The paper's user messages and static queries: what the chats send, in turn."""
    cases = paper_case_set()
    return [t.user_message for s in cases.sessions for t in s.turns] + [c.query for c in cases.static if c.query]


def concurrent(args: argparse.Namespace, base: str, key: str, app_pid: int) -> dict[str, Any]:
    """``--in-flight`` chats at once, each worker sending ``--per-worker`` in turn over its own
    keep-alive connection (after one untimed round that opens them): the app's CPU per chat and
    the time each took beyond the upstream's ``--delay-ms``."""
    messages = chat_messages()
    headers = {"Authorization": f"Bearer {key}"}
    timings: list[float] = []
    errors: list[int] = []

    async def worker(http: httpx.AsyncClient, worker_id: int, count: int, timed: bool) -> None:
        for i in range(count):
            body = {
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": messages[(worker_id * count + i) % len(messages)]}],
                "metadata": {"session_id": f"bench-{worker_id}", "scope": "domain:code"},
            }
            started = time.perf_counter()
            response = await http.post(f"{base}/v1/chat/completions", json=body, headers=headers)
            if response.status_code != 200:
                errors.append(response.status_code)
            elif timed:
                timings.append(time.perf_counter() - started)

    async def run() -> tuple[float, float]:
        async with make_client(120.0, args.in_flight) as http:
            await asyncio.gather(*(worker(http, w, 1, False) for w in range(args.in_flight)))
            cpu0, wall0 = process_cpu_s(app_pid), time.monotonic()
            await asyncio.gather(*(worker(http, w, args.per_worker, True) for w in range(args.in_flight)))
            return process_cpu_s(app_pid) - cpu0, time.monotonic() - wall0

    cpu_s, wall_s = asyncio.run(run())
    chats = args.in_flight * args.per_worker
    delay_s = args.delay_ms / 1000
    return {
        "in_flight": args.in_flight,
        "delay_ms": args.delay_ms,
        "chats": chats,
        "errors": len(errors),
        "error_statuses": {str(status): errors.count(status) for status in sorted(set(errors))},
        "chats_per_s": round(chats / wall_s, 1),
        "added_p50_ms": round((percentile(timings, 50) - delay_s) * 1000, 2) if timings else None,
        "added_p99_ms": round((percentile(timings, 99) - delay_s) * 1000, 2) if timings else None,
        "app_cpu_ms_per_chat": round(cpu_s * 1000 / chats, 2),
    }


def throughput(args: argparse.Namespace, settings: Settings, tenant: str) -> dict[str, Any]:
    client = build_client(settings)
    turns = TurnStore(client, settings.opensearch_namespace)
    ids = [f"bench-{uuid.uuid4().hex[:12]}" for _ in range(args.turns)]
    for i, turn_id in enumerate(ids):
        raw = sidecar(i)[len(BEGIN) : -len(END)]
        turns.create(
            TurnRecord(
                tenant_id=tenant,
                turn_id=turn_id,
                owner_id="test-user",
                session_id="bench",
                scope=["domain:code"],
                model="gpt-4o",
                sidecar_raw=raw,
                parse_status="parsed",
            )
        )
    env = {
        "TENURE_OPENSEARCH_URL": settings.opensearch_url,
        "TENURE_OPENSEARCH_NAMESPACE": settings.opensearch_namespace,
        "TENURE_REDIS_URL": settings.redis_url,
        "TENURE_CELERY_QUEUE_PREFIX": settings.celery.queue_prefix,
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
    }
    queue = TaskQueue(settings)
    for turn_id in ids:  # queued before the worker starts: it drains a full queue
        queue.extract(tenant, turn_id)
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", *celery_worker_args(settings.celery.queue_prefix, name="bench", loglevel="WARNING")],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        first_done = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if first_done is None and turns.load(tenant, ids[0])[0].extraction_status == "done":
                first_done = time.perf_counter()
            if turns.load(tenant, ids[-1])[0].extraction_status == "done":
                break
            time.sleep(0.01)
        finished = time.perf_counter()
        statuses = [turns.load(tenant, t)[0].extraction_status for t in ids]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        queue.close()
        client.close()
    assert first_done is not None and statuses.count("done") == len(ids), statuses
    elapsed = finished - first_done
    return {
        "turns": len(ids),
        "ops_per_sidecar": 3,
        "seconds": elapsed,
        "sidecars_per_s": (len(ids) - 1) / elapsed if elapsed > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opensearch-url")
    parser.add_argument("--redis-url")
    parser.add_argument("--heap", default="1g")
    parser.add_argument("-n", type=int, default=300, help="requests per latency series")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--turns", type=int, default=300, help="turns for the throughput run")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--app-env",
        action="append",
        default=[],
        metavar="VAR=value",
        help="a setting for the app process (repeatable), e.g. TENURE_RECALL_TIER_CACHE_ENTRIES=0",
    )
    parser.add_argument("--in-flight", type=int, default=0, help="run the concurrent phase only, with N chats at once")
    parser.add_argument("--per-worker", type=int, default=20, help="chats per in-flight worker (--in-flight)")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="the upstream's time per answer (--in-flight)")
    parser.add_argument("--app-source", type=Path, default=REPO, help="the checkout the app runs from")
    args = parser.parse_args(argv)
    app_env = dict(item.split("=", 1) for item in args.app_env)
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    upstream_port, app_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    with stack(args) as (os_url, redis_url), tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            opensearch_url=os_url,
            redis_url=redis_url,
            opensearch_namespace=ns,
            auth=AuthSettings(api_key_pepper=SecretStr("bench-pepper")),
            loop=MemoryLoopSettings(upstream_base_url=upstream, upstream_api_key=SecretStr("sk-upstream")),
            celery=CelerySettings(queue_prefix=ns),
        )
        client = build_client(settings)
        rds: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
        try:
            delay_ms = args.delay_ms if args.in_flight else 0.0
            source = args.app_source.resolve()
            with processes(
                settings, upstream_port, app_port, Path(tmp), app_env, source=source, delay_ms=delay_ms
            ) as app:
                services = Services.build(settings, client, rds)
                operator = services.provisioning.bootstrap().plaintext
                base = f"http://127.0.0.1:{app_port}"
                tenant = f"t-{uuid.uuid4().hex[:8]}"
                with Tenure(base, operator, max_retries=0) as op:
                    op.admin.create_tenant(tenant, tenant)
                    op.admin.create_user(tenant, "test-user")
                    key = op.admin.issue_key(tenant, "test-user", name="b").key
                load_corpus(services.store, tenant, paper_case_set())
                figures: dict[str, Any] = {"app_env": app_env, "app_source": str(source)}
                if args.in_flight:
                    figures["concurrent"] = concurrent(args, base, key, app.pid)
                else:
                    figures["latency"] = latency(args, upstream, base, key)
            if not args.in_flight:
                # the app (another checkout's, with --app-source) set the indices up with its own
                # templates; the extraction below runs this tree's code, whose records may carry
                # fields added since (put on the existing indices, as at any start-up)
                apply_templates(client, ns, FAMILIES)
                figures["extraction"] = throughput(args, settings, tenant)
        finally:
            drop_namespace(client, ns, FAMILIES)
            client.close()
            rds.delete(f"{ns}.heavy", f"{ns}.cheap")
            rds.close()
    if args.in_flight:
        print(json.dumps(figures["concurrent"]))
        if args.out:
            args.out.write_text(json.dumps(figures, indent=2))
        return 0
    for name, row in figures["latency"].items():
        print(
            f"{name:15s} n={row['n']:4d}  direct p50 {row['direct_p50_ms']:6.2f} ms "
            f"p99 {row['direct_p99_ms']:6.2f} ms | "
            f"proxy p50 {row['proxy_p50_ms']:6.2f} ms p99 {row['proxy_p99_ms']:6.2f} ms | "
            f"added p50 {row['added_p50_ms']:6.2f} ms p99 {row['added_p99_ms']:6.2f} ms"
        )
    ex = figures["extraction"]
    print(
        f"extraction      {ex['turns']} sidecars ({ex['ops_per_sidecar']} ops each) in {ex['seconds']:.2f} s "
        f"by one worker: {ex['sidecars_per_s']:.1f} sidecars/s"
    )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
