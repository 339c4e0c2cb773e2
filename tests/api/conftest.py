"""API test fixtures: one app (real OpenSearch + Redis from the session fixtures) for the session,
an operator credential from the bootstrap step, and :func:`make_team` to provision a fresh tenant
with two members and an admin over HTTP for each test."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import ECKey, Key, OctKey, RSAKey
from opensearchpy import OpenSearch
from pydantic import SecretStr

from service.api.state import Services
from service.app import create_app
from service.config import ApiSettings, AuthSettings, Settings
from service.storage.templates import FAMILIES, drop_namespace

HS_SECRET = "test-hs256-secret-with-enough-entropy-0123456789"


def sign_jwt(header: dict[str, Any], claims: dict[str, Any], key: Key | bytes) -> str:
    """A JWT as an identity provider (or an attacker holding ``key``) would make it."""
    material = OctKey.import_key(key) if isinstance(key, bytes) else key
    return jwt.encode(header, claims, material, algorithms=[str(header["alg"])])


@dataclass(frozen=True)
class SigningKeys:
    rsa: Any
    ec: Any
    jwks_path: Path


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> SigningKeys:
    rsa = RSAKey.generate_key(2048, {"kid": "rsa-1"})
    ec = ECKey.generate_key("P-256", {"kid": "ec-1"})
    path = Path(tmp_path_factory.mktemp("jwks")) / "jwks.json"
    path.write_text(json.dumps({"keys": [rsa.as_dict(private=False), ec.as_dict(private=False)]}))
    return SigningKeys(rsa=rsa, ec=ec, jwks_path=path)


@pytest.fixture(scope="session")
def api_settings(settings: Settings, signing_keys: SigningKeys) -> Settings:
    return settings.model_copy(
        update={
            "auth": AuthSettings(
                jwt_hs256_secret=SecretStr(HS_SECRET),
                jwks_file=str(signing_keys.jwks_path),
                jwt_algorithms=["RS256", "ES256", "HS256"],
                api_key_pepper=SecretStr("test-pepper"),
            ),
            # Tests fire requests far faster than any client: the limiter runs (one script call
            # per request) with a budget they cannot exhaust; test_rate_limit.py uses a small one.
            "api": ApiSettings(
                write_refresh="true",
                max_body_bytes=200_000,
                rate_limit_per_s=100_000,
                rate_limit_burst=1_000_000,
                tenant_rate_limit_per_s=1_000_000,
                tenant_rate_limit_burst=10_000_000,
                failed_auth_per_s=100_000,
                failed_auth_burst=1_000_000,
            ),
        }
    )


@pytest.fixture(scope="session")
def app(api_settings: Settings, os_client: OpenSearch) -> FastAPI:
    return create_app(api_settings)


@pytest.fixture(scope="session")
def client(app: FastAPI, os_client: OpenSearch, api_settings: Settings) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client
    drop_namespace(os_client, api_settings.opensearch_namespace, FAMILIES)


@pytest.fixture(scope="session")
def services(client: TestClient, app: FastAPI) -> Services:
    services: Services = app.state.services
    return services


@pytest.fixture(scope="module")
def second(api_settings: Settings, client: TestClient) -> Iterator[TestClient]:
    """Another API process of the same deployment (the same indices and Redis): its own caches,
    empty when the module starts."""
    with TestClient(create_app(api_settings)) as test_client:
        yield test_client


def services_of(app_client: TestClient) -> Services:
    """The services of the app ``app_client`` serves."""
    services: Services = app_client.app.state.services  # type: ignore[attr-defined]
    return services


@pytest.fixture(scope="session")
def operator_key(services: Services) -> str:
    """The bootstrap step's operator key."""
    return services.provisioning.bootstrap().plaintext


@pytest.fixture(scope="session")
def operator(operator_key: str) -> dict[str, str]:
    """The bootstrap step's operator key, as an Authorization header."""
    return auth(operator_key)


def auth(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def without_ids(value: Any) -> Any:
    """An answer without what differs between two calls (request and receipt ids)."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in {"request_id", "receipt_id"}}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


@dataclass
class Team:
    """A fresh tenant: alice and bob share project ``pay`` (alice also team ``core``), carol is the
    tenant admin; each has an API key."""

    tenant: str
    keys: dict[str, str]

    def h(self, user: str) -> dict[str, str]:
        return auth(self.keys[user])


USERS: dict[str, dict[str, Any]] = {
    "alice": {"projects": ["pay"], "teams": ["core"]},
    "bob": {"projects": ["pay"]},
    "carol": {"roles": ["admin"], "projects": ["pay"]},
}


def make_team(client: TestClient, operator: dict[str, str], tenant: str | None = None) -> Team:
    tenant = tenant or f"t-{uuid.uuid4().hex[:10]}"
    ok(client.post("/v1/admin/tenants", json={"tenant_id": tenant, "name": tenant}, headers=operator), 201)
    keys: dict[str, str] = {}
    for user, grants in USERS.items():
        ok(client.post(f"/v1/admin/tenants/{tenant}/users", json={"user_id": user, **grants}, headers=operator), 201)
        issued = ok(
            client.post(f"/v1/admin/tenants/{tenant}/users/{user}/keys", json={"name": "test"}, headers=operator), 201
        )
        keys[user] = issued["key"]
    return Team(tenant=tenant, keys=keys)


@pytest.fixture
def team(client: TestClient, operator: dict[str, str]) -> Team:
    return make_team(client, operator)


@pytest.fixture
def other_team(client: TestClient, operator: dict[str, str]) -> Team:
    return make_team(client, operator)


def recallable_name(prefix: str) -> str:
    """A fresh canonical name a recall finds by its words: the random part starts with a letter,
    since the query clean-up drops numbers (paper §3.5) and six hex digits are all digits one time
    in seventeen (``lean_116795`` is recalled by ``lean`` alone, i.e. not at all)."""
    return f"{prefix}_x{uuid.uuid4().hex[:6]}"


def belief_body(name: str, scope: str = "domain:code", **extra: Any) -> dict[str, Any]:
    return {
        "type": "preference",
        "canonical_name": name,
        "aliases": [name.replace("_", " ")],
        "content": f"Content of {name}.",
        "why_it_matters": f"Shapes answers about {name}.",
        "scope": [scope],
        **extra,
    }


class RequestLog:
    """The (method, url) of every request the app's OpenSearch clients send, sync and async."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def recall_requests(self) -> list[str]:
        """The requests recall itself sends: analysis, the tiers, the beliefs index (not the
        receipt drainer's writes to the audit index)."""
        return [url for _, url in self.sent if "_mtermvectors" in url or "_msearch" in url or "beliefs" in url]

    def wrap(self, monkeypatch: pytest.MonkeyPatch, transport: Any, *, asynchronous: bool) -> None:
        original = transport.perform_request

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.sent.append((method, url))
            return original(method, url, *args, **kwargs)

        async def acounted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.sent.append((method, url))
            return await original(method, url, *args, **kwargs)

        monkeypatch.setattr(transport, "perform_request", acounted if asynchronous else counted)


@pytest.fixture
def requests_log(services: Services, monkeypatch: pytest.MonkeyPatch) -> RequestLog:
    log = RequestLog()
    log.wrap(monkeypatch, services.opensearch.transport, asynchronous=False)
    bound = services.recall.async_client
    if bound is not None:
        log.wrap(monkeypatch, bound.client.transport, asynchronous=True)
    return log
