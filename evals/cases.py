"""Case sets: a corpus of beliefs plus static cases and multi-turn sessions (evals/README.md).

The paper's set is read from ``../shared/eval-data/tenure-paper-v1/`` (MIT, see its LICENSE) or
from ``TENURE_PAPER_EVAL_DIR``; it is not copied into this repository.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.domain.principal import Principal

REPO = Path(__file__).resolve().parents[1]
PAPER_DIR = Path(os.environ.get("TENURE_PAPER_EVAL_DIR", REPO.parent / "shared" / "eval-data" / "tenure-paper-v1"))
MULTILINGUAL_DIR = REPO / "evals" / "data" / "multilingual-v1"
DEFAULT_USER = "test-user"


@dataclass(frozen=True)
class StaticCase:
    case_id: str
    scope: list[str]
    query: str
    expect: dict[str, Any]
    user_id: str = DEFAULT_USER
    budget: dict[str, Any] | None = None
    category: str | None = None
    description: str = ""


@dataclass(frozen=True)
class SessionTurn:
    index: int
    label: str
    scope: list[str]
    user_message: str
    expect: dict[str, Any]
    create_belief: dict[str, Any] | None = None
    add_aliases: tuple[str, list[str]] | None = None


@dataclass(frozen=True)
class Session:
    case_id: str
    turns: list[SessionTurn]
    user_id: str = DEFAULT_USER
    description: str = ""


@dataclass(frozen=True)
class UserGrants:
    """The shared scopes a case set's user holds (``users.json``): ``project:<p>`` and ``team:<t>``
    beliefs reach whoever holds the grant, whoever owns them."""

    projects: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()


@dataclass
class CaseSet:
    name: str
    beliefs: list[dict[str, Any]]
    static: list[StaticCase] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    # users with shared-scope grants; a user not named here holds none (the paper's set names none)
    users: dict[str, UserGrants] = field(default_factory=dict)

    def principal(self, tenant_id: str, user_id: str) -> Principal:
        """The identity a case runs as: its user, with the grants ``users.json`` gives them."""
        grants = self.users.get(user_id, UserGrants())
        return Principal(
            tenant_id=tenant_id, user_id=user_id, projects=frozenset(grants.projects), teams=frozenset(grants.teams)
        )

    @property
    def total(self) -> int:
        return len(self.static) + sum(len(s.turns) for s in self.sessions)


def _static(raw: dict[str, Any]) -> StaticCase:
    return StaticCase(
        case_id=raw["caseId"],
        scope=list(raw.get("scope") or []),
        query=raw.get("query") or "",
        expect=raw.get("expect") or {},
        user_id=raw.get("userId") or DEFAULT_USER,
        budget=raw.get("budget"),
        category=raw.get("category"),
        description=raw.get("description", ""),
    )


def _turn(raw: dict[str, Any]) -> SessionTurn:
    update = raw.get("updateBeliefAtTurn")
    return SessionTurn(
        index=int(raw["turnIndex"]),
        label=raw.get("label", ""),
        scope=list(raw.get("scope") or []),
        user_message=raw.get("userMessage") or "",
        expect=raw.get("expect") or {},
        create_belief=raw.get("createBeliefAtTurn"),
        add_aliases=(update["beliefId"], list(update.get("addAliases") or [])) if update else None,
    )


def load_case_set(directory: Path, name: str | None = None) -> CaseSet:
    """Load a case set directory: ``beliefs.seed.json`` plus ``retrieval.cases.json`` and/or
    ``session-retrieval.cases.json``."""
    beliefs = json.loads((directory / "beliefs.seed.json").read_text())
    static_path = directory / "retrieval.cases.json"
    session_path = directory / "session-retrieval.cases.json"
    static = [_static(c) for c in json.loads(static_path.read_text())] if static_path.exists() else []
    sessions = []
    if session_path.exists():
        for raw in json.loads(session_path.read_text()):
            sessions.append(
                Session(
                    case_id=raw["caseId"],
                    turns=[_turn(t) for t in raw["turns"]],
                    user_id=raw.get("userId") or DEFAULT_USER,
                    description=raw.get("description", ""),
                )
            )
    users_path = directory / "users.json"
    users = {
        user: UserGrants(projects=tuple(g.get("projects") or ()), teams=tuple(g.get("teams") or ()))
        for user, g in (json.loads(users_path.read_text()) if users_path.exists() else {}).items()
    }
    return CaseSet(name=name or directory.name, beliefs=beliefs, static=static, sessions=sessions, users=users)


def paper_case_set() -> CaseSet:
    return load_case_set(PAPER_DIR, "tenure-paper-v1")


def multilingual_case_set() -> CaseSet:
    """Ours: Japanese, Chinese, German and Spanish beliefs and questions (evals/data/multilingual-v1)."""
    return load_case_set(MULTILINGUAL_DIR, "multilingual-v1")
