"""``Tenure`` (sync) and ``AsyncTenure``: one method per API operation, typed answers.

Both execute the same :mod:`tenure_client._calls` descriptions: requests carry the credential as
``Authorization: Bearer``; a 429 is retried after its ``Retry-After`` (at most ``max_retries`` times,
each wait capped by ``max_retry_wait_s``; ``max_retries=0`` turns retries off, e.g. for a load
generator that counts every 429), as is a 408 (the request did not arrive in time and was not
acted on) and a request that never reached the server (no connection could be made); a 502, 503
or 504 (the API, or the proxy in front of it, cannot answer now) and a dropped connection, after
which the server may have done the request already, only for what it answers the same when sent
again: reads, recall, and creates, which carry an id made here when the caller gave none (a resent
create told 409 reads the id back and returns its own earlier write). Every failure is a
:class:`~tenure_client.errors.TenureError`; a :class:`~tenure_client.errors.ConnectionFailed`
carries httpx's error as its ``__cause__``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx
from pydantic_core import from_json

from tenure_client import _calls as calls
from tenure_client import models
from tenure_client.errors import (
    ConnectionFailed,
    IncompleteAnswer,
    NotFound,
    TenureError,
    UnexpectedAnswer,
    from_response,
    unexpected_answer,
)
from tenure_client.keepalive import KeepAliveSyncTransport, KeepAliveTransport, TransportClosed

if TYPE_CHECKING:
    import anthropic
    import openai

T = TypeVar("T")
Item = TypeVar("Item", covariant=True)
DEFAULT_URL = "http://127.0.0.1:8000"
USER_AGENT = "tenure-client/0.1"


def _settings(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    url = base_url or os.environ.get("TENURE_URL") or os.environ.get("TENURE_CLI_URL") or DEFAULT_URL
    key = api_key or os.environ.get("TENURE_API_KEY") or os.environ.get("TENURE_CLI_KEY")
    return url.rstrip("/"), key


def _backoff(attempt: int, error: TenureError | None, cap: float) -> float:
    """The server's Retry-After when it gave one, else a short exponential back-off."""
    hinted = error.retry_after_s if error is not None else None
    return min(cap, hinted if hinted is not None else 0.25 * 2**attempt)


# The server, or the proxy in front of it, could not answer now: 502 and 504 are what a proxy
# (the TLS proxy, a load balancer) says while the API restarts or is slow, 503 the API's own
# "a store is unavailable". Any of them may come after the request was done (a 503 after the
# index write, a 502/504 from a proxy whose upstream broke or timed out mid-request).
UNAVAILABLE = frozenset({502, 503, 504})
# Answered, and nothing was done: 408 (the request did not arrive in time), 429 (rate limited).
NOT_DONE = frozenset({408, 429})
# Never sent: no connection was made (refused, no route, DNS, TLS) or none was free in time.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _should_retry(call: calls.Call[Any], error: TenureError, attempt: int, max_retries: int) -> bool:
    if attempt >= max_retries:
        return False
    # 429: refused before the request was handled; 408: it never arrived whole, and the API acts
    # only on a whole request (service/api/http_protocol.py). Nothing was done: safe for any call.
    if error.status in NOT_DONE:
        return True
    cause = error.__cause__
    if isinstance(cause, TransportClosed):  # cannot succeed later either
        return False
    if isinstance(cause, _NOT_SENT):  # the server never saw it: safe for any call, writes included
        return True
    # a dropped answer, or one that can come after the write was stored: only what the server
    # answers the same when sent again
    return (isinstance(error, ConnectionFailed) or error.status in UNAVAILABLE) and call.idempotent


def _resent_conflict(call: calls.Call[T], error: TenureError, attempt: int) -> calls.Call[T | None] | None:
    """The read that tells whether a resent create's 409 met its own earlier attempt (see
    :attr:`calls.Call.on_resent_conflict`); ``None``: the error stands."""
    if attempt == 0 or error.status != 409:
        return None
    return call.on_resent_conflict


class _Base:
    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        *,
        session_id: str | None,
        max_retries: int,
        max_retry_wait_s: float,
    ):
        self.base_url, self.api_key = _settings(base_url, api_key)
        self.session_id = session_id
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s

    def _headers(self, call: calls.Call[Any]) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, **call.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _url(self, http: httpx.Client | httpx.AsyncClient, path: str) -> httpx.URL:
        return _joined(http.base_url, self.base_url, path)

    def _connection_error(self, http: httpx.Client | httpx.AsyncClient, exc: httpx.HTTPError) -> ConnectionFailed:
        base = str(http.base_url) or self.base_url
        reason = str(exc) or type(exc).__name__
        failure = ConnectionFailed(base.rstrip("/"), reason)
        failure.__cause__ = exc  # raised after the retry decision: keep httpx's error (timeout, refused, ...)
        return failure

    def _stream_error(
        self, http: httpx.Client | httpx.AsyncClient, exc: httpx.HTTPError, lines: int | None
    ) -> ConnectionFailed:
        """A streamed answer's failure: before it started, the server could not be reached; after
        (``lines`` read), the answer was cut off, e.g. the store failed mid-export, and what the
        caller has is incomplete."""
        if lines is None:
            return self._connection_error(http, exc)
        base = (str(http.base_url) or self.base_url).rstrip("/")
        failure = IncompleteAnswer(base, str(exc) or type(exc).__name__, lines)
        failure.__cause__ = exc
        return failure

    # ----------------------------------------------------------- proxy clients

    def _proxy_headers(self, scopes: Sequence[str], session_id: str | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        if scopes:
            headers["X-Tenure-Scope"] = ",".join(scopes)
        if session_id or self.session_id:
            headers["X-Session-Id"] = str(session_id or self.session_id)
        return headers

    def openai_kwargs(self, scopes: Sequence[str] = (), session_id: str | None = None) -> dict[str, Any]:
        """Arguments for ``openai.OpenAI(...)`` pointed at the proxy with this credential."""
        return {
            "base_url": f"{self.base_url}/v1",
            "api_key": self.api_key or "",
            "default_headers": self._proxy_headers(scopes, session_id),
        }

    def anthropic_kwargs(self, scopes: Sequence[str] = (), session_id: str | None = None) -> dict[str, Any]:
        """Arguments for ``anthropic.Anthropic(...)`` pointed at the proxy with this credential (the
        SDK sends it as ``x-api-key``; the proxy accepts that header too)."""
        return {
            "base_url": self.base_url,
            "api_key": self.api_key or "",
            "default_headers": self._proxy_headers(scopes, session_id),
        }


class _Page(Protocol[Item]):
    """One page of a listing: its items and the cursor of the next page (``None``: the last)."""

    @property
    def items(self) -> Sequence[Item]: ...

    @property
    def next_cursor(self) -> str | None: ...


def _follow(fetch: Callable[[str | None], _Page[Item]]) -> Iterator[Item]:
    """Every item of a listing, page after page: ``fetch(cursor)`` gets one page (``None``: the first)."""
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        yield from page.items
        if not page.next_cursor:
            return
        cursor = page.next_cursor


async def _afollow(fetch: Callable[[str | None], Awaitable[_Page[Item]]]) -> AsyncIterator[Item]:
    """:func:`_follow` for the async client."""
    cursor: str | None = None
    while True:
        page = await fetch(cursor)
        for item in page.items:
            yield item
        if not page.next_cursor:
            return
        cursor = page.next_cursor


@functools.lru_cache(maxsize=1024)
def _joined(http_base: httpx.URL, base_url: str, path: str) -> httpx.URL:
    """The absolute URL of ``path``, parsed once: httpx parses a string URL on every request and
    again to merge it with its base (~40 µs a request; an absolute ``httpx.URL`` is used as is).
    Paths are few (a route and an id), so the cache stays small. Merged as httpx merges a relative
    URL with a client's base: the base's path kept (a deployment behind a proxy at
    ``https://host/tenure/``), where RFC 3986's ``join`` of an absolute path would replace it and
    send the request, key and all, to another path of the host."""
    if not str(http_base):
        return httpx.URL(f"{base_url}{path}")
    return http_base.copy_with(raw_path=http_base.raw_path + httpx.URL(path).raw_path.lstrip(b"/"))


def _direct_request(
    http: httpx.Client | httpx.AsyncClient, call: calls.Call[Any], url: httpx.URL, headers: dict[str, str]
) -> httpx.Request:
    """The request ``http.request`` builds for ``call`` (the client's default headers, those the
    call names replaced and its own after them, as ``httpx.Headers.update`` orders them; the
    client's timeouts), for a client whose only transport is the SDK's keep-alive one: the SDK
    hands it to that transport itself (see ``Tenure.__init__``)."""
    named = {name.lower().encode("latin-1") for name in headers}
    merged = [
        (name.decode("latin-1"), value.decode("latin-1"))  # as the client holds them, case kept
        for name, value in http.headers.raw
        if name.lower() not in named
    ]
    merged.extend(headers.items())
    return httpx.Request(
        call.method,
        url,
        params=call.params or None,
        json=call.json,
        content=call.content,
        headers=merged,
        extensions={"timeout": http.timeout.as_dict()},
    )


class _Lent(httpx.BaseTransport):
    """A transport the caller handed in, as the client's ``httpx.Client`` sees it: used, never
    closed with the client. Several clients may share one; the caller closes it."""

    def __init__(self, transport: httpx.BaseTransport):
        self.transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.transport.handle_request(request)

    def close(self) -> None:
        """The caller's to close, not the client's."""


class _AsyncLent(httpx.AsyncBaseTransport):
    """:class:`_Lent` for the async client."""

    def __init__(self, transport: httpx.AsyncBaseTransport):
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        """The caller's to close, not the client's."""


def _parsed(call: calls.Call[T], response: httpx.Response) -> T:
    """A successful answer read by its call: an empty one as ``None``, a :class:`calls.Parser`
    from the bytes, any other parser from the decoded JSON. A redirect, or an answer the call
    cannot read (a proxy's page), is an :class:`UnexpectedAnswer`, never pydantic's error."""
    if response.status_code >= 300:
        raise unexpected_answer(response)
    try:
        if response.status_code == 204 or not response.content:
            return call.parse(None)
        if isinstance(call.parse, calls.Parser):
            return call.parse.from_bytes(response.content)
        return call.parse(from_json(response.content))
    except ValueError as exc:  # not JSON, or not this call's model (pydantic's ValidationError)
        raise unexpected_answer(response) from exc


def _refusal(response: httpx.Response) -> TenureError:
    """What a streamed answer's status (a redirect or an error) stands for."""
    return from_response(response) if response.status_code >= 400 else unexpected_answer(response)


def _belief_line(line: str, url: str) -> models.Belief:
    """One line of a JSONL export; a line that is not a belief is an :class:`UnexpectedAnswer`."""
    try:
        return models.Belief.model_validate(json.loads(line))
    except ValueError as exc:
        message = f"a line of the export from {url} is not a belief: is the base URL the API's?"
        raise UnexpectedAnswer(url, message) from exc


class Tenure(_Base):
    """The synchronous client. ``http_client`` may be any ``httpx.Client`` (tests pass FastAPI's
    ``TestClient``; the client closes only what it created); ``transport`` an httpx transport for
    the client it creates (e.g. ``httpx.ASGITransport`` to call an app in process), used and never
    closed by the client: several clients may share one, and the caller closes it.

    Over the SDK's own :class:`~tenure_client.keepalive.KeepAliveSyncTransport` in a client it
    created, a call goes to the transport directly: the request ``httpx.Client`` would build (its
    default headers and timeouts), without the client's per-request machinery that such a client
    never uses (an auth flow, a redirect loop, event hooks, a cookie jar: the service sets no
    cookies) or its ``httpx`` log line: ~0.1 ms less client CPU and latency per call (0.27 against
    0.37 ms of CPU for an empty recall; docs/benchmarks.md, 2026-12-05). A client passed in as
    ``http_client`` is always used as it is."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        session_id: str | None = None,
        max_retries: int = 2,
        max_retry_wait_s: float = 30.0,
        http_client: httpx.Client | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        super().__init__(
            base_url, api_key, session_id=session_id, max_retries=max_retries, max_retry_wait_s=max_retry_wait_s
        )
        self._owned = http_client is None
        lent = _Lent(transport) if transport is not None else None
        self.http = http_client or httpx.Client(base_url=self.base_url, timeout=timeout, transport=lent)
        self._direct = transport if self._owned and isinstance(transport, KeepAliveSyncTransport) else None
        self.beliefs = Beliefs(self)
        self.admin = Admin(self)

    def __enter__(self) -> Tenure:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self.http.close()

    def send(self, call: calls.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._request(call)
                if response.status_code < 400:
                    return _parsed(call, response)
                error: TenureError = from_response(response)
            except httpx.HTTPError as exc:
                error = self._connection_error(self.http, exc)
            earlier = _resent_conflict(call, error, attempt)
            if earlier is not None:
                return self._earlier_attempt(earlier, error)
            if not _should_retry(call, error, attempt, self.max_retries):
                raise error
            time.sleep(_backoff(attempt, error, self.max_retry_wait_s))
            attempt += 1

    def _earlier_attempt(self, read_back: calls.Call[T | None], conflict: TenureError) -> T:
        """What a resent create's earlier attempt stored, or the 409 when another write holds the id
        (one this caller cannot read included)."""
        try:
            stored = self.send(read_back)
        except NotFound:
            raise conflict from None
        if stored is None:
            raise conflict
        return stored

    def _request(self, call: calls.Call[Any]) -> httpx.Response:
        """``call``'s answer, read whole: through the client, or straight to the SDK's own
        transport (see the class)."""
        url, headers = self._url(self.http, call.path), self._headers(call)
        if self._direct is None:
            return self.http.request(
                call.method, url, params=call.params or None, json=call.json, content=call.content, headers=headers
            )
        response = self._direct.handle_request(_direct_request(self.http, call, url, headers))
        try:
            response.read()  # the whole answer; reading it to the end hands the socket back
        except BaseException:
            response.close()
            raise
        return response

    def stream_lines(self, path: str, params: Mapping[str, Any]) -> Iterator[str]:
        """The non-empty lines of a streamed answer (JSONL export), as they arrive. Retried as
        any read is (:meth:`send`) until the answer has started; a cut-off answer is not resent,
        its lines are already the caller's."""
        call: calls.Call[Any] = calls.Call("GET", path, calls.raw, params=params)
        attempt = 0
        while True:
            lines: int | None = None  # counted once the answer has started
            try:
                with self.http.stream(
                    "GET", self._url(self.http, path), params=dict(params), headers=self._headers(call)
                ) as response:
                    if response.status_code >= 300:
                        response.read()
                        raise _refusal(response)
                    lines = 0
                    for line in response.iter_lines():
                        if line.strip():
                            lines += 1
                            yield line
                return
            except httpx.HTTPError as exc:
                error: TenureError = self._stream_error(self.http, exc, lines)
            except TenureError as refused:  # the answer's status, before it started
                error = refused
            if lines is not None or not _should_retry(call, error, attempt, self.max_retries):
                raise error
            time.sleep(_backoff(attempt, error, self.max_retry_wait_s))
            attempt += 1

    # -------------------------------------------------------------- top level

    def recall(
        self,
        query: str = "",
        *,
        scopes: Sequence[str] = (),
        session_id: str | None = None,
        budget: Mapping[str, Any] | None = None,
        explain: bool = False,
    ) -> models.RecallOut:
        """The four tiers and the injection block for ``query`` (writes an injection receipt)."""
        return self.send(calls.recall(query, scopes, session_id or self.session_id, budget, explain))

    def recall_json(self, query: str = "", *, scopes: Sequence[str] = (), session_id: str | None = None) -> Any:
        """:meth:`recall`'s answer as the server sent it: decoded JSON, not read into this SDK's
        models. For tools that compare servers of different versions (an answer from before the
        API change of 2026-11-30 has another injection shape) or must not spend client CPU on
        validation, e.g. the benchmarks."""
        return self.send(calls.as_json(calls.recall(query, scopes, session_id or self.session_id, None, False)))

    def whoami(self) -> models.WhoAmI:
        return self.send(calls.whoami())

    def ready(self) -> Any:
        return self.send(calls.health())

    def post_turn(self, **values: Any) -> models.TurnOut:
        return self.send(calls.post_turn(values, self.session_id))

    def get_turn(self, turn_id: str) -> models.TurnOut:
        return self.send(calls.get_turn(turn_id))

    def openai(self, *, scopes: Sequence[str] = (), session_id: str | None = None, **kwargs: Any) -> openai.OpenAI:
        """An ``openai.OpenAI`` client whose requests go through the Tenure proxy (needs the
        ``openai`` extra)."""
        import openai

        return openai.OpenAI(**{**self.openai_kwargs(scopes, session_id), **kwargs})

    def anthropic(
        self, *, scopes: Sequence[str] = (), session_id: str | None = None, **kwargs: Any
    ) -> anthropic.Anthropic:
        """An ``anthropic.Anthropic`` client whose Messages calls go through the Tenure proxy
        (needs the ``anthropic`` extra)."""
        import anthropic

        return anthropic.Anthropic(**{**self.anthropic_kwargs(scopes, session_id), **kwargs})


class Beliefs:
    def __init__(self, client: Tenure):
        self._c = client

    def create(self, **values: Any) -> models.Belief:
        """Create one belief: ``type``, ``canonical_name``, ``content``, ``scope`` and optionally
        ``aliases``, ``why_it_matters``, ``id``... (see :class:`models.BeliefCreate`)."""
        return self._c.send(calls.create_belief(values, self._c.session_id))

    def get(self, belief_id: str) -> models.Belief:
        return self._c.send(calls.get_belief(belief_id))

    def list(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> models.BeliefPage:
        """One page. Filters: ``type``, ``status``, ``scope`` (lists), ``pinned``, ``q``, ``all``."""
        return self._c.send(calls.list_beliefs(calls.belief_filters(**filters), limit, cursor))

    def iter(self, *, page_size: int = 200, **filters: Any) -> Iterator[models.Belief]:
        """Every belief matching the filters, page after page (follows ``next_cursor``)."""
        return _follow(lambda cursor: self.list(limit=page_size, cursor=cursor, **filters))

    def history(self, belief_id: str) -> models.HistoryOut:
        return self._c.send(calls.history(belief_id))

    def supersede(self, belief_id: str, **values: Any) -> models.SupersedeResult:
        """Replace with a new version: ``content`` and optionally ``canonical_name``, ``aliases``,
        ``why_it_matters``, ``confidence``, ``reason``."""
        return self._c.send(calls.supersede(belief_id, values, self._c.session_id))

    def reinforce(self, belief_id: str, aliases: Sequence[str] = ()) -> models.Belief:
        return self._c.send(calls.belief_action(belief_id, "reinforce", {"aliases": list(aliases)}, self._c.session_id))

    def pin(self, belief_id: str) -> models.Belief:
        return self._c.send(calls.belief_action(belief_id, "pin", None, self._c.session_id))

    def unpin(self, belief_id: str) -> models.Belief:
        return self._c.send(calls.belief_action(belief_id, "unpin", None, self._c.session_id))

    def resolve(self, belief_id: str, *, note: str | None = None, resolved_by: str | None = None) -> models.Belief:
        payload = calls.query(note=note, resolved_by=resolved_by)
        return self._c.send(calls.belief_action(belief_id, "resolve", payload, self._c.session_id))

    def add_aliases(self, belief_id: str, aliases: Sequence[str]) -> models.Belief:
        return self._c.send(calls.belief_action(belief_id, "aliases", {"aliases": list(aliases)}, self._c.session_id))

    def remove_aliases(self, belief_id: str, aliases: Sequence[str]) -> models.Belief:
        """Take back aliases (each must be one of the belief's)."""
        payload = {"aliases": list(aliases)}
        return self._c.send(calls.belief_action(belief_id, "aliases/remove", payload, self._c.session_id))

    def retract(self, belief_id: str, *, reason: str | None = None) -> models.Belief:
        payload = calls.query(reason=reason)
        return self._c.send(calls.belief_action(belief_id, "retract", payload, self._c.session_id))

    def erase(self, belief_id: str) -> models.ErasureReceiptOut:
        """Admins: hard delete of every version, audit payload copies and cached renderings."""
        return self._c.send(calls.erase(belief_id))

    def import_(self, records: Iterable[Mapping[str, Any]]) -> models.ImportResult:
        """One import request (JSONL). For large files use :func:`tenure_client.chunked` to stay
        under the server's body limit."""
        return self._c.send(calls.import_beliefs(records, self._c.session_id))

    def export(self, **filters: Any) -> Iterator[models.Belief]:
        """Every matching belief with its change log, streamed (JSONL) as the server sends it."""
        for line in self._c.stream_lines("/v1/beliefs/export", calls.belief_filters(**filters)):
            yield _belief_line(line, self._c.base_url)


class Admin:
    def __init__(self, client: Tenure):
        self._c = client

    def create_tenant(self, tenant_id: str, name: str | None = None) -> models.TenantOut:
        return self._c.send(calls.create_tenant(tenant_id, name))

    def get_tenant(self, tenant_id: str) -> models.TenantOut:
        return self._c.send(calls.tenant_action(tenant_id))

    def disable_tenant(self, tenant_id: str) -> models.TenantOut:
        return self._c.send(calls.tenant_action(tenant_id, "disable"))

    def enable_tenant(self, tenant_id: str) -> models.TenantOut:
        return self._c.send(calls.tenant_action(tenant_id, "enable"))

    def create_user(self, tenant_id: str, user_id: str, **grants: Any) -> models.UserOut:
        return self._c.send(calls.create_user(tenant_id, {"user_id": user_id, **grants}))

    def get_user(self, tenant_id: str, user_id: str) -> models.UserOut:
        return self._c.send(calls.user_action(tenant_id, user_id))

    def disable_user(self, tenant_id: str, user_id: str) -> models.UserOut:
        return self._c.send(calls.user_action(tenant_id, user_id, "disable"))

    def enable_user(self, tenant_id: str, user_id: str) -> models.UserOut:
        return self._c.send(calls.user_action(tenant_id, user_id, "enable"))

    def list_users(self, tenant_id: str, *, limit: int | None = None, cursor: str | None = None) -> models.UserPage:
        return self._c.send(calls.list_users(tenant_id, limit, cursor))

    def iter_users(self, tenant_id: str, *, page_size: int = 200) -> Iterator[models.UserOut]:
        """Every user of the tenant (follows ``next_cursor``)."""
        return _follow(lambda cursor: self.list_users(tenant_id, limit=page_size, cursor=cursor))

    def change_grants(self, tenant_id: str, user_id: str, **changes: Any) -> models.UserOut:
        """``add_projects``, ``remove_projects``, ``add_teams``, ... (see :class:`models.GrantsPatch`)."""
        return self._c.send(calls.change_grants(tenant_id, user_id, changes))

    def issue_key(self, tenant_id: str, user_id: str, **values: Any) -> models.IssuedKeyOut:
        """The new key's secret is in ``.key``, once."""
        return self._c.send(calls.issue_key(tenant_id, user_id, values))

    def list_keys(self, tenant_id: str, *, limit: int | None = None, cursor: str | None = None) -> models.KeyPage:
        return self._c.send(calls.list_keys(tenant_id, limit, cursor))

    def iter_keys(self, tenant_id: str, *, page_size: int = 200) -> Iterator[models.KeyOut]:
        """Every API key of the tenant, revoked ones included (follows ``next_cursor``)."""
        return _follow(lambda cursor: self.list_keys(tenant_id, limit=page_size, cursor=cursor))

    def revoke_key(self, key_id: str) -> models.KeyOut:
        return self._c.send(calls.revoke_key(key_id))

    def dev_token(self, tenant_id: str, user_id: str, *, ttl_s: int | None = None) -> models.TokenOut:
        return self._c.send(calls.dev_token(tenant_id, user_id, ttl_s))

    def revoke_token(self, token: str) -> models.TokenRevokedOut:
        return self._c.send(calls.revoke_token(token))

    def audit(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> models.AuditPage:
        """One page of the audit trail. Filters: ``tenant_id``, ``actor_id``, ``belief_id``,
        ``session_id``, ``action``, ``request_id``, ``since``, ``until``."""
        return self._c.send(calls.audit(filters, limit, cursor))

    def iter_audit(self, *, page_size: int = 200, **filters: Any) -> Iterator[models.AuditEvent]:
        """Every audit event matching the filters of :meth:`audit` (follows ``next_cursor``)."""
        return _follow(lambda cursor: self.audit(limit=page_size, cursor=cursor, **filters))

    def turns(
        self,
        *,
        status: str | None = None,
        owner_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.AdminTurnPage:
        """One page of the tenant's turns in ``status`` (the server's default: ``failed``),
        newest first, without their texts; ``owner_id`` narrows to one user's."""
        return self._c.send(calls.admin_turns(status, owner_id, limit, cursor))

    def iter_turns(
        self, *, status: str | None = None, owner_id: str | None = None, page_size: int = 200
    ) -> Iterator[models.AdminTurnOut]:
        """Every turn matching the filters of :meth:`turns` (follows ``next_cursor``)."""
        return _follow(lambda cursor: self.turns(status=status, owner_id=owner_id, limit=page_size, cursor=cursor))

    def get_turn(self, turn_id: str) -> models.AdminTurnDetail:
        """One turn of the tenant, whole: its extraction state, the exchange and the sidecar."""
        return self._c.send(calls.admin_turn(turn_id))

    def retry_turn(self, turn_id: str) -> models.TurnRetryOut:
        """Send a failed turn back for extraction (:class:`Conflict` ``turn_not_failed`` for any
        other status). Never resent by the client: see the README's "Retries"."""
        return self._c.send(calls.retry_turn(turn_id))

    def retry_failed_turns(self, *, owner_id: str | None = None, limit: int | None = None) -> models.BulkRetryOut:
        """Send up to ``limit`` (server default 50, at most 200) of the tenant's failed turns
        back, newest first; ``more`` says whether to call again."""
        return self._c.send(calls.retry_failed_turns(owner_id, limit))


# ---------------------------------------------------------------------- async


class AsyncTenure(_Base):
    """The asyncio client: the same operations as :class:`Tenure`, awaited (over the SDK's own
    :class:`~tenure_client.keepalive.KeepAliveTransport` in a client it created, straight to the
    transport, as :class:`Tenure` does)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        session_id: str | None = None,
        max_retries: int = 2,
        max_retry_wait_s: float = 30.0,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        super().__init__(
            base_url, api_key, session_id=session_id, max_retries=max_retries, max_retry_wait_s=max_retry_wait_s
        )
        self._owned = http_client is None
        lent = _AsyncLent(transport) if transport is not None else None
        self.http = http_client or httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=lent)
        self._direct = transport if self._owned and isinstance(transport, KeepAliveTransport) else None
        self.beliefs = AsyncBeliefs(self)
        self.admin = AsyncAdmin(self)

    async def __aenter__(self) -> AsyncTenure:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owned:
            await self.http.aclose()

    async def send(self, call: calls.Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = await self._request(call)
                if response.status_code < 400:
                    return _parsed(call, response)
                error: TenureError = from_response(response)
            except httpx.HTTPError as exc:
                error = self._connection_error(self.http, exc)
            earlier = _resent_conflict(call, error, attempt)
            if earlier is not None:
                return await self._earlier_attempt(earlier, error)
            if not _should_retry(call, error, attempt, self.max_retries):
                raise error
            await asyncio.sleep(_backoff(attempt, error, self.max_retry_wait_s))
            attempt += 1

    async def _earlier_attempt(self, read_back: calls.Call[T | None], conflict: TenureError) -> T:
        """:meth:`Tenure._earlier_attempt`, awaited."""
        try:
            stored = await self.send(read_back)
        except NotFound:
            raise conflict from None
        if stored is None:
            raise conflict
        return stored

    async def _request(self, call: calls.Call[Any]) -> httpx.Response:
        """:meth:`Tenure._request`, awaited."""
        url, headers = self._url(self.http, call.path), self._headers(call)
        if self._direct is None:
            return await self.http.request(
                call.method, url, params=call.params or None, json=call.json, content=call.content, headers=headers
            )
        response = await self._direct.handle_async_request(_direct_request(self.http, call, url, headers))
        try:
            await response.aread()
        except BaseException:
            await response.aclose()
            raise
        return response

    async def stream_lines(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[str]:
        """:meth:`Tenure.stream_lines`, as an async iterator."""
        call: calls.Call[Any] = calls.Call("GET", path, calls.raw, params=params)
        attempt = 0
        while True:
            lines: int | None = None  # counted once the answer has started
            try:
                async with self.http.stream(
                    "GET", self._url(self.http, path), params=dict(params), headers=self._headers(call)
                ) as response:
                    if response.status_code >= 300:
                        await response.aread()
                        raise _refusal(response)
                    lines = 0
                    async for line in response.aiter_lines():
                        if line.strip():
                            lines += 1
                            yield line
                return
            except httpx.HTTPError as exc:
                error: TenureError = self._stream_error(self.http, exc, lines)
            except TenureError as refused:  # the answer's status, before it started
                error = refused
            if lines is not None or not _should_retry(call, error, attempt, self.max_retries):
                raise error
            await asyncio.sleep(_backoff(attempt, error, self.max_retry_wait_s))
            attempt += 1

    async def recall(
        self,
        query: str = "",
        *,
        scopes: Sequence[str] = (),
        session_id: str | None = None,
        budget: Mapping[str, Any] | None = None,
        explain: bool = False,
    ) -> models.RecallOut:
        return await self.send(calls.recall(query, scopes, session_id or self.session_id, budget, explain))

    async def recall_json(self, query: str = "", *, scopes: Sequence[str] = (), session_id: str | None = None) -> Any:
        """:meth:`Tenure.recall_json`, awaited."""
        return await self.send(calls.as_json(calls.recall(query, scopes, session_id or self.session_id, None, False)))

    async def whoami(self) -> models.WhoAmI:
        return await self.send(calls.whoami())

    async def ready(self) -> Any:
        return await self.send(calls.health())

    async def post_turn(self, **values: Any) -> models.TurnOut:
        return await self.send(calls.post_turn(values, self.session_id))

    async def get_turn(self, turn_id: str) -> models.TurnOut:
        return await self.send(calls.get_turn(turn_id))

    def openai(self, *, scopes: Sequence[str] = (), session_id: str | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(**{**self.openai_kwargs(scopes, session_id), **kwargs})

    def anthropic(
        self, *, scopes: Sequence[str] = (), session_id: str | None = None, **kwargs: Any
    ) -> anthropic.AsyncAnthropic:
        import anthropic

        return anthropic.AsyncAnthropic(**{**self.anthropic_kwargs(scopes, session_id), **kwargs})


class AsyncBeliefs:
    def __init__(self, client: AsyncTenure):
        self._c = client

    async def create(self, **values: Any) -> models.Belief:
        return await self._c.send(calls.create_belief(values, self._c.session_id))

    async def get(self, belief_id: str) -> models.Belief:
        return await self._c.send(calls.get_belief(belief_id))

    async def list(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> models.BeliefPage:
        return await self._c.send(calls.list_beliefs(calls.belief_filters(**filters), limit, cursor))

    def iter(self, *, page_size: int = 200, **filters: Any) -> AsyncIterator[models.Belief]:
        """Every belief matching the filters (``async for``; follows ``next_cursor``)."""
        return _afollow(lambda cursor: self.list(limit=page_size, cursor=cursor, **filters))

    async def history(self, belief_id: str) -> models.HistoryOut:
        return await self._c.send(calls.history(belief_id))

    async def supersede(self, belief_id: str, **values: Any) -> models.SupersedeResult:
        return await self._c.send(calls.supersede(belief_id, values, self._c.session_id))

    async def reinforce(self, belief_id: str, aliases: Sequence[str] = ()) -> models.Belief:
        payload = {"aliases": list(aliases)}
        return await self._c.send(calls.belief_action(belief_id, "reinforce", payload, self._c.session_id))

    async def pin(self, belief_id: str) -> models.Belief:
        return await self._c.send(calls.belief_action(belief_id, "pin", None, self._c.session_id))

    async def unpin(self, belief_id: str) -> models.Belief:
        return await self._c.send(calls.belief_action(belief_id, "unpin", None, self._c.session_id))

    async def resolve(
        self, belief_id: str, *, note: str | None = None, resolved_by: str | None = None
    ) -> models.Belief:
        payload = calls.query(note=note, resolved_by=resolved_by)
        return await self._c.send(calls.belief_action(belief_id, "resolve", payload, self._c.session_id))

    async def add_aliases(self, belief_id: str, aliases: Sequence[str]) -> models.Belief:
        payload = {"aliases": list(aliases)}
        return await self._c.send(calls.belief_action(belief_id, "aliases", payload, self._c.session_id))

    async def remove_aliases(self, belief_id: str, aliases: Sequence[str]) -> models.Belief:
        payload = {"aliases": list(aliases)}
        return await self._c.send(calls.belief_action(belief_id, "aliases/remove", payload, self._c.session_id))

    async def retract(self, belief_id: str, *, reason: str | None = None) -> models.Belief:
        payload = calls.query(reason=reason)
        return await self._c.send(calls.belief_action(belief_id, "retract", payload, self._c.session_id))

    async def erase(self, belief_id: str) -> models.ErasureReceiptOut:
        """:meth:`Beliefs.erase`, awaited (admins; never resent: see the README's "Retries")."""
        return await self._c.send(calls.erase(belief_id))

    async def import_(self, records: Iterable[Mapping[str, Any]]) -> models.ImportResult:
        return await self._c.send(calls.import_beliefs(records, self._c.session_id))

    async def export(self, **filters: Any) -> AsyncIterator[models.Belief]:
        """:meth:`Beliefs.export` (``async for``): every matching belief with its change log, as
        the server streams it."""
        async for line in self._c.stream_lines("/v1/beliefs/export", calls.belief_filters(**filters)):
            yield _belief_line(line, self._c.base_url)


class AsyncAdmin:
    """The admin operations of :class:`Admin`, awaited."""

    def __init__(self, client: AsyncTenure):
        self._c = client

    async def create_tenant(self, tenant_id: str, name: str | None = None) -> models.TenantOut:
        return await self._c.send(calls.create_tenant(tenant_id, name))

    async def get_tenant(self, tenant_id: str) -> models.TenantOut:
        return await self._c.send(calls.tenant_action(tenant_id))

    async def disable_tenant(self, tenant_id: str) -> models.TenantOut:
        return await self._c.send(calls.tenant_action(tenant_id, "disable"))

    async def enable_tenant(self, tenant_id: str) -> models.TenantOut:
        return await self._c.send(calls.tenant_action(tenant_id, "enable"))

    async def create_user(self, tenant_id: str, user_id: str, **grants: Any) -> models.UserOut:
        return await self._c.send(calls.create_user(tenant_id, {"user_id": user_id, **grants}))

    async def get_user(self, tenant_id: str, user_id: str) -> models.UserOut:
        return await self._c.send(calls.user_action(tenant_id, user_id))

    async def disable_user(self, tenant_id: str, user_id: str) -> models.UserOut:
        return await self._c.send(calls.user_action(tenant_id, user_id, "disable"))

    async def enable_user(self, tenant_id: str, user_id: str) -> models.UserOut:
        return await self._c.send(calls.user_action(tenant_id, user_id, "enable"))

    async def list_users(
        self, tenant_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> models.UserPage:
        return await self._c.send(calls.list_users(tenant_id, limit, cursor))

    def iter_users(self, tenant_id: str, *, page_size: int = 200) -> AsyncIterator[models.UserOut]:
        """Every user of the tenant (``async for``; follows ``next_cursor``)."""
        return _afollow(lambda cursor: self.list_users(tenant_id, limit=page_size, cursor=cursor))

    async def change_grants(self, tenant_id: str, user_id: str, **changes: Any) -> models.UserOut:
        return await self._c.send(calls.change_grants(tenant_id, user_id, changes))

    async def issue_key(self, tenant_id: str, user_id: str, **values: Any) -> models.IssuedKeyOut:
        return await self._c.send(calls.issue_key(tenant_id, user_id, values))

    async def list_keys(self, tenant_id: str, *, limit: int | None = None, cursor: str | None = None) -> models.KeyPage:
        return await self._c.send(calls.list_keys(tenant_id, limit, cursor))

    def iter_keys(self, tenant_id: str, *, page_size: int = 200) -> AsyncIterator[models.KeyOut]:
        """Every API key of the tenant, revoked ones included (``async for``; follows ``next_cursor``)."""
        return _afollow(lambda cursor: self.list_keys(tenant_id, limit=page_size, cursor=cursor))

    async def revoke_key(self, key_id: str) -> models.KeyOut:
        return await self._c.send(calls.revoke_key(key_id))

    async def dev_token(self, tenant_id: str, user_id: str, *, ttl_s: int | None = None) -> models.TokenOut:
        return await self._c.send(calls.dev_token(tenant_id, user_id, ttl_s))

    async def revoke_token(self, token: str) -> models.TokenRevokedOut:
        return await self._c.send(calls.revoke_token(token))

    async def audit(self, *, limit: int | None = None, cursor: str | None = None, **filters: Any) -> models.AuditPage:
        return await self._c.send(calls.audit(filters, limit, cursor))

    def iter_audit(self, *, page_size: int = 200, **filters: Any) -> AsyncIterator[models.AuditEvent]:
        """Every audit event matching the filters of :meth:`audit` (``async for``; follows ``next_cursor``)."""
        return _afollow(lambda cursor: self.audit(limit=page_size, cursor=cursor, **filters))

    async def turns(
        self,
        *,
        status: str | None = None,
        owner_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.AdminTurnPage:
        return await self._c.send(calls.admin_turns(status, owner_id, limit, cursor))

    def iter_turns(
        self, *, status: str | None = None, owner_id: str | None = None, page_size: int = 200
    ) -> AsyncIterator[models.AdminTurnOut]:
        """Every turn matching the filters of :meth:`turns` (``async for``; follows ``next_cursor``)."""
        return _afollow(lambda cursor: self.turns(status=status, owner_id=owner_id, limit=page_size, cursor=cursor))

    async def get_turn(self, turn_id: str) -> models.AdminTurnDetail:
        return await self._c.send(calls.admin_turn(turn_id))

    async def retry_turn(self, turn_id: str) -> models.TurnRetryOut:
        return await self._c.send(calls.retry_turn(turn_id))

    async def retry_failed_turns(self, *, owner_id: str | None = None, limit: int | None = None) -> models.BulkRetryOut:
        return await self._c.send(calls.retry_failed_turns(owner_id, limit))


def chunked(
    records: Iterable[Mapping[str, Any]], *, max_bytes: int = 150_000, max_records: int = 500
) -> Iterator[list[Mapping[str, Any]]]:
    """Group records into import requests that stay under ``max_bytes`` of JSONL (and
    ``max_records``), in order. A single record larger than ``max_bytes`` goes alone (the server
    will say 413 for it, and only for it)."""
    batch: list[Mapping[str, Any]] = []
    size = 0
    for record in records:
        line = len(json.dumps(dict(record), ensure_ascii=False).encode()) + 1
        if batch and (size + line > max_bytes or len(batch) >= max_records):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += line
    if batch:
        yield batch
