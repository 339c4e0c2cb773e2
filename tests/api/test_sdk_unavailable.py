"""While the API restarts behind the TLS proxy (deploy/caddy/Caddyfile, the real Caddy), the proxy
answers 502: the SDK raised it at once although it resends a read after a 503. A read (a GET,
and the POSTs documented as safe to resend: recall) is now resent after a 502, 503 or 504 within
``max_retries``; a write that is not safe to resend is still sent once, since a proxy's 502 can
come after the API did it. A request that never reached a server (the connection was refused)
is resent whatever it is.

The API is the real app under uvicorn (real OpenSearch and Redis), started when the first 502
(or, straight to its port, the first refused request) shows it is down, as a restart ends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from tenure_client import AsyncTenure, ServiceUnavailable, Tenure

from deploy.devstack import free_port
from service.app import create_app
from service.config import Settings
from tests.api.conftest import Team, belief_body, recallable_name
from tests.caddy import caddy_trust, tls_proxy
from tests.live import serve


class Restarting:
    """The API on ``port``, down until :meth:`start` (idempotent); :meth:`stop` takes it down
    again. Every status the client saw, in order, in ``statuses``."""

    def __init__(self, settings: Settings, port: int, stack: ExitStack):
        self.settings, self.port, self.stack = settings, port, stack
        self.running: ExitStack | None = None
        self.statuses: list[int] = []

    def start(self) -> None:
        if self.running is None:
            self.running = ExitStack()
            self.running.enter_context(serve(create_app(self.settings), port=self.port))
            self.stack.callback(self.stop)

    def stop(self) -> None:
        if self.running is not None:
            self.running.close()
            self.running = None

    def on_response(self, response: httpx.Response) -> None:
        """The client's response hook: a 502 is the proxy saying the API is down; it comes up now."""
        self.statuses.append(response.status_code)
        if response.status_code == 502:
            self.start()


@pytest.fixture
def behind_proxy(api_settings: Settings, client: TestClient, tmp_path: Path) -> Iterator[tuple[str, Restarting, Path]]:
    """The proxy's ``https://`` URL, the API behind it (down), and the proxy's home."""
    port = free_port()
    with ExitStack() as stack, tls_proxy(tmp_path, port) as (_, https_port):
        yield f"https://localhost:{https_port}", Restarting(api_settings, port, stack), tmp_path


@contextmanager
def _sdk(url: str, key: str, api: Restarting, home: Path) -> Iterator[Tenure]:
    """The SDK over an httpx client that trusts the proxy's CA and brings the API up on a 502."""
    hooks: dict[str, list[Callable[..., object]]] = {"response": [api.on_response]}
    with (
        httpx.Client(base_url=url, verify=caddy_trust(home), event_hooks=hooks) as http,
        Tenure(url, key, http_client=http, max_retry_wait_s=0.05) as sdk,
    ):
        yield sdk


def test_reads_are_resent_after_the_proxys_502_while_the_api_restarts(
    behind_proxy: tuple[str, Restarting, Path], team: Team
) -> None:
    url, api, home = behind_proxy
    name = recallable_name("restart")
    with _sdk(url, team.keys["alice"], api, home) as alice:
        assert alice.whoami().user_id == "alice"  # GET
        assert api.statuses == [502, 200]
        created = alice.beliefs.create(**belief_body(name, "project:pay"))
        api.stop()
        api.statuses.clear()
        recalled = alice.recall(name.replace("_", " "), scopes=["project:pay"])  # a POST safe to resend
        assert api.statuses == [502, 200] and created.id in recalled.injected_ids
        api.stop()
        api.statuses.clear()
        assert [b.id for b in alice.beliefs.export(scope=["project:pay"])] == [created.id]  # a streamed GET
        assert api.statuses == [502, 200]


def test_the_async_client_resends_a_read_after_a_502(behind_proxy: tuple[str, Restarting, Path], team: Team) -> None:
    url, api, home = behind_proxy

    async def started(response: httpx.Response) -> None:
        api.on_response(response)  # blocks the loop while the API starts: nothing else runs meanwhile

    async def scenario() -> str:
        hooks: dict[str, list[Callable[..., object]]] = {"response": [started]}
        async with (
            httpx.AsyncClient(base_url=url, verify=caddy_trust(home), event_hooks=hooks) as http,
            AsyncTenure(url, team.keys["bob"], http_client=http, max_retry_wait_s=0.05) as bob,
        ):
            return (await bob.whoami()).user_id

    assert asyncio.run(scenario()) == "bob"
    assert api.statuses == [502, 200]


def test_a_write_not_safe_to_resend_is_sent_once_on_a_502(
    behind_proxy: tuple[str, Restarting, Path], team: Team
) -> None:
    url, api, home = behind_proxy
    with _sdk(url, team.keys["alice"], api, home) as alice, pytest.raises(ServiceUnavailable) as refused:
        alice.beliefs.supersede("b-anything", content="Sessions live in Valkey.")
    assert refused.value.status == 502 and api.statuses == [502]


def test_a_write_that_never_reached_the_api_is_sent_again(
    api_settings: Settings, client: TestClient, team: Team
) -> None:
    """A refused connection: nothing was sent, so even a supersede goes again (once the API is up)."""
    port = free_port()
    with ExitStack() as stack:
        api = Restarting(api_settings, port, stack)
        tries: list[str] = []

        def second_try_finds_it_up(request: httpx.Request) -> None:
            tries.append(request.method)
            if len(tries) == 2:
                api.start()

        url = f"http://127.0.0.1:{port}"
        with (
            httpx.Client(base_url=url, event_hooks={"request": [second_try_finds_it_up]}) as http,
            Tenure(url, team.keys["alice"], http_client=http, max_retry_wait_s=0.05) as alice,
        ):
            old = alice.beliefs.create(**belief_body(f"refused_{uuid.uuid4().hex[:8]}", "project:pay"))
            tries.clear()
            api.stop()
            result = alice.beliefs.supersede(old.id or "", content="Sessions live in Valkey.")
            assert tries == ["POST", "POST"] and result.current.content == "Sessions live in Valkey."
