"""OpenSearch client construction and error translation.

Clients are created by the app lifespan / worker init, never at import time. opensearch-py's
failures are mapped to the service's errors in one place, :func:`translate_errors`: a 404 or 409
that means something to the caller (a missing document, a stale version, an id that exists)
becomes :class:`NotFound` / :class:`Conflict` there, when the caller names what it means; storage
code catches those, never an opensearch-py status.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import urllib3
from opensearchpy import AsyncConnection, AsyncOpenSearch, JSONSerializer, OpenSearch, Urllib3HttpConnection
from opensearchpy import exceptions as os_exc
from opensearchpy.connection.base import Connection
from opensearchpy.exceptions import SerializationError

from service.config import Settings
from service.errors import Conflict, NotFound, StoreUnavailable, TenureError, ValidationFailed
from service.storage.keepalive import KeepAliveConnection
from service.telemetry import metrics

log = logging.getLogger(__name__)


class FastJSONSerializer(JSONSerializer):
    """orjson for the recall hot path: decoding an _msearch response is ~3x faster than json."""

    def loads(self, s: str) -> Any:
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError as exc:
            raise SerializationError(s, exc) from exc

    def dumps(self, data: Any) -> Any:
        if isinstance(data, str):
            return data
        try:
            return orjson.dumps(data, default=self.default).decode()
        except TypeError as exc:
            raise SerializationError(data, exc) from exc


class _CountsNodeFailures(Connection):
    """Counts the requests a node did not answer, and times every request by node, for both of
    opensearch-py's connections.

    With several nodes (a cluster), a request that cannot reach one is retried on the next and
    the dead node rests, so the caller never sees an error: without this count a lost node would
    be visible only in opensearch-py's WARNING lines. A node that answers, but slowly, is seen in
    the per-node latency."""

    @functools.cached_property
    def _latency(self) -> Any:
        """This node's latency histogram (``labels()`` takes a lock and a lookup per call)."""
        return metrics.OPENSEARCH_NODE_LATENCY.labels(self.host)

    def log_request_success(
        self,
        method: str,
        full_url: str,
        path: str,
        body: Any,
        status_code: int,
        response: str,
        duration: float,
    ) -> None:
        self._latency.observe(duration)
        super().log_request_success(method, full_url, path, body, status_code, response, duration)

    def log_request_fail(
        self,
        method: str,
        full_url: str,
        path: str,
        body: Any,
        duration: float,
        status_code: int | None = None,
        response: str | None = None,
        exception: Exception | None = None,
    ) -> None:
        self._latency.observe(duration)
        if status_code is None:  # no HTTP answer at all: the node is down or unreachable
            metrics.OPENSEARCH_NODE_FAILURES.labels(self.host).inc()
        super().log_request_fail(method, full_url, path, body, duration, status_code, response, exception)


class ObservedConnection(_CountsNodeFailures, Urllib3HttpConnection):
    """The synchronous client's connection (workers, CLI, API threads). Its connect timeout is
    the ``urllib3.Timeout`` :func:`build_client` passes; a connect that times out is
    opensearch-py's ``ConnectionError`` there (only a read timeout is ``ConnectionTimeout``), so
    the node is marked dead and the request goes to the next one."""


class ObservedAsyncConnection(_CountsNodeFailures, KeepAliveConnection):
    """The event loop's connection (recall in the API and the proxy): opensearch-py's transport
    over lean keep-alive sockets (:mod:`service.storage.keepalive`, ~4x less CPU per request
    than aiohttp), with a connect timeout of its own. A connect that timed out reached no node:
    it is a ``ConnectionError``, retried on the next node while this one rests; a read that
    timed out is ``ConnectionTimeout``, not retried (``retry_on_timeout`` is off, since it may
    have been applied)."""


def opensearch_hosts(url: str) -> list[str]:
    """``TENURE_OPENSEARCH_URL`` names one node or, comma-separated, several nodes of a cluster."""
    return [part.strip() for part in url.split(",") if part.strip()]


def _client_options(settings: Settings) -> dict[str, Any]:
    """What the synchronous and the asynchronous client share."""
    auth = None
    if settings.opensearch_username and settings.opensearch_password:
        auth = (settings.opensearch_username, settings.opensearch_password.get_secret_value())
    return {
        # several nodes: requests rotate over them, and one that fails to connect is retried on
        # the next node (max_retries) while the dead one rests (opensearch-py's connection pool)
        "hosts": opensearch_hosts(settings.opensearch_url),
        "http_auth": auth,
        "max_retries": 1,
        "retry_on_timeout": False,
        "http_compress": False,
        "serializer": FastJSONSerializer(),
    }


def build_client(settings: Settings) -> OpenSearch:
    # at least one connection per request thread (ApiSettings.thread_pool_size), so no thread
    # waits for a connection and none is opened and discarded on a burst
    return OpenSearch(
        pool_maxsize=max(32, settings.api.thread_pool_size),
        connection_class=ObservedConnection,
        # a request's own request_timeout (a float) replaces both, as opensearch-py passes it on
        timeout=urllib3.Timeout(
            connect=min(settings.opensearch_connect_timeout_s, settings.opensearch_timeout_s),
            read=settings.opensearch_timeout_s,
        ),
        **_client_options(settings),
    )


def build_async_client(
    settings: Settings, connection_class: type[AsyncConnection] = ObservedAsyncConnection
) -> AsyncOpenSearch:
    """The event loop's client (keep-alive sockets; recall in the API and the proxy). Create it
    inside the running loop (the app lifespan) and close it there. ``connection_class``: another
    connection with the same options (``benchmarks/keepalive_ab.py`` compares aiohttp's)."""
    return AsyncOpenSearch(
        pool_maxsize=max(32, settings.api.thread_pool_size),
        connection_class=connection_class,
        timeout=settings.opensearch_timeout_s,
        connect_timeout=min(settings.opensearch_connect_timeout_s, settings.opensearch_timeout_s),
        **_client_options(settings),
    )


def _every_connection(client: OpenSearch | AsyncOpenSearch) -> tuple[Any, ...]:
    """Every node's connection the client was built with, the resting (dead) ones included.

    opensearch-py's own ``close()`` closes only the connections currently live: after a node
    loss the dead node's connection, with its sockets or urllib3 pool, stays open. A one-node
    client has a pool of one."""
    pool = client.transport.connection_pool
    return tuple(getattr(pool, "orig_connections", pool.connections))


def close_client(client: OpenSearch) -> None:
    """Close the synchronous client and every node's connection (closing one twice is a no-op)."""
    for connection in _every_connection(client):
        connection.close()


async def close_async_client(client: AsyncOpenSearch) -> None:
    """Close the event loop's client and every node's sockets, the resting ones too."""
    await client.close()
    for connection in _every_connection(client):
        await connection.close()


@contextmanager
def translate_errors(action: str, *, on_missing: str | None = None, on_conflict: str | None = None) -> Iterator[None]:
    """Map opensearch-py failures to the service's error hierarchy (never a bare 500).

    ``on_missing``: a 404 (document or index absent) is :class:`NotFound` with this message;
    ``on_conflict``: a 409 (``op_type=create`` over an existing id, a stale ``if_seq_no``) is
    :class:`Conflict` with this message. Without them a 404/409 is not expected and stays the
    store's failure (the API answers 503)."""
    try:
        yield
    except TenureError:
        raise
    except os_exc.SerializationError as exc:
        # the request could not even be encoded (an unpaired surrogate, an integer beyond 64 bits):
        # input the models let through, never a crash; the value itself goes to the log only
        log.warning("a request to %s could not be encoded: %s", action, exc.args[-1] if exc.args else exc)
        raise ValidationFailed(f"the request to {action} holds a value the store cannot encode") from exc
    except (os_exc.ConnectionError, os_exc.ConnectionTimeout) as exc:
        metrics.OPENSEARCH_ERRORS.labels("unreachable").inc()
        raise StoreUnavailable(f"OpenSearch is unreachable while trying to {action}") from exc
    except os_exc.TransportError as exc:
        status = exc.status_code if isinstance(exc.status_code, int) else 0
        if status not in (404, 409):  # a missing document, a lost version race: answers, not failures
            metrics.OPENSEARCH_ERRORS.labels(str(status)).inc()
        if status == 404 and on_missing is not None:
            raise NotFound(on_missing) from exc
        if status == 409 and on_conflict is not None:
            raise Conflict(on_conflict) from exc
        if status in (429, 502, 503, 504):
            raise StoreUnavailable(
                f"OpenSearch is overloaded or unavailable ({status}) while trying to {action}"
            ) from exc
        if index_unavailable(exc.error):
            # a closed index (400) or one missing where an index was expected (404, no on_missing):
            # nothing wrong with the request, the store cannot serve it until the index is back
            # (an operator's close, a restore, an alias moving), so a retry later can succeed
            log.warning("OpenSearch could not %s: %s", action, exc.error)
            raise StoreUnavailable(f"an index is closed or missing while trying to {action}") from exc
        if status == 400:
            # OpenSearch's own text names index and document ids: it goes to the log, never to
            # the client.
            log.warning("OpenSearch refused the request to %s: %s", action, exc.info or exc.error)
            raise ValidationFailed(f"the store refused the request to {action}; check the parameters") from exc
        if status == 403 and "cluster_block_exception" in str(exc.error):
            # a write block (tenure reindex, or the disk flood stage): the store is read-only for
            # now, so a worker's write is retried later instead of failing the task for good
            raise StoreUnavailable(f"OpenSearch is blocking writes while trying to {action}") from exc
        raise


# Refusals that name the index, not the request: it is closed (400) or not there (404). The store
# cannot serve the request now, as when it is down; the same request succeeds once the index is
# open again (or restored, or the alias back), so these are transient, never the caller's error.
UNAVAILABLE_INDEX_ERRORS = frozenset({"index_closed_exception", "index_not_found_exception"})


def index_unavailable(error: Any) -> bool:
    """Whether an OpenSearch error (a request's ``error`` type, or an item's error object) says
    the index is closed or missing rather than that the request is wrong."""
    kind = error.get("type") if isinstance(error, dict) else error
    return kind in UNAVAILABLE_INDEX_ERRORS


def item_error(status: Any, error: Any, action: str) -> TenureError:
    """The error for one failed item of a multi-request (``_msearch``), mapped as
    :func:`translate_errors` maps a failed request: a 400 is the caller's; anything else (a 503
    "all shards failed" while a restarted node recovers its shards, a 429 rejection, a missing
    index) means the store cannot serve it now, which is a retryable 503, not a 422."""
    metrics.OPENSEARCH_ERRORS.labels(str(status)).inc()
    if status == 400 and not index_unavailable(error):
        log.warning("OpenSearch refused the request to %s: %s", action, error)
        return ValidationFailed(f"the store refused the request to {action}; check the parameters")
    return StoreUnavailable(f"OpenSearch could not {action} ({status})")


def found_item(doc: dict[str, Any], action: str) -> bool:
    """Whether one ``mget`` item found its document. An item the store could not read (its index
    closed, its shard unavailable: the ``mget`` itself answers 200) is raised as that failure,
    :func:`item_error`, never read as a document that does not exist: a missing account record
    or belief decides things a closed index must not."""
    if "error" in doc:
        raise item_error(doc.get("status", 503), doc["error"], action)
    return bool(doc.get("found"))


def bulk_item(result: dict[str, Any]) -> dict[str, Any]:
    """The per-document part of one bulk result (``{"create": {...}}`` -> ``{...}``)."""
    info = next(iter(result.values()), None)
    return info if isinstance(info, dict) else {}


def already_exists(info: dict[str, Any]) -> bool:
    """Whether a refused bulk item was refused only because its id exists (a create's 409: an
    earlier attempt wrote it)."""
    return info.get("status") == 409


def refused_for_good(info: dict[str, Any]) -> bool:
    """Whether a failed bulk item was refused for what it is (a 400 such as
    ``mapper_parsing_exception``, a 413), so sending it again cannot help. Every other status is
    the store unable to take it now: a 429 or a 5xx, a 403 ``cluster_block_exception`` (a write
    block, the flood-stage disk watermark), a 404 ``index_not_found`` while an alias moves; a 409
    is an id that exists (see :func:`already_exists`); a 400 ``index_closed_exception`` is the
    index, not the item, and is taken once the index is open again."""
    return info.get("status") in (400, 413) and not index_unavailable(info.get("error"))


def routed_id(tenant_id: str, key: str) -> str:
    """Document id of a tenant's record. The tenant is part of the key, so client-given ids (the
    paper's ``b-redis-code``) never collide across tenants and a by-key read cannot cross them."""
    return f"{tenant_id}:{key}"


def index_routed(
    client: OpenSearch,
    *,
    index: str,
    doc_id: str,
    body: dict[str, Any],
    routing: str,
    refresh: str,
    action: str,
    on_conflict: str,
    **options: Any,
) -> None:
    """Index one routed document. A 409 (``op_type=create`` over an existing id, or a stale
    ``if_seq_no``) becomes :class:`Conflict` with ``on_conflict`` as its message."""
    with translate_errors(action, on_conflict=on_conflict):
        client.index(index=index, id=doc_id, body=body, routing=routing, refresh=refresh, **options)


def get_routed(client: OpenSearch, *, index: str, doc_id: str, routing: str, action: str) -> dict[str, Any] | None:
    """A document by key (real time, with ``_seq_no``/``_primary_term``); None when it is absent."""
    try:
        with translate_errors(action, on_missing=f"no document {doc_id!r}"):
            found: dict[str, Any] = client.get(index=index, id=doc_id, routing=routing)
    except NotFound:
        return None
    return found
