"""Who is asking. Built from verified credentials only; everything downstream trusts it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Role(str, Enum):
    MEMBER = "member"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    user_id: str
    roles: frozenset[Role] = field(default_factory=lambda: frozenset({Role.MEMBER}))
    projects: frozenset[str] = frozenset()
    teams: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.tenant_id or not self.user_id:
            raise ValueError("a principal needs a tenant and a user")

    @property
    def is_admin(self) -> bool:
        return Role.ADMIN in self.roles

    @property
    def shared_grants(self) -> frozenset[str]:
        """The shared scope labels this principal may read and write."""
        return frozenset({f"project:{p}" for p in self.projects} | {f"team:{t}" for t in self.teams})

    def may_use_scope(self, label: str) -> bool:
        """Personal scopes are always the caller's own; shared ones need a grant."""
        if label.startswith(("project:", "team:")):
            return label in self.shared_grants
        return True
