"""A recall's two Redis round trips through each event-loop client: redis-py's asyncio client
against ``service/lean_redis.py``.

Every recall charges the rate limit (``RateLimiter.acharge``: the bucket script's ``EVALSHA`` and
the tenant's two versions in one pipeline) and records its receipt (``RedisOutbox.aput``: the
outbox script's ``EVALSHA`` with the receipt's JSON). This runs the service's own code for both,
once per client, in ``--rounds`` rounds of ``--calls`` pairs alternating in order, on uvloop (the
API's loop): this process's CPU per pair and per call, the median over rounds, and how many rounds
the lean client was cheaper in. The answers are compared first (the same verdict and versions; one
receipt appended per call).

    .venv/bin/python -m benchmarks.redis_client_ab [--redis-url $REDIS]   # default: its own redis-server

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aredis

from benchmarks.redis_parser_ab import redis_ab_parser, run_on_redis
from service.auth.authenticator import Identity
from service.auth.ratelimit import RateLimiter
from service.domain.principal import Principal
from service.lean_redis import EventLoopRedis, LeanRedis
from service.loops import LoopBound
from service.outbox import RedisOutbox
from service.storage.audit import AuditEvent

CLIENTS = ("redis-py", "lean")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = redis_ab_parser(__doc__, rounds=8, calls_help="recalls' round-trip pairs per round and client")
    return parser.parse_args(argv)


def _client(name: str, url: str) -> EventLoopRedis:
    if name == "lean":
        lean = LeanRedis.from_url(url, socket_timeout=5, connect_timeout=2)
        if lean is None:
            raise SystemExit(f"the lean client does not serve {url}")
        return lean
    return aredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)


def _receipt(i: int) -> AuditEvent:
    """A recall receipt of a typical size (~15 belief ids)."""
    return AuditEvent(
        tenant_id="t-bench",
        action="recall",
        actor_id=f"user-{i % 5}",
        actor_kind="api_key",
        credential_id=f"k-{i % 5}",
        session_id=f"s-{i % 40}",
        request_id=f"req-{uuid.UUID(int=i).hex}",
        scopes=["domain:code", "project:payments"],
        query="how do we name the kafka topics of the payments service, and which retention do they get?",
        belief_ids=[f"b-{uuid.UUID(int=i * 31 + k).hex}" for k in range(15)],
    )


def _pair(
    sync: redis.Redis[bytes], client: EventLoopRedis, namespace: str, loop: Any
) -> Callable[[int], Awaitable[tuple[Any, bool]]]:
    bound = LoopBound(client, loop)
    limiter = RateLimiter(sync, namespace, per_s=1e6, burst=10**7, async_redis=bound)
    outbox = RedisOutbox(sync, f"{namespace}:outbox", AuditEvent, max_pending=10**7, async_redis=bound)
    identities = [
        Identity(Principal(tenant_id=f"t-{n % 10}", user_id=f"u-{n}"), "api_key", f"k-{n}") for n in range(50)
    ]

    async def pair(i: int) -> tuple[Any, bool]:
        versions = await limiter.acharge(identities[i % 50], read_only=True)
        return versions, await outbox.aput(_receipt(i))

    return pair


async def measure(url: str, rounds: int, calls: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    sync: redis.Redis[bytes] = redis.Redis.from_url(url)
    namespace = f"client-ab-{uuid.uuid4().hex[:6]}"
    clients = {name: _client(name, url) for name in CLIENTS}
    try:
        pairs = {name: _pair(sync, client, namespace, loop) for name, client in clients.items()}
        answers = [await pairs[name](0) for name in CLIENTS]
        if answers[0] != answers[1]:
            raise RuntimeError(f"the clients answered differently: {answers}")
        for pair in pairs.values():  # warm-up
            for i in range(calls // 2):
                await pair(i)
        spent: dict[str, list[float]] = {name: [] for name in CLIENTS}
        for r in range(rounds):
            for name in list(CLIENTS)[:: 1 if r % 2 == 0 else -1]:
                started = time.process_time()
                for i in range(calls):
                    await pairs[name](i)
                spent[name].append((time.process_time() - started) * 1e6 / calls)
            sync.delete(f"{namespace}:outbox")
    finally:
        for client in clients.values():
            await client.aclose()  # type: ignore[union-attr]  # redis>=5 (the stubs are 4.x)
        for key in sync.scan_iter(f"{namespace}*"):
            sync.delete(key)
        sync.close()
    medians = {name: round(statistics.median(v), 1) for name, v in spent.items()}
    return {
        "cpu_us_per_recall_pair": medians,
        "saved_us_per_recall": round(medians["redis-py"] - medians["lean"], 1),
        "by_round": {name: [round(x, 1) for x in v] for name, v in spent.items()},
        "lean_cheaper_rounds": sum(a < b for a, b in zip(spent["lean"], spent["redis-py"], strict=True)),
        "rounds": rounds,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    return run_on_redis(measure, parse_args(argv), "client-ab-")


if __name__ == "__main__":
    raise SystemExit(main())
