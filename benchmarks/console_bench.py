"""Console page render time: p50/p95 of the admin console's pages at 100k beliefs and 1M audit events.

One tenant holds every belief and every audit event (the worst case for a tenant admin's pages:
the tenant filter narrows nothing). The corpus is bulk-loaded into a fresh namespace of a real
OpenSearch node through the storage layer's own document shapes; then an admin signs in to the
real app (``create_app``, in process through Starlette's TestClient: template rendering, session
check, credential re-validation and every OpenSearch query included; no network hop) and each
page is requested ``--samples`` times after a warm-up.

    .venv/bin/python -m benchmarks.console_bench --start-node --heap 2g        # own node + redis
    .venv/bin/python -m benchmarks.console_bench --start-node --beliefs 5000 --audit-events 50000

See benchmarks/README.md. A benchmark, not a test: it prints figures and writes a JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from opensearchpy import OpenSearch, helpers
from tenure_client import Tenure

from deploy.devstack import Service, start_opensearch, start_redis
from service.app import create_app
from service.config import ApiSettings, Settings
from service.domain.belief import Belief, BeliefType, EpistemicStatus
from service.storage.beliefs import doc_id
from service.storage.client import build_client
from service.storage.templates import AUDIT, BELIEFS, FAMILIES, drop_namespace

TENANT = "acme"
USERS = [f"u{i:03d}" for i in range(50)]
PROJECTS = [f"p{i}" for i in range(10)]
WORDS = [
    "redis",
    "postgres",
    "mongodb",
    "kafka",
    "celery",
    "kubernetes",
    "docker",
    "terraform",
    "react",
    "vue",
    "svelte",
    "typescript",
    "python",
    "golang",
    "rust",
    "java",
    "stripe",
    "adyen",
    "paypal",
    "auth",
    "oauth",
    "jwt",
    "cache",
    "queue",
    "worker",
    "billing",
    "invoice",
    "search",
    "logging",
    "metrics",
    "tracing",
    "alerting",
    "deploy",
    "release",
    "staging",
    "payments",
    "checkout",
    "cart",
    "pricing",
]
QUALIFIERS = [
    "cache",
    "driver",
    "client",
    "provider",
    "policy",
    "strategy",
    "format",
    "version",
    "limit",
    "pool",
    "schema",
]
CSRF_RE = re.compile(r'name="(?:csrf_token|login_csrf)" value="([^"]+)"')


def belief_at(i: int, now: datetime) -> Belief:
    """Belief number ``i``, a pure function of ``i``."""
    rnd = random.Random(i)
    name = f"{rnd.choice(WORDS)}_{rnd.choice(QUALIFIERS)}_{i}"
    scope = rnd.choice(
        [f"project:{rnd.choice(PROJECTS)}"] * 5 + ["domain:code", "domain:code/python", "team:core", "user:universal"]
    )
    superseded = i % 25 == 1  # belief i supersedes i-1 for every 25th pair: chains to render
    created = now - timedelta(seconds=(100_000_000 - i) % (90 * 86_400))
    return Belief.model_validate(
        {
            "id": f"b-{i:07d}",
            "tenant_id": TENANT,
            "owner_id": USERS[i % len(USERS)],
            "type": rnd.choice([BeliefType.PREFERENCE] * 4 + [BeliefType.ENTITY] * 3 + [BeliefType.DECISION] * 2),
            "canonical_name": name,
            "aliases": [name.replace("_", " ").rsplit(" ", 1)[0]],
            "content": f"Belief {i}: the team settled on {name.replace('_', ' ')}.",
            "why_it_matters": "Shapes every answer about it.",
            "scope": [scope],
            "pinned": i % 50 == 0,
            "confidence": 0.8,
            "epistemic_status": EpistemicStatus.SUPERSEDED if i % 25 == 0 else EpistemicStatus.ACTIVE,
            "superseded_by": f"b-{i + 1:07d}" if i % 25 == 0 else None,
            "supersedes": f"b-{i - 1:07d}" if superseded else None,
            "created_at": created,
            "updated_at": created,
        }
    )


def _belief_actions(alias: str, count: int, now: datetime) -> Iterator[dict[str, Any]]:
    for i in range(count):
        belief = belief_at(i, now)
        yield {
            "_index": alias,
            "_id": doc_id(TENANT, belief.id),
            "_routing": TENANT,
            "_source": belief.to_document(),
        }


def audit_at(i: int, now: datetime, beliefs: int) -> dict[str, Any]:
    """Audit event number ``i``: 80% injection receipts, 20% writes, spread over 30 days."""
    rnd = random.Random(1_000_000_000 + i)
    at = now - timedelta(seconds=rnd.randrange(30 * 86_400))
    actor = rnd.choice(USERS)
    ids = [f"b-{rnd.randrange(beliefs):07d}" for _ in range(rnd.randint(1, 4))]
    event: dict[str, Any] = {
        "event_id": f"ev-bench-{i:08d}",
        "tenant_id": TENANT,
        "at": at.isoformat(),
        "actor_id": actor,
        "actor_kind": "api_key",
        "credential_id": f"{i % 977:016x}",
        "belief_ids": ids,
        "session_id": f"s-{actor}-{at:%Y%m%d}",
        "request_id": f"req-{i:08d}",
        "scopes": [f"project:{rnd.choice(PROJECTS)}"],
    }
    if rnd.random() < 0.8:
        event["action"] = "recall"
        event["query"] = f"how do we handle {rnd.choice(WORDS)} {rnd.choice(QUALIFIERS)} here?"
        event["injected"] = [{"id": b, "tier": "relevant", "score": 14.0} for b in ids]
    else:
        event["action"] = rnd.choice(["belief.create", "belief.pin", "belief.supersede", "belief.add_aliases"])
        event["details"] = {"note": "bench"}
    return event


def _audit_actions(alias: str, count: int, now: datetime, beliefs: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        event = audit_at(i, now, beliefs)
        yield {"_index": alias, "_id": event["event_id"], "_routing": TENANT, "_op_type": "create", "_source": event}


def bulk_load(client: OpenSearch, alias: str, actions: Iterator[dict[str, Any]], what: str) -> float:
    t0 = time.perf_counter()
    client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "-1"}})
    failed = 0
    results = helpers.parallel_bulk(
        client, actions, thread_count=2, chunk_size=2000, queue_size=4, raise_on_error=False
    )
    for done, (ok, _) in enumerate(results, start=1):
        failed += not ok
        if done % 100_000 == 0:
            print(f"  {what}: {done:,} ({time.perf_counter() - t0:.0f} s)", flush=True)
    client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "1s"}})
    client.indices.refresh(index=alias)
    if failed:
        raise SystemExit(f"{failed} {what} failed to load")
    return time.perf_counter() - t0


def sign_in(web: TestClient, key: str) -> None:
    form = web.get("/console/login")
    token = CSRF_RE.search(form.text)
    assert token, form.text
    done = web.post("/console/login", data={"credential": key, "login_csrf": token.group(1)})
    assert done.status_code == 303, done.text


def measure(web: TestClient, path: str, samples: int, warmup: int) -> dict[str, Any]:
    for _ in range(warmup):
        response = web.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text[:500])
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        response = web.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    times.sort()
    return {
        "path": path,
        "samples": samples,
        "p50_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
        "max_ms": round(times[-1], 1),
        "bytes": len(response.content),
        "table_rows": response.text.count("<tr"),
    }


def pages(now: datetime, beliefs: int) -> list[tuple[str, str]]:
    day = (now - timedelta(days=3)).strftime("%Y-%m-%dT00:00")
    next_day = (now - timedelta(days=2)).strftime("%Y-%m-%dT00:00")
    chained = f"b-{min(beliefs - 1, 1001):07d}"  # supersedes b-...1000
    receipt = next(i for i in range(100) if audit_at(i, now, beliefs)["action"] == "recall")
    return [
        ("overview (facets over all beliefs, injections per day over all events)", "/console/"),
        ("beliefs, tenant-wide, first page", "/console/beliefs"),
        ("beliefs, name/alias search", "/console/beliefs?q=redis+cache"),
        ("beliefs, filters type+status+owner", "/console/beliefs?type=decision&status=live&owner=u007"),
        ("belief page with its chain", f"/console/beliefs/{chained}"),
        ("audit, first page", "/console/audit"),
        ("audit, actor + action", "/console/audit?actor_id=u007&action=recall"),
        ("audit, one day", f"/console/audit?since={day}&until={next_day}"),
        ("audit, by belief", "/console/audit?belief_id=b-0000042"),
        ("injection receipt page", f"/console/audit/ev-bench-{receipt:08d}"),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.disable(logging.INFO)  # per-request client logs would swamp the figures
    services: list[Service] = []
    home = Path(tempfile.mkdtemp(prefix="console-bench-"))
    os_url, redis_url = args.opensearch_url, args.redis_url
    if args.start_node:
        node = start_opensearch(home / "opensearch", heap=args.heap)
        services.append(node)
        os_url = node.url
        if not redis_url:
            rds = start_redis(home / "redis")
            services.append(rds)
            redis_url = rds.url
    namespace = f"bench-console-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        opensearch_url=os_url,
        redis_url=redis_url or "redis://127.0.0.1:6379/15",
        opensearch_namespace=namespace,
        api=ApiSettings(rate_limit_per_s=0),
        opensearch_timeout_s=300,  # bulk loads on a busy 2-core box
    )
    client = build_client(settings)
    now = datetime.now(UTC)
    try:
        with TestClient(create_app(settings), follow_redirects=False) as web:  # lifespan applies templates
            app_services = web.app.state.services  # type: ignore[attr-defined]
            operator = Tenure(api_key=app_services.provisioning.bootstrap().plaintext, http_client=web).admin
            operator.create_tenant(TENANT)
            operator.create_user(TENANT, "admin", roles=["admin"])
            for user in USERS:
                operator.create_user(TENANT, user, projects=PROJECTS[:5])
            admin_key = operator.issue_key(TENANT, "admin").key
            print(f"loading {args.beliefs:,} beliefs and {args.audit_events:,} audit events into {namespace}")
            beliefs_alias = BELIEFS.alias(namespace)
            load_beliefs_s = bulk_load(
                client, beliefs_alias, _belief_actions(beliefs_alias, args.beliefs, now), "beliefs"
            )
            audit_alias = AUDIT.alias(namespace)
            load_audit_s = bulk_load(
                client, audit_alias, _audit_actions(audit_alias, args.audit_events, now, args.beliefs), "audit events"
            )
            counts = {
                "beliefs": client.count(index=beliefs_alias)["count"],
                "audit_events": client.count(index=audit_alias)["count"],
            }
            print(f"loaded {counts} in {load_beliefs_s:.0f} s + {load_audit_s:.0f} s; measuring", flush=True)
            sign_in(web, admin_key)
            results = []
            for label, path in pages(now, args.beliefs):
                row = {"page": label, **measure(web, path, args.samples, args.warmup)}
                results.append(row)
                print(f"  {row['p50_ms']:8.1f} ms p50  {row['p95_ms']:8.1f} ms p95   {label}", flush=True)
    finally:
        drop_namespace(client, namespace, FAMILIES)
        client.close()
        for svc in services:
            svc.stop()
        shutil.rmtree(home, ignore_errors=True)
    return {
        "benchmark": "console_bench",
        "when": now.isoformat(),
        "command": " ".join(["python -m benchmarks.console_bench", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_end": os.getloadavg()},
        "corpus": counts,
        "load_s": {"beliefs": round(load_beliefs_s, 1), "audit_events": round(load_audit_s, 1)},
        "heap": args.heap if args.start_node else None,
        "pages": results,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start-node", action="store_true", help="start a throw-away OpenSearch node and Redis")
    parser.add_argument("--heap", default="2g")
    parser.add_argument("--opensearch-url", default="http://127.0.0.1:9200")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--beliefs", type=int, default=100_000)
    parser.add_argument("--audit-events", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/console.json")
    args = parser.parse_args(argv)
    report = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
