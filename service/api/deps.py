"""Typed request dependencies. Routes declare what they need in their signature:

    def handler(principal: CurrentPrincipal, beliefs: BeliefsDep) -> ...

``CurrentPrincipal`` authenticates the bearer credential (API key or JWT); ``AdminPrincipal``
further
requires the admin role of the principal's tenant; ``CurrentActor`` adds the request id and session
for the audit trail. A route without one of them is public, and that is visible in its signature.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

import anyio.to_thread
from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.api.errors import request_id_of
from service.api.recall_ahead import RecallAhead
from service.api.state import Services, ensure_indices
from service.auth.actor import Actor
from service.auth.authenticator import Identity
from service.auth.ratelimit import SAFE_METHODS
from service.beliefs.api_service import BeliefService
from service.config import Settings
from service.domain.principal import Principal
from service.errors import Forbidden, StoreUnavailable, Unauthenticated, ValidationFailed
from service.extraction.failed_turns import FailedTurns
from service.provisioning.service import ProvisioningService
from service.recall.audit_trail import AuditTrail
from service.recall.service import Built, RecallService
from service.storage.beliefs import BeliefStore
from service.telemetry import context as work_context

bearer_scheme = HTTPBearer(
    scheme_name="BearerAuth",
    bearerFormat="JWT or tnr_<key id>_<secret> API key",
    description=("An API key issued by an admin, or a JWT (RS256/ES256 via JWKS; HS256 in development)."),
    auto_error=False,
)


def raw_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def get_services(request: Request) -> Services:
    """The shared services, once the indices exist. If OpenSearch was down at start-up the
    templates are applied by the first request that finds it back; until then: 503. (Every
    dependency here that does no blocking I/O is ``async def``: FastAPI runs a plain ``def``
    dependency on a worker thread, one hop per dependency per request.)"""
    services = raw_services(request)
    state = request.app.state
    if not state.indices_ready:
        # At most one attempt per retry interval, so an outage does not make every request wait
        # for a connection timeout.
        now = time.monotonic()
        if now - getattr(state, "indices_attempt_at", 0.0) >= services.settings.api.retry_after_s:
            state.indices_attempt_at = now
            state.indices_ready = await anyio.to_thread.run_sync(ensure_indices, services)
        if not state.indices_ready:
            raise StoreUnavailable(
                "OpenSearch is unreachable: the indices are not ready",
                retry_after_s=services.settings.api.retry_after_s,
            )
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings(services: ServicesDep) -> Settings:
    return services.settings


async def get_store(services: ServicesDep) -> BeliefStore:
    return services.store


async def get_beliefs(services: ServicesDep) -> BeliefService:
    return services.beliefs


async def get_recall(services: ServicesDep) -> RecallService:
    return services.recall


async def get_audit(services: ServicesDep) -> AuditTrail:
    return AuditTrail(services.audit, services.receipts)


async def get_provisioning(services: ServicesDep) -> ProvisioningService:
    return services.provisioning


async def get_failed_turns(services: ServicesDep) -> FailedTurns:
    """The tenant's turns for admins, and their retry (``/v1/admin/turns`` and the console's page)."""
    return FailedTurns(services.loop.turns, services.loop.queue, services.beliefs.lifecycle)


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[BeliefStore, Depends(get_store)]
BeliefsDep = Annotated[BeliefService, Depends(get_beliefs)]
RecallDep = Annotated[RecallService, Depends(get_recall)]
AuditDep = Annotated[AuditTrail, Depends(get_audit)]
ProvisioningDep = Annotated[ProvisioningService, Depends(get_provisioning)]
FailedTurnsDep = Annotated[FailedTurns, Depends(get_failed_turns)]


def client_address(request: Request) -> str | None:
    """The peer address (behind a proxy: what uvicorn's ``--proxy-headers`` made of it): the
    subject of the failed-authentication limit."""
    return request.client.host if request.client else None


async def authenticate(
    request: Request,
    services: Services,
    credentials: HTTPAuthorizationCredentials | None,
    *,
    read_only: bool,
    ahead: RecallAhead | None = None,
) -> Identity:
    """The one authentication path of every route (API, proxy, console, MCP over HTTP): verify the
    bearer credential, keep the identity on the request, charge the credential's token bucket
    (429 ``rate_limited`` when empty; a read is still answered when the limiter is down).

    On the event loop: an API key verified earlier in this process costs no I/O, and the rate
    limit is one awaited Redis round trip, which also reads the tenant's accounts version; one met
    for the first time is read there too when its tenant's version was read before. The
    cached credential serves only if that version is the one it was verified at (every account
    change bumps it once the change is visible), so a request that starts after a revoke, a
    disable or a grant change has returned is checked against the new records, in every process
    (``service/auth/authenticator.py``). Only a credential that needs the store or Redis to be
    verified otherwise (a JWT, a changed tenant, a refusal to count) goes to a worker thread.

    ``ahead``: a recall to start beside the round trip when the credential was cached and the
    tenant's write version is expected (``service/api/recall_ahead.py``); its caller takes it
    with the principal and write version returned here, or it is discarded."""
    if credentials is None or not credentials.credentials:
        raise Unauthenticated("missing bearer credentials (Authorization: Bearer <API key or JWT>)")
    token, client, guard = credentials.credentials, client_address(request), services.guard
    verified, loaded = guard.cached(token, client), False
    if verified is None:  # a first use: on the event loop when it can be, else on a worker thread
        verified, loaded = await guard.averify(token), True
        if verified is None:
            verified = await anyio.to_thread.run_sync(guard.verify, token, client)
    work_context.set_tenant(verified.identity.principal.tenant_id)  # every later log line names the tenant
    if ahead is not None and not loaded:
        expected = services.limiter.expected_write_version(verified.identity)
        if expected is not None:
            ahead.start(services.recall, verified.identity.principal, expected)  # checked by ahead.take
    try:
        versions = await services.limiter.acharge(verified.identity, read_only=read_only)
        # Loaded by this request at the version the round trip read (or Redis answered neither
        # time): nothing newer to check against. Anything else is confirmed by the version.
        current = loaded and verified.accounts_version == versions.accounts
        if not current and not services.authenticator.confirm(verified, versions.accounts):
            # The tenant's accounts changed since (or, Redis down, the time bound passed): the
            # records as they are now decide, tagged with the version just read.
            if ahead is not None:
                ahead.discard()  # started as the principal the credential was cached with
            verified = await anyio.to_thread.run_sync(guard.verify, token, client, versions.accounts)
    except BaseException:
        if ahead is not None:
            ahead.discard()
        raise
    request.state.identity = verified.identity
    request.state.write_version = versions.write
    return verified.identity


async def current_identity(
    request: Request,
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Identity:
    """A credential charged by the request's method: GET/HEAD/OPTIONS as reads, the rest as writes."""
    return await authenticate(request, services, credentials, read_only=request.method in SAFE_METHODS)


CurrentIdentity = Annotated[Identity, Depends(current_identity)]


async def current_principal(identity: CurrentIdentity) -> Principal:
    return identity.principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def admin_principal(principal: CurrentPrincipal) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this operation needs the admin role")
    return principal


AdminPrincipal = Annotated[Principal, Depends(admin_principal)]

SESSION_HEADER = "X-Tenure-Session"
SESSION_MAX_CHARS = 200


def actor_of(request: Request, identity: Identity, session_id: str | None) -> Actor:
    """The request context services receive: principal, credential, request id, session."""
    return Actor(
        principal=identity.principal,
        kind=identity.kind,
        credential_id=identity.credential_id,
        credential=identity.credential,
        request_id=request_id_of(request),
        session_id=session_id,
        write_version=getattr(request.state, "write_version", None),
    )


def _session(session: str | None) -> str | None:
    if session is not None and not session.strip():
        raise ValidationFailed(
            "empty session id",
            details=[{"loc": ["header", SESSION_HEADER], "msg": "must not be blank"}],
        )
    return session


async def current_actor(
    request: Request,
    identity: CurrentIdentity,
    session: Annotated[str | None, Header(alias=SESSION_HEADER, max_length=SESSION_MAX_CHARS)] = None,
) -> Actor:
    return actor_of(request, identity, _session(session))


CurrentActor = Annotated[Actor, Depends(current_actor)]


@dataclass(frozen=True)
class RecallCaller:
    """``POST /v1/recall``'s caller and the recall service; ``built``: its recall, when one
    started beside the rate limit's round trip was the one this caller would build."""

    actor: Actor
    recall: RecallService
    built: Built | None = None


async def recall_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    session: Annotated[str | None, Header(alias=SESSION_HEADER, max_length=SESSION_MAX_CHARS)] = None,
) -> RecallCaller:
    """For a POST that only reads (recall takes a body, changes no belief, and its receipt falls
    back to a direct audit write when Redis is down): charged as a read, so a limiter outage does
    not stop it. The route says so in its signature instead of a list of URL paths.

    One dependency where a reading actor and the recall service took six (services, bearer
    scheme, identity, actor, session header, recall service): recall is the hot route, and
    FastAPI's resolution costs ~25 µs of CPU per dependency per request (docs/benchmarks.md,
    issue 16)."""
    return await resolve_recall_caller(request, credentials, session)


async def resolve_recall_caller(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    session: str | None,
    ahead: RecallAhead | None = None,
) -> RecallCaller:
    """:func:`recall_caller` from its parameters, also for ``service.api.recall_lane``, which
    reads them without FastAPI, and with the validated body at hand passes ``ahead``: its recall,
    to start beside the rate limit's round trip (``service/api/recall_ahead.py``)."""
    services = await get_services(request)
    if not services.settings.api.recall_ahead:
        ahead = None
    identity = await authenticate(request, services, credentials, read_only=True, ahead=ahead)
    actor = actor_of(request, identity, _session(session))
    built = await ahead.take(identity.principal, actor.write_version) if ahead is not None else None
    return RecallCaller(actor, services.recall, built)


RecallCallerDep = Annotated[RecallCaller, Depends(recall_caller)]
