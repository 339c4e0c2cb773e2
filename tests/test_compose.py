"""docker-compose.yml describes a complete deployment: checked without a Docker engine.

The file is parsed with PyYAML, interpolated the way Compose does (``${VAR:-default}``, ``$$``),
validated against the official Compose Specification schema (tests/data/compose-spec.json) and
checked against the project itself: pinned images that match the versions tests run against,
health checks, start-up order, volumes, limits, and every ``TENURE_*`` name against the settings.
Each checker returns a list of problems; the tests also feed them deliberately broken files.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from service.api.http_protocol import MIN_KEEP_ALIVE_S
from service.config import environment_names
from tests.api_memory_budget import process_budget_mb, settings_of, size_mb
from tests.caddy import CADDYFILE, adapted_caddyfile

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"

CORE = {"opensearch", "redis", "templates", "api", "worker", "beat", "tls"}
LOAD_PROFILE = {"llm", "load"}
HEALTHCHECKED = {"opensearch", "redis", "api", "worker", "beat", "tls"}
MEMORY_LIMITED = {"opensearch", "redis"}
NEEDS_EVERYTHING = {"api", "worker", "beat"}
READY_ORDER = {
    "templates": "service_completed_successfully",
    "opensearch": "service_healthy",
    "redis": "service_healthy",
}
# (service, mount target inside the container) that must be backed by a named volume
PERSISTENT = {
    ("opensearch", "/usr/share/opensearch/data"),
    ("redis", "/data"),
    ("beat", "/var/lib/tenure/beat"),
}
PEPPER = "a-test-pepper"


# ------------------------------------------------------------ interpolation

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(ValueError):
    pass


def _substitute(match: re.Match[str], env: Mapping[str, str]) -> str:
    if match["escaped"]:
        return "$"
    name = match["braced"] or match["bare"]
    value, op, arg = env.get(name), match["op"], match["arg"] or ""
    unset = value is None or (op is not None and op.startswith(":") and value == "")
    if op in (":-", "-") and unset:
        return arg
    if op in (":?", "?") and unset:
        raise MissingVariable(f"{name}: {arg}")
    return value or ""


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable substitution over every string of the document."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if isinstance(node, str):
        return _VARIABLE.sub(lambda m: _substitute(m, env), node)
    return node


def variables(node: Any) -> set[str]:
    """Every variable the document reads from the environment or .env."""
    if isinstance(node, dict):
        return set().union(*(variables(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(variables(v) for v in node)) if node else set()
    if isinstance(node, str):
        return {m["braced"] or m["bare"] for m in _VARIABLE.finditer(node) if not m["escaped"]}
    return set()


# ------------------------------------------------------------------ loading


def load_raw() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())  # merge keys (<<) resolved here
    return doc


def resolved(doc: dict[str, Any] | None = None, **env: str) -> dict[str, Any]:
    """The file as ``docker compose config`` would see it with only the required pepper set."""
    result: dict[str, Any] = interpolate(doc or load_raw(), {"TENURE_AUTH_API_KEY_PEPPER": PEPPER, **env})
    return result


def _services(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = doc.get("services", {})
    return services


def _walk_strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _walk_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_strings(value)
    elif isinstance(node, str):
        yield node


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return command.split() if isinstance(command, str) else [str(c) for c in command]


# ----------------------------------------------------------------- checkers


def check_service_set(doc: dict[str, Any]) -> list[str]:
    found = set(_services(doc))
    expected = CORE | LOAD_PROFILE
    return [f"services {sorted(found)} != {sorted(expected)}"] if found != expected else []


_VERSION_TAG = re.compile(r"^\d+(\.\d+)+([-.][A-Za-z0-9.]+)?$")


def image_tag(service: dict[str, Any]) -> tuple[str, str | None]:
    image = str(service.get("image", ""))
    name, sep, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    return name, (tag if sep else None)


def check_pinned_images(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in _services(doc).items():
        image, tag = image_tag(service)
        if not image:
            problems.append(f"{name}: no image (a built service still needs a versioned image name)")
        elif tag is None or not _VERSION_TAG.match(tag):
            problems.append(f"{name}: image {service.get('image')!r} is not pinned to an explicit version")
    return problems


def check_healthchecks(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name in sorted(HEALTHCHECKED):
        check = _services(doc).get(name, {}).get("healthcheck") or {}
        test = check.get("test")
        if check.get("disable") or not test or test in (["NONE"], "NONE"):
            problems.append(f"{name}: no health check")
    return problems


def check_start_order(doc: dict[str, Any]) -> list[str]:
    problems = []
    services = _services(doc)
    for name in sorted(NEEDS_EVERYTHING):
        depends = services.get(name, {}).get("depends_on", {})
        if not isinstance(depends, dict):
            problems.append(f"{name}: depends_on without conditions")
            continue
        for dependency, condition in READY_ORDER.items():
            got = (depends.get(dependency) or {}).get("condition")
            if got != condition:
                problems.append(f"{name}: depends_on {dependency} is {got!r}, expected {condition!r}")
    templates = (services.get("templates", {}).get("depends_on") or {}).get("opensearch") or {}
    if templates.get("condition") != "service_healthy":
        problems.append("templates: must wait for opensearch service_healthy")
    return problems


def check_profiles(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in _services(doc).items():
        profiles = service.get("profiles") or []
        if name in LOAD_PROFILE and profiles != ["load"]:
            problems.append(f"{name}: must be in profile 'load' only, has {profiles}")
        if name not in LOAD_PROFILE and profiles:
            problems.append(f"{name}: part of the deployment, must not be behind a profile ({profiles})")
    return problems


def _named_volume_at(doc: dict[str, Any], service: str, target: str) -> str | None:
    declared = doc.get("volumes") or {}
    for mount in _services(doc).get(service, {}).get("volumes", []):
        source, _, rest = mount.partition(":") if isinstance(mount, str) else (mount.get("source"), ":", "")
        mount_target = rest.split(":")[0] if isinstance(mount, str) else mount.get("target")
        if mount_target == target and source in declared:
            return str(source)
    return None


def check_named_volumes(doc: dict[str, Any]) -> list[str]:
    return [
        f"{service}: {target} is not on a named volume"
        for service, target in sorted(PERSISTENT)
        if _named_volume_at(doc, service, target) is None
    ]


def check_memory_limits(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name in sorted(MEMORY_LIMITED):
        service = _services(doc).get(name, {})
        limit = service.get("mem_limit") or (
            ((service.get("deploy") or {}).get("resources") or {}).get("limits") or {}
        ).get("memory")
        if not limit:
            problems.append(f"{name}: no memory limit")
    return problems


_TENURE_NAME = re.compile(r"\bTENURE_[A-Z0-9_]*[A-Z0-9]")


def check_tenure_names(doc: dict[str, Any], known: frozenset[str]) -> list[str]:
    """Every TENURE_* name anywhere (environment keys, ${...} references, commands) is a setting."""
    used = {m.group(0) for text in _walk_strings(doc) for m in _TENURE_NAME.finditer(text)}
    return [f"{name} is not a setting the service reads" for name in sorted(used - known)]


def check_log_rotation(doc: dict[str, Any]) -> list[str]:
    """Every container's log is bounded: the json-file driver with max-size and max-file."""
    problems = []
    for name, service in _services(doc).items():
        logging = service.get("logging") or {}
        options = logging.get("options") or {}
        if logging.get("driver") != "json-file" or not options.get("max-size") or not options.get("max-file"):
            problems.append(f"{name}: logs are not rotated (json-file with max-size and max-file)")
    return problems


def _published(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host address or '' for all interfaces, container port) of every published port."""
    found = []
    for port in service.get("ports", []):
        parts = str(port).split(":")
        found.append((parts[0] if len(parts) == 3 else "", parts[-1]))
    return found


def check_only_tls_is_public(doc: dict[str, Any]) -> list[str]:
    """Plain HTTP never leaves the host: only the TLS proxy publishes on every interface."""
    problems = []
    for name, service in _services(doc).items():
        for host, port in _published(service):
            if name != "tls" and host != "127.0.0.1":
                problems.append(f"{name}: port {port} published on all interfaces without TLS")
    if ("", "443") not in _published(_services(doc).get("tls", {})):
        problems.append("tls: does not publish 443")
    return problems


def check_schema(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    return [f"{error.json_path}: {error.message}" for error in validator.iter_errors(doc)]


ALL_CHECKS = (
    check_service_set,
    check_pinned_images,
    check_healthchecks,
    check_start_order,
    check_profiles,
    check_named_volumes,
    check_memory_limits,
    check_log_rotation,
    check_only_tls_is_public,
    check_schema,
)


# -------------------------------------------------------------------- tests


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_compose_file_passes(check: Any) -> None:
    assert check(resolved()) == []


def test_every_tenure_name_is_a_setting() -> None:
    raw = load_raw()
    assert check_tenure_names(raw, environment_names()) == []
    # names are also read, unresolved, from the text (comments included) so documentation stays true
    in_text = set(_TENURE_NAME.findall(COMPOSE.read_text()))
    assert in_text - environment_names() == set()
    assert {"TENURE_OPENSEARCH_URL", "TENURE_REDIS_URL", "TENURE_AUTH_API_KEY_PEPPER"} <= in_text


def _broken(mutate: Any) -> dict[str, Any]:
    doc = copy.deepcopy(resolved())
    mutate(_services(doc))
    return doc


BROKEN = [
    (check_service_set, lambda s: s.pop("beat")),
    (check_pinned_images, lambda s: s["redis"].update(image="redis:latest")),
    (check_pinned_images, lambda s: s["opensearch"].update(image="opensearchproject/opensearch")),
    (check_pinned_images, lambda s: s["api"].pop("image")),
    (check_healthchecks, lambda s: s["worker"].pop("healthcheck")),
    (check_healthchecks, lambda s: s["api"].update(healthcheck={"disable": True})),
    (check_start_order, lambda s: s["api"]["depends_on"]["templates"].update(condition="service_started")),
    (check_start_order, lambda s: s["beat"]["depends_on"].pop("redis")),
    (check_start_order, lambda s: s["worker"].update(depends_on=["opensearch", "redis"])),
    (check_profiles, lambda s: s["load"].pop("profiles")),
    (check_profiles, lambda s: s["api"].update(profiles=["load"])),
    (check_named_volumes, lambda s: s["redis"].update(volumes=["./redis:/data"])),
    (check_named_volumes, lambda s: s["opensearch"].pop("volumes")),
    (check_memory_limits, lambda s: s["opensearch"].pop("mem_limit")),
    (check_healthchecks, lambda s: s["beat"].pop("healthcheck")),
    (check_log_rotation, lambda s: s["worker"].pop("logging")),
    (check_log_rotation, lambda s: s["redis"].update(logging={"driver": "json-file"})),
    (check_only_tls_is_public, lambda s: s["api"].update(ports=["8000:8000"])),
    (check_only_tls_is_public, lambda s: s["tls"].update(ports=["127.0.0.1:443:443"])),
    (check_schema, lambda s: s["api"].update(healthcheck={"tset": ["CMD", "true"]})),
    (check_schema, lambda s: s["redis"].update(depends_on={"opensearch": {"condition": "service_ready"}})),
]


@pytest.mark.parametrize(("check", "mutate"), BROKEN, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(BROKEN)])
def test_checkers_catch_a_broken_file(check: Any, mutate: Any) -> None:
    assert check(_broken(mutate)) != []


def test_a_misspelled_setting_is_caught() -> None:
    doc = load_raw()
    doc["services"]["api"]["environment"] = {**doc["services"]["api"]["environment"], "TENURE_REDIS_ULR": "x"}
    doc["services"]["worker"]["command"] = ["celery", "--", "${TENURE_CELERY_QUEUE_PREFX:-tenure}"]
    assert check_tenure_names(doc, environment_names()) == [
        "TENURE_CELERY_QUEUE_PREFX is not a setting the service reads",
        "TENURE_REDIS_ULR is not a setting the service reads",
    ]


# ----------------------------------------------- the versions tests run on


def test_opensearch_image_is_the_version_tests_run_against() -> None:
    build = (ROOT / "deploy/opensearch/build.sh").read_text()
    pom = (ROOT / "deploy/opensearch/pom.xml").read_text()
    built = re.search(r"OpenSearch (\d+\.\d+\.\d+)", build)
    pinned = re.search(r"<opensearch\.version>([^<]+)</opensearch\.version>", pom)
    assert built and pinned and built.group(1) == pinned.group(1)
    service = load_raw()["services"]["opensearch"]
    image, tag = image_tag(service)
    assert (image, tag) == ("tenure-opensearch", built.group(1))
    # built FROM the official image at that version
    assert service["build"]["args"]["OPENSEARCH_VERSION"] == built.group(1)
    dockerfile = (ROOT / service["build"]["context"] / "Dockerfile").read_text()
    assert f"ARG OPENSEARCH_VERSION={built.group(1)}" in dockerfile
    assert "FROM opensearchproject/opensearch:${OPENSEARCH_VERSION}" in dockerfile


# analysis types the official image lacks, by the plugin that provides them
PLUGIN_PREFIXES = {
    "icu_": "analysis-icu",
    "kuromoji_": "analysis-kuromoji",
    "smartcn_": "analysis-smartcn",
    "nori_": "analysis-nori",
}


def test_the_opensearch_image_installs_every_analysis_plugin_the_templates_use() -> None:
    service = load_raw()["services"]["opensearch"]
    dockerfile = (ROOT / service["build"]["context"] / "Dockerfile").read_text()
    installed = set(re.findall(r"analysis-[a-z]+", dockerfile.split("opensearch-plugin install", 1)[1]))
    used: set[str] = set()
    for path in sorted((ROOT / "index_templates" / "component").glob("*.json")):
        analysis = json.loads(path.read_text())["template"].get("settings", {}).get("analysis", {})
        for kind in analysis.values():
            for definition in kind.values():
                used |= {
                    plugin
                    for prefix, plugin in PLUGIN_PREFIXES.items()
                    if definition.get("type", "").startswith(prefix)
                }
    assert used and used <= installed, used - installed


def test_redis_image_is_the_version_tests_run_against() -> None:
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(server).exists():
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it; tests need it anyway)")
    output = subprocess.run([server, "--version"], capture_output=True, text=True, check=True).stdout
    version = re.search(r"v=(\d+\.\d+\.\d+)", output)
    assert version, output
    image, tag = image_tag(load_raw()["services"]["redis"])
    assert image == "redis" and tag is not None and tag.split("-")[0] == version.group(1)


def test_tenure_image_is_the_package_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name in CORE - {"opensearch", "redis", "tls"} | LOAD_PROFILE:
        assert load_raw()["services"][name]["image"] == f"tenure-service:{version}", name


# ---------------------------------------------- the environment really works


def test_the_pepper_is_required() -> None:
    with pytest.raises(MissingVariable, match="TENURE_AUTH_API_KEY_PEPPER"):
        interpolate(load_raw(), {})
    with pytest.raises(MissingVariable):
        interpolate(load_raw(), {"TENURE_AUTH_API_KEY_PEPPER": ""})


def test_shared_environment_is_a_valid_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _services(resolved())
    environments = {
        name: services[name]["environment"] for name in CORE - {"opensearch", "redis", "tls"} | LOAD_PROFILE
    }
    assert len({json.dumps(env, sort_keys=True) for env in environments.values()}) == 1  # one shared block
    settings = settings_of(environments["api"], monkeypatch)
    assert settings.opensearch_url == "http://opensearch:9200" and settings.redis_url == "redis://redis:6379/0"
    assert settings.auth.api_key_pepper.get_secret_value() == PEPPER
    assert not settings.auth.jwks_url and not settings.loop.upstream_api_key  # empty means "not set"
    # no model provider until the operator sets one: chat answers 503 upstream_not_configured
    assert not settings.loop.upstream_base_url  # empty: not set
    assert settings.auth.jwt_hs256_secret is None  # the development-only HS256 path stays off


def test_worker_consumes_the_queues_the_app_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.extraction.queue import queue_names

    for prefix in (None, "blue"):
        doc = resolved(**({"TENURE_CELERY_QUEUE_PREFIX": prefix} if prefix else {}))
        worker = _services(doc)["worker"]
        settings = settings_of(worker["environment"], monkeypatch)
        command = _command(worker)
        assert set(command[command.index("-Q") + 1].split(",")) == set(queue_names(settings))


def test_the_api_container_holds_its_processes_with_their_caches_full(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _services(resolved())["api"]
    command = _command(api)
    workers = int(command[command.index("--workers") + 1])
    needed = workers * process_budget_mb(settings_of(api["environment"], monkeypatch).recall)
    assert size_mb(api["mem_limit"]) >= needed, f"{workers} API processes may hold {needed:.0f} MB"


def test_commands_point_at_real_entry_points() -> None:
    from service.cli import command_names

    services = _services(resolved())
    assert _command(services["templates"]) == ["tenure", "apply-templates"]
    assert "apply-templates" in command_names()
    api = _command(services["api"])
    assert api[:3] == ["uvicorn", "service.app:create_app", "--factory"] and "--workers" in api
    for name in ("worker", "beat"):
        assert _command(services[name])[:3] == ["celery", "-A", "workers.celery_app:app"]
    from service.app import create_app  # noqa: F401 - the factory uvicorn loads
    from workers.celery_app import app  # noqa: F401 - the app celery loads

    schedule = _command(services["beat"])[_command(services["beat"]).index("--schedule") + 1]
    assert Path(schedule).parent == Path("/var/lib/tenure/beat")


def test_load_profile_commands_parse() -> None:
    import importlib.util

    from loadtest.__main__ import build_parser as load_parser

    services = _services(resolved())
    llm, load = _command(services["llm"]), _command(services["load"])
    assert llm[:3] == ["python", "-m", "loadtest.scripted_llm"] and importlib.util.find_spec("loadtest.scripted_llm")
    assert load[:3] == ["python", "-m", "loadtest"]
    args = load_parser().parse_args(load[3:])
    assert args.url == "http://api:8000" and args.bootstrap
    assert services["load"]["volumes"] == ["load-results:/results"]


def test_compose_only_knobs_carry_no_tenure_prefix() -> None:
    """A TENURE_-prefixed knob would look like a setting that the service then silently ignores."""
    knobs = variables(load_raw()) - environment_names()
    assert knobs and all(not k.startswith("TENURE_") for k in knobs)


# ------------------------------------------------ documented names are real


def _readme_table_names() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return {m for line in section.splitlines() if line.startswith("|") for m in _TENURE_NAME.findall(line)}


def _env_example_names() -> set[str]:
    return set(_TENURE_NAME.findall((ROOT / ".env.example").read_text()))


def test_readme_configuration_table_names_real_settings() -> None:
    names = _readme_table_names()
    assert len(names) >= 10
    assert names - environment_names() == set()


def test_env_example_names_real_settings_and_every_compose_variable() -> None:
    names = _env_example_names()
    assert names - environment_names() == set()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert variables(load_raw()) - documented == set()


def test_operations_guide_names_real_settings() -> None:
    names = set(_TENURE_NAME.findall((ROOT / "docs/operations.md").read_text()))
    assert "TENURE_AUTH_JWKS_CACHE_S" in names
    assert names - environment_names() == set()


# ------------------------------------------------------------ the TLS proxy


def _caddy_env(**overrides: str) -> dict[str, str]:
    environment: dict[str, str] = _services(resolved(**overrides))["tls"]["environment"]
    return environment


def test_the_tls_proxy_serves_the_api_over_https(tmp_path: Path) -> None:
    tls = _services(resolved())["tls"]
    assert "./deploy/caddy/Caddyfile:/etc/caddy/Caddyfile:ro" in tls["volumes"]
    assert set(re.findall(r"\{\$([A-Z_]+)", CADDYFILE.read_text())) == set(tls["environment"])
    adapted = adapted_caddyfile(tmp_path, **_caddy_env())
    server = adapted["apps"]["http"]["servers"]["srv0"]
    assert server["listen"] == [":443"]
    # slow clients: headers in 30 s, the whole request in 120 s (tests/test_tls_proxy_bodies.py)
    assert (server["read_header_timeout"], server["read_timeout"]) == (30e9, 120e9)
    # the proxy keeps passing a body to the API after its answer (tests/test_tls_proxy_bodies.py)
    assert server["enable_full_duplex"] is True
    route = server["routes"][0]
    assert route["match"] == [{"host": ["localhost"]}]
    subroutes = route["handle"][0]["routes"]
    (proxy,) = [h for sub in subroutes for h in sub["handle"] if h["handler"] == "reverse_proxy"]
    assert proxy["upstreams"] == [{"dial": "api:8000"}]
    # a body's first 100 kB are read before the request goes to the API, so a body under that
    # size is whole before the API can answer (a streamed body can lose its answer:
    # tests/test_tls_proxy_bodies.py); a larger one streams on from there
    assert proxy["request_buffers"] == 100_000
    assert proxy["flush_interval"] == -1  # streamed chat answers are not buffered
    # Caddy closes an idle upstream connection before the API does (its floor: MIN_KEEP_ALIVE_S)
    keep_alive = proxy["transport"]["keep_alive"]
    assert keep_alive["idle_timeout"] < MIN_KEEP_ALIVE_S * 1e9, proxy["transport"]
    # and keeps a pool (32 idle connections, TCP probes), which naming `keepalive` reset to Go's
    # 2 connections and no probes in Caddy 2.6
    assert keep_alive["max_idle_conns_per_host"] >= 32 and keep_alive["probe_interval"] > 0, keep_alive
    blocked = subroutes[0]
    assert blocked["match"] == [{"path": ["/metrics"]}] and blocked["handle"][0]["status_code"] == 404
    # the default: a certificate for PUBLIC_HOST from Caddy's internal (self-signed) CA
    policy = adapted["apps"]["tls"]["automation"]["policies"][0]
    assert policy["issuers"] == [{"module": "internal"}]


def test_the_tls_image_is_the_caddy_release_the_tests_run() -> None:
    """docker-compose.yml's proxy is the release scripts/build-caddy.sh builds for the tests and the
    compose check (go.mod), so what CI checks the Caddyfile with is what operators run."""
    from deploy.compose_check import caddy_release, pinned_caddy

    release = caddy_release()
    assert _services(resolved())["tls"]["image"] == f"caddy:{release.removeprefix('v')}"
    assert subprocess.run([pinned_caddy(), "version"], capture_output=True, text=True).stdout.startswith(release)


def test_the_host_networked_caddyfile_sends_every_request_to_the_apis_loopback_port() -> None:
    from deploy.compose_check import local_caddyfile

    ports = {"CADDY_ADMIN_PORT": "1", "HTTP_PORT": "2", "HTTPS_PORT": "3", "API_PORT": "4567"}
    text = local_caddyfile(ports)
    assert "api:8000" not in text
    directives = re.findall(r"^\s*reverse_proxy .*\{$", text, flags=re.MULTILINE)
    assert [d.strip() for d in directives] == ["reverse_proxy 127.0.0.1:4567 {"], directives


def test_real_certificates_are_one_setting(tmp_path: Path) -> None:
    own_files = _caddy_env(TLS_CERTIFICATES="/certs/tls.crt /certs/tls.key", PUBLIC_HOST="t.example")
    own = adapted_caddyfile(tmp_path, **own_files)
    assert own["apps"]["tls"]["certificates"]["load_files"][0]["certificate"] == "/certs/tls.crt"
    assert own["apps"]["http"]["servers"]["srv0"]["routes"][0]["match"] == [{"host": ["t.example"]}]
    acme = adapted_caddyfile(tmp_path, **_caddy_env(TLS_CERTIFICATES="ops@example.com", PUBLIC_HOST="t.example"))
    issuers = acme["apps"]["tls"]["automation"]["policies"][0]["issuers"]
    assert {i["module"] for i in issuers} >= {"acme"} and issuers[0]["email"] == "ops@example.com"


def test_the_service_image_carries_the_query_analysis_the_dev_node_builds() -> None:
    """deploy/Dockerfile's analysis stage runs deploy/opensearch/build.sh over every file that
    script stamps (so the image holds the dev node's jars and classes, at pom.xml's version), the
    final image points the setting the API reads at what it copied, and the compose check builds
    the image again when any of those files changes."""
    from deploy.compose_check import SERVICE_INPUTS, SERVICE_INPUTS_LATE

    stamped = re.search(r"stamp=\$\(cat ([^|]+)\|", (ROOT / "deploy/opensearch/build.sh").read_text())
    assert stamped is not None
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    analysis_stage = dockerfile.split("AS analysis", 1)[1].split("\nFROM ", 1)[0]
    for name in stamped.group(1).split():
        assert f"deploy/opensearch/{name}" in analysis_stage, name
        assert f"deploy/opensearch/{name}" in (*SERVICE_INPUTS, *SERVICE_INPUTS_LATE), name
    assert "bash build.sh" in analysis_stage
    assert "COPY --from=analysis /build/lib /opt/tenure-analysis/lib" in dockerfile
    assert "COPY --from=analysis /build/classes /opt/tenure-analysis/classes" in dockerfile
    setting = re.search(r"(TENURE_RECALL_ANALYSIS_CLASSPATH)=(\S+)", dockerfile)
    assert setting is not None and setting.group(1) in environment_names()
    assert setting.group(2).split(":") == ["/opt/tenure-analysis/lib/*", "/opt/tenure-analysis/classes"]
    assert "openjdk-17-jre-headless" in dockerfile.rsplit("\nFROM ", 1)[1]  # the runtime JPype starts


def test_a_failed_compose_load_keeps_the_proxys_faults_not_its_4xx_access_lines() -> None:
    """Caddy logs every 4xx access at level error: a run's expected 429s must not crowd out the
    line that explains a dropped answer (found when a compose run lost two recalls)."""
    from deploy.compose_check import is_api_error, is_proxy_error

    def access(status: int) -> str:
        return json.dumps(
            {"level": "error", "logger": "http.log.access.log0", "msg": "handled request", "status": status}
        )

    aborted = json.dumps(
        {"level": "error", "logger": "http.handlers.reverse_proxy", "msg": "aborting with incomplete response"}
    )
    assert is_proxy_error(aborted)
    assert is_proxy_error(access(502))
    assert not is_proxy_error(access(429))
    assert not is_proxy_error(json.dumps({"level": "info", "logger": "http.log.access.log0", "status": 200}))
    assert not is_proxy_error("not json at all")
    assert not is_proxy_error("[1, 2]")
    assert is_api_error('{"level": "ERROR", "message": "Exception in ASGI application"}')
    assert is_api_error('{"level": "INFO", "logger": "uvicorn.error", "message": "Child process [42] died"}')
    assert not is_api_error('{"level": "INFO", "message": "request served"}')
