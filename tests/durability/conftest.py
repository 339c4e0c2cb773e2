"""Crash-test fixtures: every server and process a test kills is its own.

The shared dev servers and the session fixtures of the rest of the suite are never used here.
Each test starts its own redis-server (AOF, as deployed) and its own worker/beat/uvicorn
processes, each in its own process group so ``kill -9`` takes the whole process (a prefork worker
with its pool children, like an OOM kill or a lost container). The tests that do not crash
OpenSearch share one node that this module starts and never kills (a node costs ~20-40 s to
start on the dev box); the OpenSearch crash test starts, kills and restarts a node of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from pydantic import SecretStr

from deploy.devstack import Service, start_opensearch
from deploy.localstack import celery_beat_args, celery_worker_args, wait_until
from service.api.state import Services
from service.config import ApiSettings, AuthSettings, CelerySettings, MemoryLoopSettings, Settings
from service.storage.client import build_client
from service.storage.templates import FAMILIES, apply_templates
from service.storage.turns import TurnRecord, TurnStore
from tests.api.conftest import Team, auth, make_team

REPO = Path(__file__).resolve().parents[2]
PEPPER = "durability-pepper"
HEAP = "512m"  # two nodes may run at once during the OpenSearch crash test


def kill9(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the whole process group (no shutdown hooks, no flush, no ack) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def module_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """An OpenSearch node private to this module, for tests that crash something else."""
    svc = start_opensearch(tmp_path_factory.mktemp("os-module") / "home", heap=HEAP)
    try:
        yield svc
    finally:
        svc.stop()


def make_settings(opensearch_url: str, redis_url: str) -> Settings:
    ns = f"crash-{uuid.uuid4().hex[:8]}"
    return Settings(
        opensearch_url=opensearch_url,
        redis_url=redis_url,
        opensearch_namespace=ns,
        auth=AuthSettings(api_key_pepper=SecretStr(PEPPER)),
        api=ApiSettings(
            rate_limit_per_s=100_000,
            rate_limit_burst=1_000_000,
            tenant_rate_limit_per_s=1_000_000,
            tenant_rate_limit_burst=10_000_000,
        ),
        loop=MemoryLoopSettings(),
        celery=CelerySettings(queue_prefix=ns),
    )


def process_env(settings: Settings, **overrides: str) -> dict[str, str]:
    """The environment of a worker, beat or API process: the same settings as the test's app."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(
        TENURE_OPENSEARCH_URL=settings.opensearch_url,
        TENURE_OPENSEARCH_NAMESPACE=settings.opensearch_namespace,
        TENURE_REDIS_URL=settings.redis_url,
        TENURE_CELERY_QUEUE_PREFIX=settings.celery.queue_prefix,
        TENURE_AUTH_API_KEY_PEPPER=PEPPER,
        TENURE_API_RATE_LIMIT_PER_S="100000",
        TENURE_API_RATE_LIMIT_BURST="1000000",
        TENURE_API_TENANT_RATE_LIMIT_PER_S="1000000",
        TENURE_API_TENANT_RATE_LIMIT_BURST="10000000",
        # the sweep at test speed: a turn untouched for 2 s counts as lost, checked every second
        TENURE_LOOP_SWEEP_STALE_AFTER_S="2",
        TENURE_LOOP_SWEEP_INTERVAL_S="1",
        # a running turn is only swept once the heavy hard time limit has passed (a live task may
        # hold it until then): a short limit, so a turn left running by a killed worker comes back soon
        TENURE_CELERY_HEAVY_SOFT_TIME_LIMIT_S="8",
        TENURE_CELERY_HEAVY_TIME_LIMIT_S="10",
        TENURE_CELERY_CHANGE_LOG_SWEEP_BUDGET_S="6",
        PYTHONPATH=str(REPO),
    )
    env.update(overrides)
    return env


class Proc:
    """A real subprocess in its own process group, logging to a file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 60.0) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log_path.name} exited: {self.log()[-3000:]}")
            return text in self.log()

        wait_until(seen, timeout, f"{text!r} in {self.log_path.name}")

    def kill9(self) -> None:
        kill9(self.proc)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._log.close()


def start_worker(settings: Settings, log_path: Path, **env: str) -> Proc:
    proc = Proc(celery_worker_args(settings.celery.queue_prefix, name="crash"), process_env(settings, **env), log_path)
    proc.wait_log("ready.")
    return proc


def start_beat(settings: Settings, home: Path) -> Proc:
    return Proc(
        celery_beat_args(home / "beat-schedule"),
        process_env(settings),
        home / "beat.log",
    )


@dataclass
class Stack:
    """The test's own API (in-process, real app), a team with keys, and direct store access."""

    settings: Settings
    api: TestClient
    services: Services
    team: Team
    operator: dict[str, str]

    @property
    def client(self) -> OpenSearch:
        return self.services.opensearch

    def turn(self, turn_id: str) -> TurnRecord:
        """The turn as stored (real-time get by key, straight from OpenSearch)."""
        turn, _, _ = TurnStore(self.client, self.settings.opensearch_namespace).load(self.team.tenant, turn_id)
        return turn

    def queued(self) -> int:
        """Messages waiting in the heavy queue (the Celery Redis transport keeps a list)."""
        rds: redis.Redis[bytes] = redis.Redis.from_url(self.settings.redis_url)
        try:
            return int(rds.llen(f"{self.settings.celery.queue_prefix}.heavy"))
        finally:
            rds.close()


@contextlib.contextmanager
def stack(settings: Settings) -> Iterator[Stack]:
    client = build_client(settings)
    apply_templates(client, settings.opensearch_namespace, FAMILIES)
    client.close()
    from service.app import create_app

    app = create_app(settings)
    with TestClient(app) as api:
        services: Services = app.state.services
        operator = auth(services.provisioning.bootstrap().plaintext)
        yield Stack(settings, api, services, make_team(api, operator), operator)


@contextlib.contextmanager
def stack_and_procs(settings: Settings) -> Iterator[tuple[Stack, list[Proc]]]:
    """:func:`stack`, plus a list the test adds its worker/beat processes to: all stopped at the end."""
    procs: list[Proc] = []
    try:
        with stack(settings) as st:
            yield st, procs
    finally:
        for p in procs:
            p.stop()
