"""What an operator sees: /metrics after a recall and a chat, the worker's metrics across its
prefork pool, several processes merged in multi-process mode, JSON log lines with request id,
tenant and latency, and an idle worker + beat that stay quiet at INFO."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from prometheus_client.parser import text_string_to_metric_families

from deploy.devstack import free_port
from deploy.localstack import celery_worker_args
from loadtest.scripted_llm import Reply, ScriptedLLM
from service.app import create_app
from service.config import CelerySettings, ObservabilitySettings, Settings
from service.storage.templates import FAMILIES, drop_namespace
from service.telemetry.logs import configure_logging
from tests.api.conftest import Team, auth, make_team, ok
from tests.memory_loop.conftest import REPO, new_belief, sidecar, wait_turn, wait_until, worker_env

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def seed(client: TestClient, team: Team) -> str:
    body = {
        "type": "entity",
        "canonical_name": "redis_cache",
        "aliases": ["redis"],
        "content": "Redis is the cache.",
        "why_it_matters": "Shapes cache answers toward Redis.",
        "scope": ["domain:code"],
    }
    return str(ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)["id"])


def chat(client: TestClient, team: Team, text: str) -> Any:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": text}],
        "metadata": {"session_id": "s-obs", "scope": "domain:code"},
    }
    return client.post("/v1/chat/completions", json=body, headers=team.h("alice"))


def test_metrics_after_a_recall_and_a_chat(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    seed(api, crew)
    before = scrape(api)
    recall = {"scopes": ["domain:code"], "query": "how do we configure redis?"}
    assert ok(api.post("/v1/recall", json=recall, headers=crew.h("alice")))["injected_ids"]
    llm.script(Reply(content="Use allkeys-lru." + sidecar()))
    assert ok(chat(api, crew, "which eviction policy for redis?"))["tenure"]["injected_belief_ids"]
    after = scrape(api)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    latency = "tenure_http_request_duration_seconds_count"
    assert delta(latency, method="POST", route="/v1/recall", status="200") == 1
    assert delta(latency, method="POST", route="/v1/chat/completions", status="200") == 1
    assert delta("tenure_recall_duration_seconds_count") == 2  # the recall and the chat's
    assert delta("tenure_recall_tier_size_count", tier="relevant") == 2
    assert delta("tenure_recall_injected_beliefs_sum") >= 2  # redis_cache, both times
    # shared state, read from Redis at scrape time
    assert value(after, "tenure_redis_up") == 1
    assert ("tenure_outbox_depth", frozenset({("outbox", "receipts")})) in after
    assert ("tenure_outbox_oldest_age_seconds", frozenset({("outbox", "parked_turns")})) in after
    prefix = api.app.state.services.settings.celery.queue_prefix  # type: ignore[attr-defined]
    assert ("tenure_celery_queue_length", frozenset({("queue", f"{prefix}.heavy")})) in after


def test_the_recall_caches_are_counted(api: TestClient, crew: Team) -> None:
    """The same message twice: the second recall's filter tiers, relevant tier (in the per-message
    entries' own cache), message analysis and vocabulary come from the process's caches, and the
    scrape says so."""
    seed(api, crew)
    recall = {"scopes": ["domain:code"], "query": f"redis eviction for {uuid.uuid4().hex[:6]}?"}
    before = scrape(api)
    first = ok(api.post("/v1/recall", json=recall, headers=crew.h("alice")))
    second = ok(api.post("/v1/recall", json=recall, headers=crew.h("alice")))
    after = scrape(api)
    assert first["injected_ids"] == second["injected_ids"] != []

    def grew(cache: str, part: str, outcome: str) -> float:
        name = "tenure_cache_lookups_total"
        labels = {"cache": cache, "part": part, "outcome": outcome}
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("tiers", "filters", "miss") >= 2 and grew("tiers", "filters", "hit") >= 2  # persona, scoped
    assert grew("message_tiers", "relevant", "miss") >= 1 and grew("message_tiers", "relevant", "hit") >= 1
    assert grew("message_analyses", "all", "hit") >= 1 and grew("vocabularies", "all", "hit") >= 1
    assert grew("decoded_beliefs", "all", "miss") + grew("decoded_beliefs", "all", "hit") >= 1
    for cache in ("tiers", "message_tiers", "message_analyses", "vocabularies", "decoded_beliefs"):
        assert value(after, "tenure_cache_entries", cache=cache) >= 1
    assert value(after, "tenure_cache_estimated_bytes", cache="tiers") > 0
    assert value(after, "tenure_cache_estimated_bytes", cache="message_tiers") > 0
    assert ("tenure_cache_estimated_bytes", frozenset({("cache", "decoded_beliefs")})) not in after  # not estimated


def test_refusals_and_unmatched_routes_are_counted(api: TestClient) -> None:
    before = scrape(api)
    refused = api.post("/v1/recall", json={"query": "x"}, headers={"Authorization": "Bearer tnr_nope_nope"})
    assert refused.status_code == 401
    assert api.get("/no/such/path").status_code == 404
    after = scrape(api)
    name = "tenure_http_request_duration_seconds_count"
    assert value(after, name, method="GET", route="unmatched", status="404") == (
        value(before, name, method="GET", route="unmatched", status="404") + 1
    )
    assert value(after, name, method="POST", route="/v1/recall", status="401") >= 1


def test_rate_limit_refusals_are_counted(
    api: TestClient, loop_settings: Settings, operator_headers: dict[str, str]
) -> None:
    team = make_team(api, operator_headers)
    tight = loop_settings.api.model_copy(update={"rate_limit_per_s": 0.001, "rate_limit_burst": 1})
    with TestClient(create_app(loop_settings.model_copy(update={"api": tight}))) as client:
        before = value(scrape(client), "tenure_rate_limit_refusals_total", bucket="credential")
        codes = [client.get("/v1/beliefs", headers=team.h("bob")).status_code for _ in range(3)]
        assert 429 in codes
        after = value(scrape(client), "tenure_rate_limit_refusals_total", bucket="credential")
        assert after - before == codes.count(429)


def test_several_processes_are_merged_in_multiprocess_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two API processes (uvicorn --workers) write their own files; one scrape sums them."""
    record = (
        "from service.telemetry import metrics; "
        "metrics.HTTP_LATENCY.labels('GET', '/v1/beliefs', '200').observe(0.01); "
        "metrics.EXTRACTIONS.labels('done').inc(3)"
    )
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", record], env=env, cwd=REPO, check=True)
    assert len(list(tmp_path.glob("*.db"))) >= 2  # one file per process and metric kind
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    from service.telemetry.metrics import exposition

    merged = parse(exposition().decode())
    labels = {"method": "GET", "route": "/v1/beliefs", "status": "200"}
    assert value(merged, "tenure_http_request_duration_seconds_count", **labels) == 2
    assert value(merged, "tenure_extraction_outcomes_total", outcome="done") == 6


def test_every_log_line_carries_request_id_tenant_and_latency(api: TestClient, crew: Team) -> None:
    stream = io.StringIO()
    configure_logging("json", "INFO", stream=stream)
    try:
        request_id = f"req-obs-{uuid.uuid4().hex[:8]}"
        response = api.get("/v1/beliefs", headers={**crew.h("alice"), "X-Request-ID": request_id})
        assert response.status_code == 200
        api.get("/healthz")  # a probe: DEBUG only
    finally:
        configure_logging("json", "INFO")
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    mine = [line for line in lines if line.get("request_id") == request_id]
    access = [line for line in mine if line["logger"] == "tenure.access"]
    assert len(access) == 1
    assert access[0]["tenant_id"] == crew.tenant
    assert access[0]["route"] == "/v1/beliefs" and access[0]["status"] == 200
    assert isinstance(access[0]["latency_ms"], float) and access[0]["latency_ms"] > 0
    assert all({"time", "level", "logger", "message", "request_id", "tenant_id", "latency_ms"} <= set(m) for m in mine)
    assert not [line for line in lines if line.get("route") == "/healthz"]


def test_a_chat_logs_its_access_line_and_no_client_library_line(api: TestClient, crew: Team, llm: ScriptedLLM) -> None:
    # the upstream client (httpx2) logs every request at INFO unless told not to: one more line
    # per model call, on the loop that serves recalls, repeating what the access line says
    stream = io.StringIO()
    configure_logging("json", "INFO", stream=stream)
    try:
        llm.script(Reply(content="Noted." + sidecar()))
        assert chat(api, crew, "which eviction policy for redis?").status_code == 200
    finally:
        configure_logging("json", "INFO")
    loggers = {json.loads(line)["logger"] for line in stream.getvalue().splitlines() if line.strip()}
    assert "tenure.access" in loggers
    assert not loggers & {"httpx", "httpcore", "httpx2", "httpcore2", "opensearch", "urllib3"}


# ------------------------------------------------- a worker and beat of their own


@pytest.fixture(scope="module")
def observed(
    loop_settings: Settings, tmp_path_factory: pytest.TempPathFactory, os_client: OpenSearch
) -> Iterator[tuple[TestClient, int, Path, Path]]:
    """An API, a two-process prefork worker serving its pool's metrics, and beat, on queues and an
    index namespace of their own: the session's worker must not take these tasks, and this beat's
    sweep must not see the session's turns (a turn another test of this file chatted through the
    session's API waits in the session's queue, whose worker only runs when a test asks for it;
    stale, this sweep sent it again, real work in the middle of the idle check when the file ran
    alone)."""
    root = tmp_path_factory.mktemp("observed")
    own = f"obs-{uuid.uuid4().hex[:6]}"
    settings = loop_settings.model_copy(
        update={"celery": CelerySettings(queue_prefix=own), "opensearch_namespace": own}
    )
    port = free_port()
    (root / "prom").mkdir()
    env = {
        **worker_env(settings),
        "PROMETHEUS_MULTIPROC_DIR": str(root / "prom"),
        "TENURE_OBSERVABILITY_WORKER_METRICS_PORT": str(port),
    }
    worker_log, beat_log = root / "worker.log", root / "beat.log"
    with worker_log.open("w") as wout, beat_log.open("w") as bout:
        worker = subprocess.Popen(
            [sys.executable, "-m", *celery_worker_args(settings.celery.queue_prefix, concurrency=2, name="obs")],
            cwd=REPO,
            env=env,
            stdout=wout,
            stderr=subprocess.STDOUT,
        )
        beat = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery_app", "beat", "-s", str(root / "schedule")],
            cwd=REPO,
            env=env,
            stdout=bout,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: "ready." in worker_log.read_text(), timeout=60)
            with TestClient(create_app(settings)) as client:
                yield client, port, worker_log, beat_log
        finally:
            for proc in (beat, worker):
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            drop_namespace(os_client, own, FAMILIES)


def worker_metrics(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310
        return parse(response.read().decode())


def test_worker_metrics_cover_its_whole_pool(observed: tuple[TestClient, int, Path, Path], llm: ScriptedLLM) -> None:
    client, port, _, _ = observed
    operator = client.app.state.services.provisioning.bootstrap().plaintext  # type: ignore[attr-defined]
    team = make_team(client, auth(operator))
    turns = []
    for i in range(4):  # several turns: both pool processes take some
        llm.script(Reply(content="Noted." + sidecar(new_beliefs=[new_belief(f"observed_fact_{i}", "A fact.")])))
        turns.append(ok(chat(client, team, f"remember fact {i}"))["tenure"]["turn_id"])
    for turn_id in turns:
        assert wait_turn(client, team.h("alice"), turn_id)["extraction_status"] == "done"
    # beat's receipt drain runs every second on this worker, but its first run is due one interval
    # after beat starts: in a full session (session fixtures already up) the four extractions can be
    # counted before beat has sent it, so wait for both rather than reading one snapshot
    samples = wait_until(
        lambda: (
            (s := worker_metrics(port))
            and value(s, "tenure_celery_tasks_total", task="beliefs.extract", state="success") >= 4
            and value(s, "tenure_celery_tasks_total", task="audit.drain_receipts", state="success") >= 1
            and s
        ),
        timeout=20,
    )
    assert value(samples, "tenure_extraction_outcomes_total", outcome="done") >= 4
    assert value(samples, "tenure_merge_decisions_total", section="new_beliefs", outcome="inserted") >= 4
    assert value(samples, "tenure_celery_task_duration_seconds_count", task="beliefs.extract") >= 4
    assert value(samples, "tenure_celery_tasks_total", task="audit.drain_receipts", state="success") >= 1


def test_an_idle_worker_and_beat_are_quiet(observed: tuple[TestClient, int, Path, Path]) -> None:
    """The receipt drain (every second), the parked-turn drain and the sweep keep running, and
    neither process writes a line about them at INFO."""
    _, port, worker_log, beat_log = observed
    drains = "tenure_celery_tasks_total"
    wait_until(lambda: value(worker_metrics(port), drains, task="audit.drain_receipts", state="success") >= 1)
    start = value(worker_metrics(port), drains, task="audit.drain_receipts", state="success")
    sizes = (len(worker_log.read_text().splitlines()), len(beat_log.read_text().splitlines()))
    time.sleep(6)
    assert value(worker_metrics(port), drains, task="audit.drain_receipts", state="success") >= start + 3
    housekeeping = ("audit.drain_receipts", "turns.drain_parked", "turns.sweep", "receipts-drain", "extraction-sweep")
    # (a slow extraction left over from the test before may still finish and log: that line is real work)
    new_worker = [
        line for line in worker_log.read_text().splitlines()[sizes[0] :] if any(h in line for h in housekeeping)
    ]
    new_beat = beat_log.read_text().splitlines()[sizes[1] :]
    assert new_worker == [] and new_beat == [], (new_worker[:5], new_beat[:5])


def test_observability_settings_are_documented_defaults() -> None:
    defaults = ObservabilitySettings()
    assert defaults.log_format == "json" and defaults.metrics_enabled and not defaults.tracing_enabled
