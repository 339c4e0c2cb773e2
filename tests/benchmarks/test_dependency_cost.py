"""benchmarks/dependency_cost.py: its three routes answer, every route is measured, and its
``flat`` shape is the one the real recall route resolves (one dependency taking the bearer scheme
and the session header), so the figure it prints is the route's."""

from __future__ import annotations

import asyncio

from fastapi.routing import APIRoute

from benchmarks.dependency_cost import ROUTES, app, call, measure
from service.api.routes.recall import router


def test_every_route_answers_and_is_measured() -> None:
    api = app()
    assert [asyncio.run(call(api, route)) for route in ROUTES] == [200, 200, 200]
    figures = asyncio.run(measure(calls=5, rounds=2))
    for route in ROUTES:
        assert len(figures[route]["by_round"]) == 2 and figures[route]["cpu_us_per_request"] > 0


def _shape(route: APIRoute) -> list[tuple[str, list[str]]]:
    """Each dependency of the route (by its function's name) with the names of its own."""
    return [
        (d.call.__name__, sorted(type(s.call).__name__ for s in d.dependencies))  # type: ignore[union-attr]
        for d in route.dependant.dependencies
    ]


def test_the_recall_route_resolves_the_flat_shape() -> None:
    (recall,) = [r for r in router.routes if isinstance(r, APIRoute) and r.path == "/v1/recall"]
    model = [r for r in app().routes if isinstance(r, APIRoute) and r.path == "/flat"][0]
    assert _shape(recall) == [("recall_caller", ["HTTPBearer"])]
    assert [(name, deps) for name, deps in _shape(model)] == [("caller_of", ["HTTPBearer"])]
    header = [p.alias for p in recall.dependant.dependencies[0].header_params]
    assert header == ["X-Tenure-Session"] == [p.alias for p in model.dependant.dependencies[0].header_params]
