"""What the Redis the service runs against should be configured with, checked at start-up.

Redis holds work the service has acknowledged: queued Celery tasks, the injection-receipt outbox,
proxy turns parked while OpenSearch was down (``service/outbox.py``). The compose file and the dev
stack start Redis configured for that; a Redis an operator runs elsewhere (the Helm chart's) may
not be. Each API process reads the settings once at start-up (``CONFIG GET``) and logs a warning
for each one that loses acknowledged work or costs recall latency; nothing is refused. A Redis that
does not allow ``CONFIG`` (managed services rename it) is not checked.

- ``appendonly no``: a restarted redis-server loses every queued task and pending receipt.
- ``maxmemory-policy`` other than ``noeviction``: at ``maxmemory`` Redis drops keys, queued work
  and pending receipts among them, where ``noeviction`` refuses the write (the API answers 503).
- ``rdbcompression yes`` with the append-only file on: each rewrite of the file (Redis starts one
  every time the file has doubled, every minute or two at a few hundred recalls a second) writes
  the whole dataset, which is mostly the tenants' shared recall vocabularies, zlib-compressed
  already. LZF then tries each of them in vain: on the development machine a rewrite's child took
  280-297 ms of CPU with it and 59-66 ms without, for a file of the same size, and that burst shows
  as a stall of the recalls in flight on a busy machine (docs/operations.md, "Redis: the
  append-only file").
"""

from __future__ import annotations

import logging

import redis

log = logging.getLogger(__name__)

_CHECKED = ("appendonly", "maxmemory-policy", "rdbcompression")


def advice(config: dict[str, str]) -> list[str]:
    """One sentence per setting of ``config`` (``CONFIG GET``'s answer) the service should not
    run with; a setting missing from ``config`` is not judged."""
    found: list[str] = []
    aof = config.get("appendonly")
    if aof == "no":
        found.append(
            "appendonly is no: a restart of redis-server loses every queued task and pending "
            "injection receipt; run Redis with --appendonly yes --appendfsync everysec"
        )
    policy = config.get("maxmemory-policy")
    if policy is not None and policy != "noeviction":
        found.append(
            f"maxmemory-policy is {policy}: at maxmemory Redis evicts keys, queued tasks and pending "
            "receipts among them; run Redis with --maxmemory-policy noeviction"
        )
    if aof == "yes" and config.get("rdbcompression") == "yes":
        found.append(
            "rdbcompression is yes: every rewrite of the append-only file tries to compress the "
            "shared recall vocabularies, which are compressed already (about 4x the rewrite's CPU, "
            "a stall of the recalls in flight on a busy machine); run Redis with --rdbcompression no"
        )
    return found


def read_config(client: redis.Redis[bytes]) -> dict[str, str] | None:
    """The checked settings as Redis reports them; None when it does not answer ``CONFIG GET``."""
    try:
        reply = client.config_get(*_CHECKED)  # one round trip (Redis 7 takes several names)
    except redis.RedisError as exc:  # CONFIG renamed or refused (managed Redis), or Redis down
        log.debug("Redis settings not checked: %s", exc)
        return None
    return {_text(key): _text(value) for key, value in reply.items() if key is not None and value is not None}


def warn_about(client: redis.Redis[bytes]) -> list[str]:
    """Log (and return) :func:`advice` for the Redis behind ``client``."""
    config = read_config(client)
    found = advice(config) if config is not None else []
    for sentence in found:
        log.warning("Redis: %s (docs/operations.md, Redis)", sentence)
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
