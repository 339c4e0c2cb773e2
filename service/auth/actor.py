"""The request context every service receives: who acts, with which credential, under which
request and session (for authorization and for the audit trail)."""

from __future__ import annotations

from dataclasses import dataclass

from service.domain.accounts import Credential
from service.domain.principal import Principal


@dataclass(frozen=True)
class Actor:
    """Who performs an operation and under which request (for authorization and audit)."""

    principal: Principal
    kind: str = "api_key"
    credential_id: str | None = None
    # which kind of credential resolved the principal's grants (None: no bearer credential, e.g. a
    # worker or the bootstrap); a turn records it, so its extraction judges grants the same way
    credential: Credential | None = None
    request_id: str | None = None
    session_id: str | None = None
    # the tenant's write version read with the rate limit (service/write_versions.py);
    # recall's filter-tier cache is used only when it is known
    write_version: int | None = None
