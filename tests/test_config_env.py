"""``environment_names()``: the env names the settings read, derived from the models themselves."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from service.config import CliSettings, Settings, environment_names


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("TENURE_REDIS_URL", "redis://cache:6379/2", lambda s: s.redis_url),
        ("TENURE_OPENSEARCH_NAMESPACE", "prod", lambda s: s.opensearch_namespace),
        ("TENURE_RECALL_MAX_BELIEFS", "7", lambda s: s.recall.max_beliefs),
        ("TENURE_RECALL__MAX_BELIEFS", "8", lambda s: s.recall.max_beliefs),
        ("TENURE_API_RATE_LIMIT_PER_S", "3.5", lambda s: s.api.rate_limit_per_s),
        ("TENURE_AUTH_JWKS_URL", "https://idp.example/jwks.json", lambda s: s.auth.jwks_url),
        ("TENURE_LOOP__UPSTREAM_BASE_URL", "http://llm:8081/v1", lambda s: s.loop.upstream_base_url),
        ("TENURE_CELERY_QUEUE_PREFIX", "blue", lambda s: s.celery.queue_prefix),
    ],
)
def test_listed_names_are_really_read(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, read: Callable[[Settings], object]
) -> None:
    assert name in environment_names()
    monkeypatch.setenv(name, value)
    got = read(Settings(_env_file=None))  # type: ignore[call-arg]
    assert str(got) == value


def test_cli_names_are_listed_and_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"TENURE_CLI_URL", "TENURE_CLI_KEY", "TENURE_CLI_TIMEOUT_S"} <= environment_names()
    monkeypatch.setenv("TENURE_CLI_URL", "http://api:8000")
    assert CliSettings().url == "http://api:8000"


@pytest.mark.parametrize(
    "name",
    [
        "TENURE_RECAL_MAX_BELIEFS",  # misspelled prefix
        "TENURE_RECALL_MAX_BELIEF",  # misspelled field
        "TENURE_API_WORKERS",  # a compose knob, not a setting: the API would ignore it
        "TENURE_MAX_BELIEFS",  # a nested field without its section
        "TENURE_RECALL___MAX_BELIEFS",  # wrong delimiter
    ],
)
def test_names_the_settings_ignore_are_not_listed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    assert name not in environment_names()
    # and they really are ignored: the value does not reach the settings
    monkeypatch.setenv(name, "7")
    assert Settings(_env_file=None).recall.max_beliefs == 20  # type: ignore[call-arg]


def test_every_field_of_every_section_is_covered() -> None:
    names = environment_names()
    sections = {"recall": "RECALL", "loop": "LOOP", "celery": "CELERY", "auth": "AUTH", "api": "API"}
    for field, section in sections.items():
        nested = type(getattr(Settings(_env_file=None), field))  # type: ignore[call-arg]
        for sub in nested.model_fields:
            assert f"TENURE_{section}_{sub.upper()}" in names
            assert f"TENURE_{section}__{sub.upper()}" in names


FAMILIES = '[{"name": "llama", "detect": "^llama-", "floor": "3.1", "tier": 1}]'


@pytest.mark.parametrize(
    "name",
    [
        "TENURE_LOOP_MODEL_FAMILIES",
        "TENURE_LOOP__MODEL_FAMILIES",
        "TENURE_LOOP_TIER_FAMILIES",  # the old name (before "tier" meant only recall tiers)
        "TENURE_LOOP__TIER_FAMILIES",
    ],
)
def test_model_families_are_read_under_the_new_and_the_old_name(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    assert name in environment_names()
    monkeypatch.setenv(name, FAMILIES)
    families = Settings(_env_file=None).loop.model_families  # type: ignore[call-arg]
    assert [(f.name, f.floor, f.grade) for f in families] == [("llama", "3.1", 1)]


@pytest.mark.parametrize(
    "name",
    [
        "TENURE_LOOP_STRICT_MODEL_GATE",
        "TENURE_LOOP__STRICT_MODEL_GATE",
        "TENURE_LOOP_STRICT_MODEL_TIERS",  # the old name
        "TENURE_LOOP__STRICT_MODEL_TIERS",
    ],
)
def test_strict_model_gate_is_read_under_the_new_and_the_old_name(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    assert name in environment_names()
    assert Settings(_env_file=None).loop.strict_model_gate is False  # type: ignore[call-arg]
    monkeypatch.setenv(name, "true")
    assert Settings(_env_file=None).loop.strict_model_gate is True  # type: ignore[call-arg]


def test_the_new_name_wins_over_the_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENURE_LOOP_STRICT_MODEL_TIERS", "true")
    monkeypatch.setenv("TENURE_LOOP_STRICT_MODEL_GATE", "false")
    assert Settings(_env_file=None).loop.strict_model_gate is False  # type: ignore[call-arg]


@pytest.mark.parametrize("key", ["strict_model_gate", "strict_model_tiers"])
def test_a_tenants_strict_gate_under_the_new_and_the_old_key(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    monkeypatch.setenv("TENURE_LOOP_TENANTS", json.dumps({"t1": {key: True}}))
    loop = Settings(_env_file=None).loop  # type: ignore[call-arg]
    assert loop.for_tenant("t1").strict_model_gate is True
    assert loop.for_tenant("t2").strict_model_gate is None
