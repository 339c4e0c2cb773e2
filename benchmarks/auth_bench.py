"""Authentication cost per request: OpenSearch gets, Redis commands and API CPU of warm API keys.

Provisions ``--tenants`` x ``--users`` keys on a throw-away node and Redis, then sends
``GET /v1/whoami`` (authentication, rate limit and a trivial answer) with every key, in a random
order, for ``--rounds`` rounds, through the real app in process (``create_app`` under Starlette's
TestClient, called through the SDK; no network hop). Between rounds it waits ``--gap-s`` (default: just over
``api_key_cache_s``), so every key comes back after the old in-process cache bound had expired, as
in the 1,000 tenants x 5 users recall benchmark where a user's next recall comes ~17 s later.

Per measured request it reports the accounts index's real-time gets (the credential loads: an API
key's GET and its owner ``mget``), the Redis commands by name (``INFO commandstats``; the
receipt drainer's and other background loops' commands included, so compare the rows, not the
total), the API process's CPU time and the request's p50/p99 wall time.

    .venv/bin/python -m benchmarks.auth_bench --start-node                 # own node and redis
    .venv/bin/python -m benchmarks.auth_bench --start-node --tenants 20 --users 5 --rounds 3

A benchmark, not a test: it prints figures and writes a JSON (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import redis
from fastapi.testclient import TestClient
from tenure_client import Tenure

from benchmarks.recall_bench import add_server_arguments, report_head, result_path, start_servers, wind_down
from service.api.state import Services
from service.app import create_app
from service.auth.actor import Actor
from service.config import ApiSettings, Settings
from service.domain.accounts import Grants
from service.storage.templates import ACCOUNTS

# Commands an authenticated request can send (the rate limit's script and version reads, the
# last-used gate, a JWT revocation check).
REDIS_COMMANDS = ("evalsha", "get", "set", "incr", "exists")


def _accounts_gets(services: Services) -> int:
    alias = ACCOUNTS.alias(services.settings.opensearch_namespace)
    stats = services.opensearch.indices.stats(index=alias, metric="get")
    return int(stats["_all"]["primaries"]["get"]["total"])


def _redis_calls(client: redis.Redis[bytes]) -> dict[str, int]:
    stats = client.info("commandstats")
    return {c: int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in REDIS_COMMANDS}


def _provision(services: Services, tenants: int, users: int) -> list[str]:
    """One key per user, written through the provisioning service (as an operator would)."""
    operator = services.provisioning.bootstrap()
    actor = Actor(principal=services.authenticator.authenticate(operator.plaintext).principal)
    keys = []
    for t in range(tenants):
        tenant = f"t{t:04d}-{uuid.uuid4().hex[:6]}"
        services.provisioning.create_tenant(actor, tenant, tenant)
        for u in range(users):
            services.provisioning.create_user(actor, tenant, f"u{u}", Grants(projects=["pay"]))
            keys.append(services.provisioning.issue_key(actor, tenant, f"u{u}").plaintext)
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds over every key (after one warm-up)")
    parser.add_argument("--gap-s", type=float, default=None, help="pause between rounds (api_key_cache_s + 0.5)")
    add_server_arguments(parser, heap="1g", redis_url=True)
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    report = report_head("auth_bench", "authentication cost per request, warm API keys", argv, started)
    servers = start_servers("tenure-auth-bench-", args)
    try:
        settings = Settings(
            opensearch_url=servers.opensearch_url,
            redis_url=servers.redis_url,
            opensearch_namespace=f"authbench{uuid.uuid4().hex[:6]}",
            api=ApiSettings(rate_limit_per_s=100_000, rate_limit_burst=1_000_000, tenant_rate_limit_per_s=0),
        )
        gap_s = args.gap_s if args.gap_s is not None else settings.auth.api_key_cache_s + 0.5
        rds: redis.Redis[bytes] = redis.Redis.from_url(servers.redis_url)
        with TestClient(create_app(settings)) as client:
            services: Services = client.app.state.services  # type: ignore[attr-defined]
            users = [
                Tenure(api_key=key, http_client=client, max_retries=0)
                for key in _provision(services, args.tenants, args.users)
            ]
            rng = random.Random(7)
            for user in users:  # warm-up: first use, last_used_at written
                user.whoami()
            latencies: list[float] = []
            gets = redis_calls = None
            cpu = 0.0
            for _ in range(args.rounds):
                time.sleep(gap_s)
                if gets is None:
                    gets, redis_calls, cpu = _accounts_gets(services), _redis_calls(rds), time.process_time()
                rng.shuffle(users)
                for user in users:
                    t0 = time.perf_counter()
                    user.whoami()
                    latencies.append((time.perf_counter() - t0) * 1000)
            cpu = time.process_time() - cpu
            n = len(latencies)
            gets = _accounts_gets(services) - (gets or 0)
            after = _redis_calls(rds)
            calls = {c: after[c] - (redis_calls or {}).get(c, 0) for c in REDIS_COMMANDS}
            rds.close()
        latencies.sort()
        result: dict[str, Any] = {
            "keys": len(users),
            "requests": n,
            "gap_s": gap_s,
            "accounts_gets_per_request": round(gets / n, 3),
            "redis_calls_per_request": {c: round(v / n, 3) for c, v in calls.items()},
            "api_cpu_ms_per_request": round(cpu * 1000 / n, 3),
            "p50_ms": round(statistics.median(latencies), 2),
            "p99_ms": round(latencies[int(0.99 * (n - 1))], 2),
        }
        report["result"] = result
        print(result)
    finally:
        wind_down(report, result_path(args.out, "auth", started), servers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
