"""The SDK and the CLI sent to the TLS proxy's plain-HTTP port (deploy/caddy/Caddyfile, run by the
real Caddy in front of the app under uvicorn, real OpenSearch and Redis), where every request is
answered with a redirect to HTTPS: a user who typed ``http://`` got pydantic's ValidationError (the
SDK read the redirect's empty body as an answer) and the CLI a Python traceback; now both say the
answer is a redirect and where it points, and the credential follows no redirect."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from tenure_client import AsyncTenure, Tenure, UnexpectedAnswer

from service.app import create_app
from service.cli import main
from service.config import Settings
from tests.api.conftest import Team
from tests.caddy import tls_proxy
from tests.live import serve


@pytest.fixture
def plain_http_url(api_settings: Settings, client: TestClient, tmp_path: Path) -> Iterator[str]:
    """The proxy's ``http://`` URL (it redirects to ``https://localhost/...``)."""
    with serve(create_app(api_settings)) as api_url, tls_proxy(tmp_path, httpx.URL(api_url).port or 0) as ports:
        yield f"http://localhost:{ports[0]}"


def test_a_redirect_is_an_unexpected_answer_naming_its_target(plain_http_url: str, team: Team) -> None:
    url = plain_http_url
    with Tenure(url, team.keys["alice"], max_retries=0) as alice:
        with pytest.raises(UnexpectedAnswer) as redirected:
            alice.whoami()
        assert redirected.value.status in (301, 302, 307, 308) and redirected.value.code == "unexpected_answer"
        assert redirected.value.details == {"location": "https://localhost/v1/whoami"}
        assert "https://localhost/v1/whoami" in str(redirected.value)
        with pytest.raises(UnexpectedAnswer):
            list(alice.beliefs.export())

    async def scenario() -> None:
        async with AsyncTenure(url, team.keys["bob"], max_retries=0) as bob:
            with pytest.raises(UnexpectedAnswer):
                await bob.beliefs.get("b-anything")
            with pytest.raises(UnexpectedAnswer):
                [b async for b in bob.beliefs.export()]

    asyncio.run(scenario())


def test_the_cli_says_where_the_redirect_points_without_a_traceback(plain_http_url: str, team: Team) -> None:
    url = plain_http_url
    for command in (["whoami"], ["list"], ["export"]):
        out, err = io.StringIO(), io.StringIO()
        code = main(["--url", url, "--key", team.keys["alice"], "--json", *command], out=out, err=err)
        assert code == 1, (command, out.getvalue(), err.getvalue())
        assert "unexpected_answer" in err.getvalue() and "https://localhost/" in err.getvalue()
        assert "Traceback" not in out.getvalue() + err.getvalue()
