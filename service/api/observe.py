"""Per-request metrics and the access log line, recorded once the response has gone out.

The route label is the matched route's *template* (``/v1/beliefs/{belief_id}``), never the raw
path, so the metric's cardinality is bounded by the API's routes; a request no route matched
counts as ``unmatched``. Health probes and scrapes (every few seconds from compose, Kubernetes and
Prometheus) log at DEBUG, so an idle stack stays quiet at INFO.
"""

from __future__ import annotations

import logging

from starlette.types import Scope

from service.auth import keys
from service.telemetry import metrics
from service.telemetry.context import WorkContext

access_log = logging.getLogger("tenure.access")
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


def route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str) and path:
        return path
    root = scope.get("root_path") or ""
    return f"{root}/*" if root else "unmatched"  # a mounted app (MCP, console assets)


def observe_request(scope: Scope, status: int, work: WorkContext) -> None:
    route = route_of(scope)
    method = str(scope.get("method", ""))
    latency_ms = work.elapsed_ms()
    metrics.HTTP_LATENCY.labels(method, route, str(status)).observe(latency_ms / 1000)
    level = logging.DEBUG if route in PROBES else logging.INFO
    if access_log.isEnabledFor(level):
        access_log.log(
            level,
            "%s %s %d",
            method,
            keys.redacted(str(scope.get("path", ""))),  # a client may put a whole API key in a path
            status,
            extra={
                "request_id": work.request_id,
                "tenant_id": work.tenant_id,
                "latency_ms": latency_ms,
                "method": method,
                "route": route,
                "status": status,
            },
        )
