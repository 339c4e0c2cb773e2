"""``GET /v1/models`` for OpenAI-compatible tools: the upstream's list, else the configured ids.

Many tools call it before anything else and refuse to start on a 404. The upstream is asked with
the tenant's upstream credentials (never the caller's); when it has no list, fails, or none is
configured, the answer is ``TENURE_LOOP_MODELS`` in the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from service.config import MemoryLoopSettings
from service.proxy.upstream import Upstream, UpstreamFailure

log = logging.getLogger(__name__)
LIST_TIMEOUT_S = 10.0


def configured(policy: MemoryLoopSettings) -> list[dict[str, Any]]:
    return [{"id": model, "object": "model", "created": 0, "owned_by": "tenure"} for model in policy.models]


async def list_models(upstream: Upstream, policy: MemoryLoopSettings, tenant_id: str) -> dict[str, Any]:
    data = await _from_upstream(upstream, tenant_id)
    if not data:
        data = configured(policy)
    return {"object": "list", "data": data}


async def _from_upstream(upstream: Upstream, tenant_id: str) -> list[dict[str, Any]]:
    try:
        target = upstream.target(tenant_id)
    except UpstreamFailure:
        return []  # no upstream for this tenant: the configured list
    try:
        body = await upstream.get_json(target, "/models", timeout_s=LIST_TIMEOUT_S)
    except UpstreamFailure as exc:  # unreachable, invalid JSON, an answer too large
        log.info("upstream model list unavailable for %s: %s", tenant_id, exc)
        return []
    items = body.get("data") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return []
    return [m for m in items if isinstance(m, dict) and isinstance(m.get("id"), str)]
