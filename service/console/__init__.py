"""The admin console: server-rendered pages under ``/console`` in the API's own app (Jinja2, plain
HTML forms, one local stylesheet; no script, no build step). See ``docs/console.md``."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def install_console(app: FastAPI) -> None:
    """Mount the console's pages and its static files on ``app``."""
    from service.console.routes import ROUTERS
    from service.console.web import PREFIX, STATIC_DIR

    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    for router in ROUTERS:
        app.include_router(router)
