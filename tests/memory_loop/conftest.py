"""Memory-loop fixtures: the scripted LLM on loopback, the API app pointed at it, and a real
Celery worker (``celery -A workers.celery_app worker``, prefork) consuming the real Redis broker.

Each run uses its own index namespace and its own queue names, so runs sharing a Redis never
consume each other's tasks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from pydantic import SecretStr

from deploy.localstack import celery_worker_args
from loadtest.scripted_llm import ScriptedLLM
from service.api.state import Services
from service.config import ApiSettings, AuthSettings, CelerySettings, MemoryLoopSettings, Settings
from service.domain.belief import utcnow
from service.storage.reviews import REVIEWS
from service.storage.templates import FAMILIES, apply_templates, drop_namespace
from service.storage.turns import TURNS, TurnRecord, TurnStore
from tests.api.conftest import Team, auth, make_team, ok

REPO = Path(__file__).resolve().parents[2]
LOOP_FAMILIES = FAMILIES


@pytest.fixture(scope="session")
def llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llm_own() -> Iterator[ScriptedLLM]:
    """A second upstream, configured for one tenant only (per-tenant upstream override)."""
    server = ScriptedLLM().start()
    try:
        yield server
    finally:
        server.stop()


OWN_UPSTREAM_TENANT = "t-own-upstream"
STRICT_GATE_TENANT = "t-strict-gate"  # refuses models below their family's version floor
OWN_ANTHROPIC_TENANT = "t-own-anthropic"  # its own Anthropic upstream (llm_own, key sk-own-ant)


@pytest.fixture(autouse=True)
def _fresh_script(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "llm" in request.fixturenames:
        request.getfixturevalue("llm").reset()


@pytest.fixture(scope="session")
def queue_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def loop_settings(settings: Settings, llm: ScriptedLLM, llm_own: ScriptedLLM, queue_prefix: str) -> Settings:
    return settings.model_copy(
        update={
            "auth": AuthSettings(api_key_pepper=SecretStr("test-pepper")),
            "api": ApiSettings(
                write_refresh="true",
                max_body_bytes=2_000_000,
                rate_limit_per_s=100_000,
                rate_limit_burst=1_000_000,
                tenant_rate_limit_per_s=1_000_000,
                tenant_rate_limit_burst=10_000_000,
            ),
            "loop": MemoryLoopSettings(
                upstream_base_url=llm.base_url,
                upstream_api_key=SecretStr("sk-upstream-test"),
                anthropic_upstream_base_url=llm.base_url,
                anthropic_upstream_api_key=SecretStr("sk-ant-upstream-test"),
                upstream_timeout_s=3.0,
                tenants={  # type: ignore[dict-item]
                    "t-extraction-off": {"extraction_enabled": False},
                    STRICT_GATE_TENANT: {"strict_model_gate": True},
                    OWN_UPSTREAM_TENANT: {
                        "upstream_base_url": llm_own.base_url,
                        "upstream_api_key": "sk-own",
                    },
                    OWN_ANTHROPIC_TENANT: {
                        "anthropic_upstream_base_url": llm_own.base_url,
                        "anthropic_upstream_api_key": "sk-own-ant",
                    },
                },
            ),
            "celery": CelerySettings(queue_prefix=queue_prefix),
        }
    )


@pytest.fixture(scope="session")
def loop_indices(os_client: OpenSearch, loop_settings: Settings) -> Iterator[None]:
    apply_templates(os_client, loop_settings.opensearch_namespace, LOOP_FAMILIES)
    yield
    drop_namespace(os_client, loop_settings.opensearch_namespace, (TURNS, REVIEWS))


@pytest.fixture(scope="session")
def loop_app(loop_settings: Settings, loop_indices: None) -> FastAPI:
    from service.app import create_app

    return create_app(loop_settings)


@pytest.fixture(scope="session")
def api(loop_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(loop_app) as client:
        yield client


@pytest.fixture(scope="session")
def loop_services(api: TestClient, loop_app: FastAPI) -> Services:
    services: Services = loop_app.state.services
    return services


@pytest.fixture(scope="session")
def operator_headers(loop_services: Services) -> dict[str, str]:
    return auth(loop_services.provisioning.bootstrap().plaintext)


@pytest.fixture
def crew(api: TestClient, operator_headers: dict[str, str]) -> Team:
    """A fresh tenant: alice and bob (project pay), carol the admin."""
    return make_team(api, operator_headers)


@pytest.fixture
def other_crew(api: TestClient, operator_headers: dict[str, str]) -> Team:
    return make_team(api, operator_headers)


def worker_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(
        TENURE_OPENSEARCH_URL=settings.opensearch_url,
        TENURE_OPENSEARCH_NAMESPACE=settings.opensearch_namespace,
        TENURE_REDIS_URL=settings.redis_url,
        TENURE_CELERY_QUEUE_PREFIX=settings.celery.queue_prefix,
        TENURE_LOOP_SWEEP_STALE_AFTER_S="2",
        TENURE_LOOP_SWEEP_INTERVAL_S="1",
        TENURE_LOOP_COMPACTION_COOLDOWN_S="0",
        PYTHONPATH=str(REPO),
    )
    return env


class WorkerProcess:
    def __init__(self, settings: Settings, log_path: Path, env: dict[str, str] | None = None):
        """``env``: settings of this worker beyond :func:`worker_env`'s."""
        self.log_path = log_path
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *celery_worker_args(settings.celery.queue_prefix, name="test")],
            cwd=REPO,
            env={**worker_env(settings), **(env or {})},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited: {self.log_path.read_text()[-3000:]}")
            if "ready." in self.log_path.read_text():
                return
            time.sleep(0.2)
        raise RuntimeError(f"celery worker not ready: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def worker(
    loop_settings: Settings, api: TestClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    proc = WorkerProcess(loop_settings, Path(tmp_path_factory.mktemp("worker")) / "worker.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def wait_turn(api: TestClient, headers: dict[str, str], turn_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """Poll a turn until its extraction is final (done / skipped / failed). The proxy records the
    turn after its answer went out (off the latency path), so a first poll may find none yet."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = api.get(f"/v1/turns/{turn_id}", headers=headers)
        if response.status_code == 404:
            time.sleep(0.05)
            continue
        body = ok(response)
        if body["extraction_status"] in ("done", "skipped", "failed"):
            return body
        time.sleep(0.05)
    raise AssertionError(f"turn {turn_id} not extracted in time: {body}")


def wait_until(check: Any, timeout: float = 20.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not met in time")


def sidecar(**sections: Any) -> str:
    import json

    from service.extraction.sidecar import BEGIN, END

    body: dict[str, Any] = {
        "turn_signal": "substantive",
        "topic_shift": False,
        "topic_label": "test topic",
        "new_beliefs": [],
        "belief_updates": [],
        "entity_updates": [],
        "possible_alias_candidates": [],
        "resolved_open_questions": [],
        "new_open_questions": [],
        "style_signals": [],
    }
    body.update(sections)
    return f"{BEGIN}{json.dumps(body)}{END}"


def new_belief(name: str, content: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "decision",
        "subtype": None,
        "canonical_name": name,
        "content": content,
        "why_it_matters": f"Shapes answers about {name.replace('_', ' ')}.",
        "scope": ["domain:code"],
        "confidence": 0.8,
        "epistemic_status": "active",
        "aliases": [],
        "resolves_open_question": None,
        **extra,
    }


def record_turn(turns: TurnStore, team: Team, *names: str, age_s: int = 0, **fields: Any) -> str:
    """A turn of alice recorded straight in the store (no task sent), last touched ``age_s`` ago,
    whose sidecar holds one new belief per name."""
    raw = sidecar(new_beliefs=[new_belief(n, f"{n} holds.") for n in names]).split(">>>", 1)[1].rsplit("<<<", 1)[0]
    at = utcnow() - timedelta(seconds=age_s)
    turn_id = f"turn-{uuid.uuid4().hex[:10]}"
    turns.create(
        TurnRecord(
            tenant_id=team.tenant,
            turn_id=turn_id,
            owner_id="alice",
            session_id="s",
            scope=["domain:code"],
            model="gpt-4o",
            sidecar_raw=raw,
            parse_status="parsed",
            created_at=at,
            updated_at=at,
            **fields,
        )
    )
    return turn_id
