"""One HTTP call as the load test sees it: a status or an error kind, the body, the latency."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

ERROR_KINDS = ("timeout", "connect", "other")


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None when no HTTP answer arrived
    kind: str  # the status as text ("201", "503") or an error kind ("timeout", "connect", "other")
    body: Any
    latency_ms: float

    def is_status(self, *expected: int) -> bool:
        return self.status in expected


def error_kind(exc: Exception) -> str:
    """Classify a transport failure: fault drills tell a hung server (timeout) from a dead one."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    return "other"


def make_client(timeout_s: float, connections: int) -> httpx.AsyncClient:
    """A shared keep-alive pool: one connection per simulated in-flight request at most."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    key: str,
    *,
    json: Any = None,
    params: Any = None,
    started: float | None = None,
) -> Outcome:
    """Send one request; ``started`` (a ``perf_counter`` value) backdates the latency to when the
    request was due, so an open-model run does not hide client-side queueing."""
    t0 = started if started is not None else time.perf_counter()
    try:
        response = await client.request(
            method, url, json=json, params=params, headers={"Authorization": f"Bearer {key}"}
        )
    except httpx.HTTPError as exc:
        return Outcome(None, error_kind(exc), None, (time.perf_counter() - t0) * 1000)
    latency_ms = (time.perf_counter() - t0) * 1000
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return Outcome(response.status_code, str(response.status_code), body, latency_ms)
