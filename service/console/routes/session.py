"""Sign-in (an API key or a development JWT for a session cookie), sign-out, the home page."""

from __future__ import annotations

import re
import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import RedirectResponse

from service.api.deps import ServicesDep, client_address
from service.console.charts import bar_chart, column_chart
from service.console.overview import INJECTION_DAYS, OverviewService
from service.console.sessions import COOKIE, LOGIN_CSRF_COOKIE, same_token
from service.console.web import (
    PREFIX,
    ConsoleRoute,
    CurrentUser,
    page,
    redirect,
    safe_next,
    secure_cookies,
    session_store,
)
from service.console.web import Form as CheckedForm
from service.errors import Forbidden, Unauthenticated
from service.recall.audit_trail import AuditTrail
from service.storage.turns import TurnStore

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
LOGIN_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")  # what secrets.token_urlsafe(32) makes


def _login_page(
    request: Request, services: ServicesDep, *, next_: str, error: str | None, status_code: int
) -> Response:
    # The browser's token while it lasts: a second sign-in page (another tab) must not void the first.
    kept = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    token = kept if LOGIN_TOKEN_RE.fullmatch(kept) else secrets.token_urlsafe(32)
    response = page(request, "login.html", status_code=status_code, login_csrf=token, next=next_, error=error)
    # Double-submit token for the one form posted before a session exists (login CSRF).
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        token,
        max_age=600,
        path=PREFIX,
        httponly=True,
        secure=secure_cookies(services),
        samesite="strict",
    )
    return response


@router.get("/login")
def login_form(request: Request, services: ServicesDep, next: str | None = None) -> Response:  # noqa: A002
    return _login_page(request, services, next_=safe_next(next), error=None, status_code=200)


@router.post("/login")
def login(
    request: Request,
    services: ServicesDep,
    credential: Annotated[str, Form(max_length=8192)] = "",
    login_csrf: Annotated[str, Form(max_length=200)] = "",
    next: Annotated[str, Form(max_length=2000)] = "",  # noqa: A002
) -> Response:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE)
    if not expected or not same_token(expected, login_csrf):
        raise Forbidden("the sign-in form expired or was not posted from this console; reload it")
    try:
        identity = services.guard.authenticate(credential.strip(), client_address(request))
    except Unauthenticated as exc:
        return _login_page(request, services, next_=safe_next(next), error=exc.message, status_code=401)
    session = session_store(services).open(identity)
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(
        COOKIE,
        session.session_id,
        max_age=int(session.expires_at - session.created_at),
        path=PREFIX,
        httponly=True,
        secure=secure_cookies(services),
        samesite="strict",
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=PREFIX)
    return response


@router.post("/logout")
def logout(user: CurrentUser, services: ServicesDep, _form: CheckedForm) -> Response:
    session_store(services).revoke(user.session.session_id)
    response = redirect("/login")
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, secure=secure_cookies(services), samesite="strict")
    return response


@router.get("/")
def home(request: Request, user: CurrentUser, services: ServicesDep) -> Response:
    ns = services.settings.opensearch_namespace
    audit = AuditTrail(services.audit, services.receipts)
    figures = OverviewService(services.store, audit, TurnStore(services.opensearch, ns)).overview(user.principal)
    charts = [
        bar_chart(figures.by_type, title="Beliefs by type"),
        bar_chart(figures.by_lifecycle, title="Beliefs by lifecycle"),
        bar_chart(figures.by_scope, title="Beliefs by scope (top 12)"),
    ]
    if user.is_admin:
        charts += [
            column_chart(figures.injections_per_day, title=f"Injections per day, last {INJECTION_DAYS} days"),
            bar_chart(figures.extraction_outcomes, title="Extraction outcomes (turns)"),
        ]
    return page(request, "home.html", figures=figures, charts=charts)
