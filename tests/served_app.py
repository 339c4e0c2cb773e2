"""A small ASGI app module served by a real uvicorn process with the service's HTTP protocol
class, for tests of what only the HTTP server sees (timeouts, body limits, framing)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from deploy.localstack import REPO, wait_until
from service.api.http_protocol import uvicorn_http_option


def wait_until_serving(connect: Callable[[], socket.socket], process: subprocess.Popen[bytes], name: str) -> None:
    """Until ``connect`` succeeds, as long as ``process`` is alive (30 s at most)."""

    def serving() -> bool:
        assert process.poll() is None, f"{name} exited"
        try:
            connect().close()
        except OSError:
            return False
        return True

    wait_until(serving, 30, f"{name} serving")


@contextmanager
def uvicorn_serving(
    home: Path,
    source: str,
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
) -> Iterator[None]:
    """``source`` as the module ``served_app_module`` in ``home``, its ``app`` served on ``port``
    by uvicorn with the service's protocol class (``env`` added to the environment, ``options``
    to uvicorn's command line; its log in ``home/uvicorn.log``), until the block ends."""
    (home / "served_app_module.py").write_text(source)
    serve = [sys.executable, "-m", "uvicorn", "served_app_module:app", "--port", str(port)]
    serve += ["--http", uvicorn_http_option(), "--log-level", "warning", *options]
    environment = {**os.environ, "PYTHONPATH": f"{home}{os.pathsep}{REPO}", **(env or {})}
    with (home / "uvicorn.log").open("w") as log:
        api = subprocess.Popen(serve, env=environment, cwd=home, stderr=log)
    try:
        wait_until_serving(lambda: socket.create_connection(("127.0.0.1", port), timeout=1), api, "the API")
        yield
    finally:
        api.terminate()
        api.wait(timeout=10)
