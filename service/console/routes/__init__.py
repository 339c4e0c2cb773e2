"""Console pages, one module per area; :data:`ROUTERS` is what :func:`install_console` mounts."""

from __future__ import annotations

from fastapi import APIRouter

from service.console.routes import audit, beliefs, recall, reviews, session, team, tenants, turns

ROUTERS: list[APIRouter] = [
    session.router,
    beliefs.router,
    recall.router,
    audit.router,
    reviews.router,
    turns.router,
    team.router,
    tenants.router,
]
