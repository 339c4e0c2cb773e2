"""OpenSearch reads as values: written once, run by the synchronous or the asynchronous client.

The recall path is needed twice: synchronously (Celery tasks, the console, the evals, scripts) and
asynchronously (``POST /v1/recall`` and the proxy, on the event loop without a thread-pool hop,
issue 16). Instead of two copies of every read, a read is a generator that *yields* the requests
it needs (:class:`Call`) and receives each response back (``Reads[T]``); :func:`run` drives it
with an :class:`~opensearchpy.OpenSearch` client, :func:`arun` with an
:class:`~opensearchpy.AsyncOpenSearch`. The queries, their access filters (``access.py``), the
parsing of the answers and the error mapping (:func:`translate_errors`, the same ``action`` text)
are the same objects either way. A translated error is thrown back into the generator at the
point of its request, so a read can catch :class:`~service.errors.NotFound` like a direct call.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opensearchpy import AsyncOpenSearch, OpenSearch
from opensearchpy import exceptions as os_exc

from service.errors import StoreUnavailable, TenureError
from service.storage.client import translate_errors

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One request: the client method (``search``, ``msearch``, ``mtermvectors``,
    ``indices.get_mapping``), its keyword arguments, and what it does (for the error message)."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    action: str = "read from OpenSearch"
    on_missing: str | None = None
    # Map every failure :func:`translate_errors` leaves untranslated (a missing index, a 500) to
    # the store's, as a failed ``_msearch`` item is (``client.item_error``): for a search that
    # stands in for one (``BeliefStore._tiers_call``), so its caller sees the same errors.
    as_msearch_item: bool = False


# A read that yields Calls, is sent their responses, and returns a T.
Reads = Generator[Call, Any, T]


def _bound(client: Any, method: str) -> Any:
    target = client
    for part in method.split("."):
        target = getattr(target, part)
    return target


class _Stepper:
    """Feeds responses (or translated errors) back into a read, one request at a time."""

    def __init__(self, reads: Reads[Any]):
        self.reads = reads
        self.response: Any = None
        self.error: TenureError | None = None
        self.value: Any = None

    def next(self) -> Call | None:
        """The next request, or None once the read returned (its value is in ``value``)."""
        response, error = self.response, self.error
        self.response, self.error = None, None
        try:
            return self.reads.throw(error) if error is not None else self.reads.send(response)
        except StopIteration as finished:
            self.value = finished.value
            return None

    @contextmanager
    def answering(self, call: Call) -> Iterator[None]:
        """Around one request: its failure is mapped once and handed to the read at that point."""
        try:
            with translate_errors(call.action, on_missing=call.on_missing):
                yield
        except TenureError as exc:
            self.error = exc
        except os_exc.TransportError as exc:
            if not call.as_msearch_item:
                raise
            self.error = StoreUnavailable(f"OpenSearch could not {call.action} ({exc.status_code})")


def run(client: OpenSearch, reads: Reads[T]) -> T:
    """Run ``reads`` with the synchronous client."""
    step = _Stepper(reads)
    while (call := step.next()) is not None:
        with step.answering(call):
            step.response = _bound(client, call.method)(**call.params)
    return step.value  # type: ignore[no-any-return]


async def arun(client: AsyncOpenSearch, reads: Reads[T]) -> T:
    """Run ``reads`` with the asynchronous client (the same requests, awaited)."""
    step = _Stepper(reads)
    while (call := step.next()) is not None:
        with step.answering(call):
            step.response = await _bound(client, call.method)(**call.params)
    return step.value  # type: ignore[no-any-return]


def done(value: T) -> Reads[T]:
    """A read that needs no request (a cache hit): ``yield from done(x)`` is ``x``."""
    return value
    yield  # pragma: no cover - makes this a generator
