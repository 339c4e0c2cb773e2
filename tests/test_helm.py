"""deploy/helm/tenure: linted by helm, rendered, and every rendered object validated (strictly)
against Kubernetes' own schemas (kubernetes-validate, the nearest of kubeconform on PyPI); then
checked against the project: the same commands as the compose file, one beat, the templates job
before anything starts, every TENURE_* name a real setting, no model provider by default."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.config import environment_names
from tests.api_memory_budget import process_budget_mb, settings_of, size_mb

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy/helm/tenure"
KUBERNETES = "1.30.0"
PEPPER = ["--set", "secrets.apiKeyPepper=test-pepper"]


def _helm() -> str:
    found = shutil.which("helm")
    if found:
        return found
    go = shutil.which("go") or "/usr/local/go/bin/go"
    gopath = subprocess.run([go, "env", "GOPATH"], capture_output=True, text=True, check=True).stdout.strip()
    path = Path(gopath) / "bin" / "helm"
    assert path.exists(), "helm is not installed: scripts/setup.sh builds it"
    return str(path)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, check=check)


def render(*values: str) -> list[dict[str, Any]]:
    out = helm("template", "t", str(CHART), *PEPPER, *values).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix))


def container(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]["containers"][0]
    return spec


def test_the_chart_lints() -> None:
    result = helm("lint", str(CHART), *PEPPER, "--strict", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", [[], ["--set", "api.ingress.enabled=true", "--set", "existingSecret=mine"]])
def test_every_rendered_object_is_valid_kubernetes(values: list[str]) -> None:
    docs = render(*values)
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Deployment", "Service", "Job"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_it_runs_what_the_compose_file_runs() -> None:
    docs = render()
    api = container(by_kind(docs, "Deployment", "-api"))
    assert api["command"][:3] == ["uvicorn", "service.app:create_app", "--factory"]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    worker = container(by_kind(docs, "Deployment", "-worker"))
    assert worker["command"][:4] == ["celery", "-A", "workers.celery_app:app", "worker"]
    assert worker["command"][worker["command"].index("-Q") + 1] == "tenure.heavy,tenure.cheap"
    assert worker["livenessProbe"]["exec"]["command"][:4] == ["python", "-m", "workers.liveness", "check"]
    assert (
        worker["livenessProbe"]["exec"]["command"][4]
        == by_kind(docs, "ConfigMap")["data"]["TENURE_CELERY_WORKER_HEARTBEAT_FILE"]
    )
    beat = by_kind(docs, "Deployment", "-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert container(beat)["livenessProbe"]["exec"]["command"][:4] == ["python", "-m", "workers.beat", "check"]
    job = by_kind(docs, "Job")
    assert container(job)["command"] == ["tenure", "apply-templates"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    # several processes per pod: multi-process metrics on an emptyDir
    for doc in (by_kind(docs, "Deployment", "-api"), by_kind(docs, "Deployment", "-worker")):
        env = {e["name"]: e["value"] for e in container(doc)["env"]}
        assert env["PROMETHEUS_MULTIPROC_DIR"] == "/run/tenure-metrics"


def test_an_api_pod_holds_its_processes_with_their_caches_full(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render()
    api = container(by_kind(docs, "Deployment", "-api"))
    workers = int(api["command"][api["command"].index("--workers") + 1])
    environment = {**by_kind(docs, "ConfigMap")["data"], **{e["name"]: e["value"] for e in api["env"] if "value" in e}}
    needed = workers * process_budget_mb(settings_of(environment, monkeypatch).recall)
    assert size_mb(api["resources"]["limits"]["memory"]) >= needed, f"{workers} processes may hold {needed:.0f} MB"


def test_configuration_names_real_settings_and_sets_no_upstream() -> None:
    docs = render()
    data = by_kind(docs, "ConfigMap")["data"]
    secret = by_kind(docs, "Secret")["stringData"]
    assert set(data) | set(secret) <= environment_names()
    assert data["TENURE_LOOP_UPSTREAM_BASE_URL"] == ""  # chat answers 503 upstream_not_configured
    assert secret["TENURE_AUTH_API_KEY_PEPPER"] == "test-pepper"


def test_the_pepper_is_required_and_metrics_stay_off_the_ingress() -> None:
    missing = helm("template", "t", str(CHART), check=False)
    assert missing.returncode != 0 and "apiKeyPepper is required" in missing.stderr
    ingress = by_kind(render("--set", "api.ingress.enabled=true"), "Ingress")
    paths = [p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]]
    assert "/v1" in paths and not any(p == "/" or p.startswith("/metrics") for p in paths)
