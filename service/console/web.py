"""Console plumbing shared by its pages: templates, the signed-in user, CSRF, HTML errors.

Every console page is an ordinary FastAPI route whose handler calls the same domain services as the
REST API with the same :class:`Actor`; nothing here touches OpenSearch. A session cookie replaces the
bearer header, and :func:`console_user` re-validates the credential behind it on every request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from python_multipart.exceptions import FormParserError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.templating import Jinja2Templates

from service.api.deps import actor_of, get_services, raw_services
from service.api.state import Services
from service.auth.actor import Actor
from service.auth.authenticator import Identity
from service.console.sessions import COOKIE, ConsoleSession, SessionStore
from service.domain.accounts import is_operator
from service.domain.principal import Principal
from service.errors import ErrorCode, Forbidden, NotFound, TenureError, Unauthenticated

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
PREFIX = "/console"
OPERATOR_KIND = "operator"  # actor_kind of what an operator does in a tenant they switched to

_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates = Jinja2Templates(env=_env)


def session_store(services: Services) -> SessionStore:
    api = services.settings.api
    return SessionStore(
        services.redis,
        services.settings.opensearch_namespace,
        idle_s=api.console_session_idle_s,
        max_s=api.console_session_max_s,
    )


def secure_cookies(services: Services) -> bool:
    """Secure cookies everywhere but a development deployment on plain http."""
    return services.settings.environment != "development"


@dataclass(frozen=True)
class ConsoleUser:
    """Who is signed in (``identity``, re-validated) and as whom the pages act (``actor``): the
    identity itself, or, for an operator who switched tenants, the admin of that tenant that
    :meth:`ProvisioningService.acting_admin` makes of them (the REST API's rule for operators)."""

    session: ConsoleSession
    identity: Identity
    actor: Actor

    @property
    def principal(self) -> Principal:
        """The principal every page's service calls use (the tenant shown)."""
        return self.actor.principal

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin

    @property
    def is_operator(self) -> bool:
        return is_operator(self.identity.principal)

    @property
    def own_actor(self) -> Actor:
        """The signed-in credential's own actor, whatever tenant is shown."""
        return replace(self.actor, principal=self.identity.principal, kind=self.identity.kind)

    @property
    def switched(self) -> bool:
        """An operator looking at another tenant than their own."""
        return self.principal.tenant_id != self.identity.principal.tenant_id


class LoginRequired(Exception):
    """No (live) session: GET pages redirect to the sign-in page, posts answer 401."""


def console_user(request: Request, services: Annotated[Services, Depends(get_services)]) -> ConsoleUser:
    cookie = request.cookies.get(COOKIE)
    session = session_store(services).load(cookie) if cookie else None
    if session is None:
        raise LoginRequired()
    try:
        identity = services.authenticator.revalidate(session.identity())
    except Unauthenticated:
        session_store(services).revoke(session.session_id)
        raise LoginRequired() from None
    services.limiter.charge(identity, read_only=request.method in ("GET", "HEAD"))
    actor = actor_of(request, identity, None)
    if session.viewing_tenant is not None and is_operator(identity.principal):
        actor = _operator_view(services, session, actor)
    user = ConsoleUser(session=session, identity=identity, actor=actor)
    request.state.console_user = user
    return user


def _operator_view(services: Services, session: ConsoleSession, actor: Actor) -> Actor:
    """An operator's actor in the tenant they chose: the admin principal the provisioning service
    grants operators there (no shared-scope grants of anyone), recorded as ``actor_kind`` operator.
    A tenant deleted since falls back to the operator's own."""
    try:
        acting = services.provisioning.acting_admin(actor.principal, session.viewing_tenant or "")
    except NotFound:
        session_store(services).view_tenant(session, None)
        return actor
    # the write version read with the rate limit is the operator's own tenant's, not this one's:
    # unknown here, so recall's filter-tier cache is not used for this tenant
    return replace(actor, principal=acting, kind=OPERATOR_KIND, write_version=None)


CurrentUser = Annotated[ConsoleUser, Depends(console_user)]


def admin_user(user: CurrentUser) -> ConsoleUser:
    if not user.is_admin:
        raise Forbidden("this page needs the admin role")
    return user


AdminUser = Annotated[ConsoleUser, Depends(admin_user)]


async def checked_form(request: Request, user: CurrentUser) -> dict[str, str]:
    """The posted form, after its CSRF token matched the session's (403 otherwise). Every
    state-changing console route depends on this. A body that is not a readable form (a broken
    multipart upload) is a 400 page, not a parse error escaping as a 500."""
    try:
        form = await request.form()
    except (FormParserError, MultiPartException) as exc:
        raise TenureError(f"the form could not be read: {exc}", code=ErrorCode.BAD_REQUEST) from exc
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    if not user.session.csrf_ok(fields.get("csrf_token")):
        raise Forbidden("the form's CSRF token is missing or does not match this session; reload the page")
    return fields


Form = Annotated[dict[str, str], Depends(checked_form)]


def writer(user: CurrentUser, _form: Form) -> ConsoleUser:
    """Console changes are for admins: members get a read-only view of what they may see."""
    if not user.is_admin:
        raise Forbidden("the console is read-only for members")
    return user


Writer = Annotated[ConsoleUser, Depends(writer)]


def page(request: Request, template: str, *, status_code: int = 200, **context: Any) -> HTMLResponse:
    user: ConsoleUser | None = getattr(request.state, "console_user", None)
    notice = request.query_params.get("notice")
    if not (notice and user and user.session.notice_ok(notice, request.query_params.get("sig", ""))):
        notice = None  # only what the console itself said to this session (see :func:`redirect`)
    response = templates.TemplateResponse(
        request,
        template,
        {
            "user": user,
            "csrf_token": user.session.csrf_token if user else "",
            "prefix": PREFIX,
            "notice": notice,
            **context,
        },
        status_code=status_code,
    )
    response.headers["Cache-Control"] = "no-store"
    return response


DANGEROUS = frozenset({"erase", "retract", "revoke", "disable", "reject"})


def confirm(
    request: Request, *, action: str, what: str, form: dict[str, str], action_url: str, cancel_url: str, nav: str
) -> HTMLResponse:
    """The confirmation step of a console action: the same form again, with ``confirmed=yes``."""
    fields = {k: v for k, v in form.items() if k not in ("csrf_token", "confirmed")}
    return page(
        request,
        "confirm.html",
        nav=nav,
        action=action,
        what=what,
        fields=fields,
        action_url=f"{PREFIX}{action_url}",
        cancel_url=f"{PREFIX}{cancel_url}",
        danger=action in DANGEROUS,
    )


def confirmed(form: dict[str, str]) -> bool:
    return form.get("confirmed") == "yes"


def redirect(path: str, *, notice: str | None = None, user: ConsoleUser | None = None) -> RedirectResponse:
    """A 303 to a console page; a ``notice`` for ``user``'s next page goes with their session's
    signature, so that a notice in a link someone else wrote is never shown as the console's."""
    url = f"{PREFIX}{path}"
    if notice:
        if user is None:
            raise ValueError("a notice is signed for the session it is shown to: pass its user")
        signed = urlencode({"notice": notice, "sig": user.session.notice_mac(notice)}, quote_via=quote)
        url += ("&" if "?" in url else "?") + signed
    return RedirectResponse(url, status_code=303)


def _error_page(request: Request, status_code: int, code: str, message: str) -> Response:
    return page(request, "error.html", status_code=status_code, code=code, message=message)


# Every console answer: the console runs no script at all (server-rendered pages, plain forms, one
# local stylesheet, inline SVG), so the policy allows none; no page may be framed (a same-site page
# would get the SameSite=Strict cookie along and could overlay a confirmation's button).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class ConsoleRoute(APIRoute):
    """Errors on console pages become HTML pages with the same status and code the REST API
    would answer with; a missing session sends a browser to the sign-in page. Every answer
    carries :data:`SECURITY_HEADERS`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            response = await answer(request)
            response.headers.update(SECURITY_HEADERS)
            return response

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired:
                if request.url.path == f"{PREFIX}/logout":  # signed out already (another tab, the idle timeout)
                    gone = redirect("/login")
                    gone.delete_cookie(COOKIE, path=PREFIX)
                    return gone
                if request.method in ("GET", "HEAD"):
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"{PREFIX}/login?next={quote(target)}", status_code=303)
                return _error_page(request, 401, ErrorCode.UNAUTHENTICATED.value, "sign in again")
            except TenureError as exc:
                return _error_page(request, exc.code.http_status, exc.code.value, exc.message)
            except StarletteHTTPException as exc:  # the framework's own, e.g. a body it could not parse
                code = next((c for c in ErrorCode if c.http_status == exc.status_code), ErrorCode.BAD_REQUEST)
                return _error_page(request, exc.status_code, code.value, str(exc.detail))
            except RequestValidationError as exc:
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
                return _error_page(request, 422, ErrorCode.VALIDATION_ERROR.value, problems)

        return guarded


def safe_next(target: str | None) -> str:
    """Only a console path may follow a sign-in (no open redirect)."""
    if target and target.startswith(PREFIX + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return PREFIX + "/"


__all__ = [
    "AdminUser",
    "ConsoleRoute",
    "ConsoleUser",
    "CurrentUser",
    "Form",
    "Writer",
    "page",
    "raw_services",
    "redirect",
    "session_store",
]
