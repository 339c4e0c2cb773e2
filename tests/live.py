"""An app under a real uvicorn on a free loopback port, for clients that must talk HTTP to it
(the official SDKs, MCP clients): ``with serve(app) as url: ...``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from service.api.http_protocol import JsonErrorHttpProtocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serve(
    app: FastAPI,
    timeout_s: float = 30.0,
    *,
    port: int | None = None,
    http: type[JsonErrorHttpProtocol] = JsonErrorHttpProtocol,
) -> Iterator[str]:
    """Run ``app`` (its lifespan on) until the block ends, on ``port`` (a free one by default);
    yields its base URL. ``http``: the service's protocol class or a subclass (a test's timeouts)."""
    port = port or free_port()
    # served as in production: the service's protocol class (JSON 400s, the keep-alive floor)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", http=http)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
