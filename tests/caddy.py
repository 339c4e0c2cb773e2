"""deploy/caddy/Caddyfile as the real Caddy parses it, for the tests of the TLS proxy."""

from __future__ import annotations

import functools
import json
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deploy.compose_check import local_caddyfile, pinned_caddy
from deploy.devstack import free_port
from tests.served_app import wait_until_serving

CADDYFILE = Path(__file__).resolve().parents[1] / "deploy/caddy/Caddyfile"


@functools.cache
def caddy_binary() -> str:
    """The Caddy the compose file's image pins, as scripts/build-caddy.sh built it."""
    return str(pinned_caddy())


def adapted_caddyfile(home: Path, **env: str) -> dict[str, Any]:
    """The Caddyfile as Caddy itself parses it (``caddy adapt``), with ``env`` as the compose
    environment and ``home`` as Caddy's home."""
    run = subprocess.run(
        [caddy_binary(), "adapt", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        check=True,
        cwd=home,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
    )
    adapted: dict[str, Any] = json.loads(run.stdout)
    return adapted


@contextmanager
def tls_proxy(home: Path, api_port: int) -> Iterator[tuple[int, int]]:
    """The compose stack's TLS proxy (every port on loopback, as compose_check runs it) in front of
    the API at ``api_port`` (running or not); yields its HTTP and HTTPS ports once both serve. Its
    site is ``localhost``, with a certificate of Caddy's internal CA (:func:`caddy_trust`)."""
    ports = {name: str(free_port()) for name in ("CADDY_ADMIN_PORT", "HTTP_PORT", "HTTPS_PORT")}
    ports["API_PORT"] = str(api_port)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}
    env |= {"PUBLIC_HOST": "localhost", "TLS_CERTIFICATES": "internal"}
    (home / "Caddyfile").write_text(local_caddyfile(ports))
    with (home / "caddy.log").open("w") as log:
        run = [caddy_binary(), "run", "--config", str(home / "Caddyfile"), "--adapter", "caddyfile"]
        process = subprocess.Popen(run, env=env, stderr=log)
    http_port, https_port = int(ports["HTTP_PORT"]), int(ports["HTTPS_PORT"])
    try:
        wait_until_serving(lambda: socket.create_connection(("127.0.0.1", http_port), timeout=1), process, "caddy")
        wait_until_serving(lambda: _handshake(home, https_port), process, "caddy over TLS")
        yield http_port, https_port
    finally:
        process.terminate()
        process.wait(timeout=10)


def caddy_trust(home: Path) -> ssl.SSLContext:
    """A context trusting the internal CA of the Caddy :func:`tls_proxy` runs in ``home`` (what
    README's ``curl --cacert tenure-root.crt`` does)."""
    return ssl.create_default_context(cafile=str(home / "caddy/pki/authorities/local/root.crt"))


def _handshake(home: Path, port: int) -> ssl.SSLSocket:
    """A verified TLS connection to ``localhost``; OSError (ssl.SSLError, FileNotFoundError
    included) until Caddy has made its CA and the site's certificate."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=1)
    try:
        return caddy_trust(home).wrap_socket(connection, server_hostname="localhost")
    except OSError:
        connection.close()
        raise
