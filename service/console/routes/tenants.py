"""Operators choose the tenant the console shows. A tenant admin (or a member) cannot switch: the
choice is stored in the console session and honoured only while the re-validated credential is an
operator's, and every page then acts as the admin principal that
:meth:`ProvisioningService.acting_admin` grants operators in that tenant, the same as
``/v1/admin/...?tenant_id=`` does over REST. Nothing else changes: the same services, the same
grants and the same chokepoint decide what each page shows and allows."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.api.deps import ProvisioningDep, ServicesDep
from service.console.web import PREFIX, ConsoleRoute, ConsoleUser, CurrentUser, Form, page, redirect, session_store
from service.domain.accounts import SLUG_RE
from service.errors import Forbidden, ValidationFailed

router = APIRouter(prefix=f"{PREFIX}/tenants", route_class=ConsoleRoute, include_in_schema=False)


def _operator(user: ConsoleUser) -> ConsoleUser:
    if not user.is_operator:
        raise Forbidden("choosing the tenant is for operators (admins of the system tenant)")
    return user


@router.get("")
def tenants(request: Request, user: CurrentUser, prov: ProvisioningDep) -> Response:
    _operator(user)
    listed = prov.list_tenants(user.own_actor)  # an operator's act, not the shown tenant's admin's
    return page(request, "tenants.html", nav="tenants", tenants=listed, home=user.identity.principal.tenant_id)


@router.post("/view")
def view(user: CurrentUser, form: Form, prov: ProvisioningDep, services: ServicesDep) -> Response:
    _operator(user)
    tenant_id = form.get("tenant_id", "").strip()
    if not SLUG_RE.fullmatch(tenant_id):
        raise ValidationFailed("choose a tenant")
    home = user.identity.principal
    prov.acting_admin(home, tenant_id)  # 404 for a tenant that does not exist
    session_store(services).view_tenant(user.session, None if tenant_id == home.tenant_id else tenant_id)
    return redirect("/", notice=f"now showing tenant {tenant_id}", user=user)
