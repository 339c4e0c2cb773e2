"""The proxy's upstream calls in traces: httpx2 is not instrumented by OpenTelemetry, so the
upstream client opens its own client span and passes the trace context on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.config import MemoryLoopSettings
from service.proxy.upstream import Target, Upstream, UpstreamFailure
from service.telemetry import tracing


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", provider)  # what configure_tracing installs
    yield exporter
    provider.shutdown()


def _post(status: int, body: bytes) -> tuple[dict[str, str], Any]:
    """POST through the upstream client to a loopback server answering ``status`` and ``body``;
    the request headers the server saw, and the result (or the failure raised)."""
    return _call(status, body, lambda upstream, target: upstream.post_json(target, "/chat/completions", {"model": "m"}))


def _call(status: int, body: bytes, call: Callable[[Upstream, Target], Awaitable[Any]]) -> tuple[dict[str, str], Any]:
    """``call`` the upstream client against a loopback server answering ``status`` and ``body``."""
    seen: dict[str, str] = {}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        for line in head.split("\r\n")[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                seen[name.strip().lower()] = value.strip()
        await reader.readexactly(int(seen.get("content-length", "0")))
        reply = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(reply.encode() + body)
        await writer.drain()
        writer.close()

    async def run() -> Any:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        upstream = Upstream(MemoryLoopSettings())
        target = Target(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", {"Authorization": "Bearer k"})
        try:
            return await call(upstream, target)
        except UpstreamFailure as exc:
            return exc
        finally:
            await upstream.aclose()
            server.close()

    result = asyncio.run(run())
    return seen, result


def test_a_traced_model_call_has_a_client_span_and_passes_the_trace_on(spans: InMemorySpanExporter) -> None:
    seen, result = _post(200, b'{"choices": []}')
    assert result == {"choices": []}
    (span,) = spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["http.request.method"] == "POST"
    assert str(span.attributes["url.full"]).endswith("/chat/completions")
    assert span.attributes["http.response.status_code"] == 200
    # W3C trace context: the upstream's spans join this trace
    assert seen["traceparent"].split("-")[1] == format(span.context.trace_id, "032x")
    assert seen["authorization"] == "Bearer k"


def test_an_upstream_failure_marks_the_span(spans: InMemorySpanExporter) -> None:
    _, result = _post(503, b'{"error": {"message": "overloaded"}}')
    assert isinstance(result, UpstreamFailure) and result.status == 502
    (span,) = spans.get_finished_spans()
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 503
    assert not span.status.is_ok


def test_the_model_list_is_traced_too(spans: InMemorySpanExporter) -> None:
    async def models(upstream: Upstream, target: Target) -> Any:
        return await upstream.get_json(target, "/models", timeout_s=5)

    seen, result = _call(200, b'{"data": [{"id": "m"}]}', models)
    assert result == {"data": [{"id": "m"}]}
    (span,) = spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["http.request.method"] == "GET"
    assert str(span.attributes["url.full"]).endswith("/models")
    assert seen["traceparent"].split("-")[1] == format(span.context.trace_id, "032x")


def test_without_tracing_nothing_is_added() -> None:
    assert tracing._provider is None
    seen, result = _post(200, b'{"choices": []}')
    assert result == {"choices": []}
    assert "traceparent" not in seen


def test_a_key_put_in_a_request_path_keeps_only_its_id_in_the_server_span() -> None:
    """The access log redacts a whole API key sent in a path; the request's server span recorded
    the path as sent (``http.target``, ``url.path``, ``http.url``) for whoever reads the traces."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from service.auth import keys

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = FastAPI()

    @app.delete("/v1/admin/keys/{key_id}")
    def revoke(key_id: str) -> dict[str, str]:
        return {"key_id": key_id}

    tracing.instrument_app(app, keys.redacted, tracer_provider=provider)
    secret = "S" * 43
    whole = f"tnr_0123456789abcdef_{secret}"
    with TestClient(app) as client:
        assert client.delete(f"/v1/admin/keys/{whole}").status_code == 200
        assert client.delete("/v1/admin/keys/0123456789abcdef").status_code == 200
    finished = exporter.get_finished_spans()
    assert finished
    recorded = [str(v) for span in finished for v in (span.attributes or {}).values()] + [s.name for s in finished]
    assert not any(secret in value for value in recorded), recorded
    assert any("tnr_0123456789abcdef_[redacted]" in value for value in recorded), recorded
    assert any(value.endswith("/v1/admin/keys/0123456789abcdef") for value in recorded), recorded
    provider.shutdown()
