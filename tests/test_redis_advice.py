"""The Redis settings checked at API start-up (service/redis_advice.py), on real redis-servers."""

from __future__ import annotations

import logging

import pytest
import redis

from deploy.devstack import Service, free_port
from service import redis_advice
from tests.test_compose import load_raw

GOOD = {"appendonly": "yes", "maxmemory-policy": "noeviction", "rdbcompression": "no"}


def compose_redis_settings() -> dict[str, str]:
    """What the compose file gives redis-server (``--name value`` pairs), by setting name."""
    command = load_raw()["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    return {name.removeprefix("--"): str(value) for name, value in zip(command[1::2], command[2::2], strict=True)}


def test_advice_names_each_setting_that_loses_work_or_costs_latency() -> None:
    assert redis_advice.advice(GOOD) == []
    assert redis_advice.advice({}) == []  # nothing reported, nothing judged
    no_aof = redis_advice.advice({**GOOD, "appendonly": "no", "rdbcompression": "yes"})
    assert len(no_aof) == 1 and "appendonly is no" in no_aof[0]  # no rewrite without an AOF
    evicting = redis_advice.advice({**GOOD, "maxmemory-policy": "allkeys-lru"})
    assert len(evicting) == 1 and "allkeys-lru" in evicting[0] and "noeviction" in evicting[0]
    compressing = redis_advice.advice({**GOOD, "rdbcompression": "yes"})
    assert len(compressing) == 1 and "--rdbcompression no" in compressing[0]


def test_the_dev_stacks_redis_needs_no_advice(own_redis: Service) -> None:
    client = redis.Redis.from_url(own_redis.url)
    try:
        config = redis_advice.read_config(client)
        assert config is not None and {k: config[k] for k in GOOD} == GOOD
        assert redis_advice.warn_about(client) == []
    finally:
        client.close()


def test_a_redis_that_compresses_and_evicts_is_named_at_start_up(
    own_redis: Service, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    try:
        client.config_set("rdbcompression", "yes")
        client.config_set("maxmemory-policy", "volatile-lru")
        with caplog.at_level(logging.WARNING, logger="service.redis_advice"):
            found = redis_advice.warn_about(client)
    finally:
        client.close()
    assert len(found) == 2
    logged = [r.getMessage() for r in caplog.records if r.name == "service.redis_advice"]
    assert any("volatile-lru" in m for m in logged) and any("rdbcompression is yes" in m for m in logged)


def test_a_redis_that_does_not_answer_config_is_not_checked() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1)  # nothing listens there
    try:
        assert redis_advice.read_config(client) is None
        assert redis_advice.warn_about(client) == []
    finally:
        client.close()


def test_the_compose_files_redis_needs_no_advice() -> None:
    config = compose_redis_settings()
    assert redis_advice.advice(config) == []
    assert config["rdbcompression"] == "no" and config["appendonly"] == "yes"


def test_the_dev_stacks_redis_runs_with_the_compose_files_persistence_settings(own_redis: Service) -> None:
    """Tests and benchmarks run against the Redis a deployment runs: every setting the compose
    file gives redis-server (but the memory cap, an environment knob) is the dev stack's too."""
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    try:
        for name, value in compose_redis_settings().items():
            if name == "maxmemory":
                continue
            assert client.config_get(name)[name] == value, name
    finally:
        client.close()
