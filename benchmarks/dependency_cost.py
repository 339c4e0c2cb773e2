"""What FastAPI's dependency resolution costs per request, for the recall route's shapes.

The recall route resolved a reading actor and the recall service through six dependencies
(services, bearer scheme, identity, actor, session header, recall service) until 2026-12-04; it
now resolves one (``service.api.deps.recall_caller``, which calls the same functions itself). Over
HTTP the difference is below what this machine's drift lets a run see, so this script measures it
in process: a FastAPI app with three ``POST`` routes taking the recall's body model,

- ``nested``: the dependency tree the route had (each dependency an ``async def`` doing no work);
- ``flat``: one dependency taking the bearer scheme and the session header, as the route has now;
- ``bare``: the body alone (FastAPI's routing, validation and response, no dependency);

each called through the ASGI interface directly (no server, no socket), ``--calls`` times per
block, blocks alternating over ``--rounds`` rounds. Reports the CPU per request (median block).

    .venv/bin/python -m benchmarks.dependency_cost

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

# The parameters are what FastAPI resolves; the functions do no work with them on purpose.
# ruff: noqa: ARG001

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Message

from benchmarks.relevant_query_cost import keep_result
from service.api.routes.recall import RecallIn

ROUTES = ("nested", "flat", "bare")
BODY = json.dumps({"scopes": ["domain:code", "project:pay"], "query": "how should ledger_sync retry?"}).encode()
bearer = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
Session = Annotated[str | None, Header(alias="X-Tenure-Session", max_length=200)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="requests per block")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


class _Services:
    """Stands in for the app's services: the dependencies only pass it along."""


SERVICES = _Services()


async def services_of(request: Request) -> _Services:
    return SERVICES


Services = Annotated[_Services, Depends(services_of)]


async def identity_of(request: Request, services: Services, credentials: Credentials) -> str:
    return credentials.credentials if credentials else ""


async def actor_of(request: Request, identity: Annotated[str, Depends(identity_of)], session: Session = None) -> str:
    return identity


async def recall_service_of(services: Services) -> _Services:
    return services


async def caller_of(request: Request, credentials: Credentials, session: Session = None) -> tuple[str, _Services]:
    return (credentials.credentials if credentials else ""), await services_of(request)


def app() -> FastAPI:
    api = FastAPI()

    @api.post("/nested")
    async def nested(
        body: RecallIn,
        actor: Annotated[str, Depends(actor_of)],
        service: Annotated[_Services, Depends(recall_service_of)],
    ) -> Response:
        return Response(b"{}", media_type="application/json")

    @api.post("/flat")
    async def flat(body: RecallIn, caller: Annotated[tuple[str, _Services], Depends(caller_of)]) -> Response:
        return Response(b"{}", media_type="application/json")

    @api.post("/bare")
    async def bare(body: RecallIn) -> Response:
        return Response(b"{}", media_type="application/json")

    return api


async def call(api: FastAPI, route: str) -> int:
    """One ``POST /<route>`` through the ASGI interface; its status."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": f"/{route}",
        "raw_path": f"/{route}".encode(),
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "headers": [
            (b"authorization", b"Bearer tnr_key_secret"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    messages = iter([{"type": "http.request", "body": BODY, "more_body": False}])
    status = 0

    async def receive() -> Message:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await api(scope, receive, send)
    return status


async def measure(calls: int, rounds: int) -> dict[str, Any]:
    api = app()
    for route in ROUTES:
        if await call(api, route) != 200:
            raise RuntimeError(f"/{route} did not answer 200")
    cpu: dict[str, list[float]] = {route: [] for route in ROUTES}
    for r in range(rounds):
        for route in ROUTES[:: 1 if r % 2 == 0 else -1]:
            started = time.process_time()
            for _ in range(calls):
                await call(api, route)
            cpu[route].append((time.process_time() - started) / calls * 1e6)
    return {
        "calls": calls,
        "rounds": rounds,
        **{
            route: {
                "cpu_us_per_request": round(statistics.median(cpu[route]), 1),
                "by_round": [round(c, 1) for c in cpu[route]],
            }
            for route in ROUTES
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = asyncio.run(measure(args.calls, args.rounds))
    print(json.dumps(figures), flush=True)
    keep_result(args.out, "dependency_cost", argv, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
