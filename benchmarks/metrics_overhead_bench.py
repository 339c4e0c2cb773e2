"""Metrics and access-log overhead per request (issue 14: must stay under 0.3 ms at p50).

One FastAPI app with one trivial route, driven in-process through ASGI (no sockets, so the
network and the server do not drown the difference), with the service's own
``RequestContextMiddleware`` in two variants, measured in alternating batches:

- ``observed``: as the service runs: the work context, the latency histogram by route template,
  the JSON access line (INFO, to a discarded stream, so the formatting cost is paid);
- ``bare``: the same middleware with the observation step and the context replaced by no-ops.

The overhead is the difference of the per-request medians (and of the p90s).

    .venv/bin/python -m benchmarks.metrics_overhead_bench --requests 20000 \
        --out benchmarks/results/metrics-overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from service.api import errors as api_errors
from service.telemetry import context as work_context
from service.telemetry.logs import configure_logging


def _app() -> Any:
    app = FastAPI()

    @app.get("/v1/things/{thing_id}")
    def thing(thing_id: str) -> PlainTextResponse:
        return PlainTextResponse(thing_id)

    return api_errors.RequestContextMiddleware(app, max_body_bytes=1_000_000)


async def _call(app: Any, i: int) -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/v1/things/t{i}",
        "raw_path": f"/v1/things/t{i}".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1),
        "server": ("bench", 80),
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:  # noqa: ARG001 - the response is discarded
        return None

    await app(scope, receive, send)


async def _batch(app: Any, n: int, start: int) -> list[float]:
    times = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        await _call(app, i)
        times.append(time.perf_counter() - t0)
    return times


def _nothing(*_: Any) -> None:
    return None


class _Discard(io.TextIOBase):
    """A log stream that formats and drops: the line's cost without a buffer that grows."""

    def write(self, text: str) -> int:
        return len(text)


class _Bare:
    """Swap the observation out (and back) for the ``bare`` variant."""

    def __enter__(self) -> None:
        self.saved = (api_errors.observe_request, work_context.begin, work_context.end)
        api_errors.observe_request = _nothing
        work_context.begin = _nothing  # type: ignore[assignment]
        work_context.end = _nothing

    def __exit__(self, *exc: object) -> None:
        api_errors.observe_request, work_context.begin, work_context.end = self.saved


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(requests: int, batch: int) -> dict[str, Any]:
    configure_logging("json", "INFO", stream=_Discard())  # the access line is formatted and written
    app = _app()
    await _batch(app, 500, 0)  # warm-up
    observed: list[float] = []
    bare: list[float] = []
    for start in range(0, requests, batch):
        observed += await _batch(app, batch, start)
        with _Bare():
            bare += await _batch(app, batch, start)
    ms = 1000
    result = {
        "requests_per_variant": len(observed),
        "observed_p50_ms": statistics.median(observed) * ms,
        "bare_p50_ms": statistics.median(bare) * ms,
        "observed_p90_ms": _quantile(observed, 0.9) * ms,
        "bare_p90_ms": _quantile(bare, 0.9) * ms,
    }
    result["overhead_p50_ms"] = result["observed_p50_ms"] - result["bare_p50_ms"]
    result["overhead_p90_ms"] = result["observed_p90_ms"] - result["bare_p90_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(run(args.requests, args.batch))
    text = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
