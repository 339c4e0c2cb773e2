"""Optional OpenTelemetry traces: off unless ``TENURE_OBSERVABILITY_TRACING_ENABLED=true``.

Needs the ``tracing`` extra (``pip install 'tenure-service[tracing]'``). Spans of FastAPI, httpx,
Celery, Redis and opensearch-py (through urllib3, its transport), and of the proxy's upstream calls
(httpx2, which OpenTelemetry does not instrument: :func:`client_span`), go to an OTLP/HTTP
exporter configured by the standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``...). The packages are imported only when tracing is
switched on, so a deployment without the extra pays nothing; switched on without it, start-up fails
with a message naming the extra.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

_PACKAGES = (
    "opentelemetry.sdk",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.instrumentation.fastapi",
    "opentelemetry.instrumentation.httpx",
    "opentelemetry.instrumentation.celery",
    "opentelemetry.instrumentation.redis",
    "opentelemetry.instrumentation.urllib3",
)
# The provider configure_tracing installed (None: tracing is off in this process).
_provider: Any = None


class TracingUnavailable(RuntimeError):
    """Tracing was switched on but the ``tracing`` extra is not installed."""


def _require() -> None:
    missing = [name for name in _PACKAGES if _absent(name)]
    if missing:
        raise TracingUnavailable(
            "TENURE_OBSERVABILITY_TRACING_ENABLED is set but OpenTelemetry is not installed "
            f"(missing {', '.join(missing)}): install the `tracing` extra"
        )


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:
        return True


def configure_tracing(service_name: str, exporter: Any = None) -> None:
    """Install the tracer provider and instrument the client libraries (once per process).
    ``exporter`` replaces the OTLP exporter (tests pass an in-memory one)."""
    global _provider
    if _provider is not None:
        return
    _require()
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.urllib3 import URLLib3Instrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    HTTPXClientInstrumentor().instrument()
    RedisInstrumentor().instrument()
    URLLib3Instrumentor().instrument()
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    _provider = provider  # last: configured only once everything is instrumented


def instrument_app(app: Any, redact: Callable[[str], str], tracer_provider: Any = None) -> None:
    """Server spans for every request of the FastAPI ``app`` (after :func:`configure_tracing`),
    their attributes passed through ``redact`` wherever the request path holds a credential's mark
    (an API key a client put in a path keeps only its id, as in the access log)."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    def redacted_attributes(span: Any, scope: dict[str, Any]) -> None:
        path = str(scope.get("path", ""))
        if span is None or not span.is_recording() or redact(path) == path:
            return
        for name, value in dict(getattr(span, "attributes", None) or {}).items():
            if isinstance(value, str) and redact(value) != value:
                span.set_attribute(name, redact(value))

    FastAPIInstrumentor.instrument_app(
        app,
        excluded_urls="healthz,readyz,metrics",
        server_request_hook=redacted_attributes,
        tracer_provider=tracer_provider,
    )


@contextmanager
def client_span(method: str, url: str, headers: MutableMapping[str, str]) -> Iterator[Any]:
    """A client span around one outgoing request sent by a library OpenTelemetry does not
    instrument (the proxy's upstream client, httpx2), with the trace context added to ``headers``
    so the upstream can join the trace. Yields the span (set its status with
    :func:`record_status`), or None when tracing is off: then nothing is imported or added."""
    if _provider is None:
        yield None
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    tracer = _provider.get_tracer("tenure.upstream")
    attributes = {"http.request.method": method, "url.full": url}
    with tracer.start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes) as span:
        propagate.inject(headers)
        yield span


def record_status(span: Any, status: int) -> None:
    """The answer's status on a :func:`client_span` span (an error status marks the span failed)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
