"""``tenure``: the team's memory from a shell, built on the Python SDK (``tenure_client``), Typer and rich.

    tenure bootstrap                      # first operator key, written directly (needs OpenSearch)
    export TENURE_CLI_KEY=tnr_...         # then everything else goes over HTTP
    tenure create-tenant acme
    tenure create-user acme alice --project payments
    tenure issue-key acme alice
    tenure add session_cache --type decision --scope project:payments --alias redis \\
        --content "Sessions live in Redis." --why "Never add sticky sessions."
    tenure list --scope project:payments          # a table on a terminal, JSON with --json or in a pipe
    tenure recall --scope project:payments "how do we cache sessions?"
    tenure import beliefs.jsonl                   # chunked to the server's limit, with progress
    tenure mcp                                    # the MCP server over stdio (docs/mcp.md)

Operator commands that talk to OpenSearch directly (TENURE_OPENSEARCH_URL, TENURE_OPENSEARCH_NAMESPACE):

    tenure apply-templates                # every index template and alias a deployment needs
    tenure apply-retention                # delete audit events and turns past their retention now
    tenure reindex beliefs                # template upgrade: copy into generation N+1, swap the alias
    tenure merge-segments beliefs         # after bulk imports: one segment per shard (faster recall)

The API URL and key come from ``--url``/``--key`` or ``TENURE_CLI_URL``/``TENURE_CLI_KEY``. Output
is a table on a terminal and JSON otherwise (``--json`` forces it; JSONL for export). An error
prints what went wrong and what to do (as the service's JSON error shape in JSON mode) and exits 1.
When the reader of the output goes away (``tenure export | head``) it stops without a word and
exits 141, as a tool ended by SIGPIPE does.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import httpx
import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from tenure_client import Tenure, TenureError, chunked
from tenure_client.errors import (
    AuthenticationFailed,
    ConnectionFailed,
    IncompleteAnswer,
    PermissionDenied,
    UnexpectedAnswer,
)
from typer._click.exceptions import ClickException  # Typer vendors its own Click

from service.config import CliSettings, Settings, get_settings

if TYPE_CHECKING:
    from opensearchpy import OpenSearch

    from service.storage.templates import IndexFamily


class CliError(Exception):
    """A failure the CLI reports itself, in the service's error shape."""

    def __init__(self, payload: dict[str, Any], status: int | None = None):
        super().__init__(str(payload))
        self.payload = payload
        self.status = status


def _error(code: str, message: str, hint: str | None = None) -> CliError:
    body: dict[str, Any] = {"code": code, "message": message}
    if hint:
        body["hint"] = hint
    return CliError({"error": body})


# ------------------------------------------------------------------ state and output


@dataclass
class State:
    """What one invocation runs with: streams, output mode, and how to reach the API."""

    out: TextIO
    err: TextIO
    http: httpx.Client | None = None
    settings: Settings | None = None
    url: str | None = None
    key: str | None = field(default=None, repr=False)  # a credential: never in a log line or a traceback's locals
    json_mode: bool = False
    session: str | None = None
    _api: Tenure | None = field(default=None, repr=False)

    @property
    def console(self) -> Console:
        return Console(file=self.out, soft_wrap=True)

    @property
    def err_console(self) -> Console:
        return Console(file=self.err, stderr=True)

    @property
    def interactive(self) -> bool:
        return not self.json_mode and self.out.isatty()

    def api(self) -> Tenure:
        if self._api is None:
            cli = _cli_settings()
            key = self.key or (cli.key.get_secret_value() if cli.key else None)
            _check_key(key)
            url = self.url or cli.url
            try:
                self._api = Tenure(url, key, timeout=cli.timeout_s, session_id=self.session, http_client=self.http)
            except httpx.InvalidURL as exc:
                hint = "set TENURE_CLI_URL or --url to the API's base URL, e.g. https://tenure.example.com"
                raise _error("validation_error", f"{url} is not a URL: {exc}", hint) from exc
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()


STATE: State = State(out=sys.stdout, err=sys.stderr)


def _cli_settings() -> CliSettings:
    """The TENURE_CLI_* settings, or an error naming the one that is no value of its kind."""
    try:
        return CliSettings()
    except ValidationError as exc:
        wrong = exc.errors()[0]
        name = "TENURE_CLI_" + "_".join(str(part) for part in wrong["loc"]).upper()
        raise _error("validation_error", f"{name}: {wrong['msg']}", f"fix {name} or unset it") from exc


def _check_key(key: str | None) -> None:
    """Say what is wrong with the credential before the server has to."""
    if not key:
        raise _error(
            "unauthenticated",
            "no credential",
            "set TENURE_CLI_KEY (an API key from your admin: tenure issue-key TENANT USER) or pass --key",
        )
    if not key.startswith("tnr_") and key.count(".") != 2:
        raise _error(
            "unauthenticated",
            "this is not a Tenure key",
            "API keys start with tnr_ (tenure issue-key), JWTs have three dot-separated parts",
        )


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def emit(data: Any, table: Callable[[Any], Table | str] | None = None) -> None:
    """JSON for scripts (``--json``, or output that is not a terminal), a table for people."""
    plain = _plain(data)
    if STATE.interactive and table is not None:
        STATE.console.print(table(plain))
    elif isinstance(plain, str):
        STATE.out.write(plain + "\n")
    else:
        STATE.out.write(json.dumps(plain, indent=2, ensure_ascii=False) + "\n")


def _table(rows: list[dict[str, Any]], columns: Sequence[str], title: str | None = None) -> Table:
    table = Table(title=title, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=column in NO_WRAP)
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    return table


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else ""
    return str(value)


def _record(data: dict[str, Any]) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for key, value in data.items():
        if key in ("change_log", "provenance") or value in (None, [], ""):
            continue
        table.add_row(key, _cell(value))
    return table


def _page_table(columns: Sequence[str]) -> Callable[[Any], Table]:
    def render(page: dict[str, Any]) -> Table:
        more = " (more: --all-pages)" if page.get("next_cursor") else ""
        return _table(page["items"], columns, title=f"{len(page['items'])} shown{more}")

    return render


BELIEF_COLUMNS = ("canonical_name", "type", "scope", "aliases", "pinned", "id")
NO_WRAP = frozenset({"canonical_name", "id", "key_id", "user_id"})


def _progress(transient: bool = False) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=STATE.err, stderr=True),
        transient=transient,
        disable=not STATE.err.isatty(),
    )


# ---------------------------------------------------------------------------- app

app = typer.Typer(
    name="tenure",
    help="Tenure team service: the team's memory from a shell (over HTTP; operator commands talk to OpenSearch).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
aliases_app = typer.Typer(help="Add or remove a belief's aliases", no_args_is_help=True)
app.add_typer(aliases_app, name="aliases")


@app.callback()
def _global(
    url: Annotated[
        str | None, typer.Option(help="API base URL (default: TENURE_CLI_URL or http://127.0.0.1:8000)")
    ] = None,
    key: Annotated[str | None, typer.Option(help="API key or JWT (default: TENURE_CLI_KEY)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output even on a terminal")] = False,
    session: Annotated[str | None, typer.Option(help="Session id recorded with writes and recalls")] = None,
) -> None:
    STATE.url, STATE.key, STATE.session = url, key, session
    STATE.json_mode = STATE.json_mode or json_out


class RoleName(str, Enum):
    member = "member"
    admin = "admin"


Projects = Annotated[list[str] | None, typer.Option("--project", help="project slug (repeatable)")]
Teams = Annotated[list[str] | None, typer.Option("--team", help="team slug (repeatable)")]
Roles = Annotated[list[RoleName] | None, typer.Option("--role", help="role (repeatable)")]
Limit = Annotated[int | None, typer.Option(help="page size")]
AllPages = Annotated[bool, typer.Option("--all-pages", help="follow next_cursor to the end")]
ScopeOpt = Annotated[list[str] | None, typer.Option("--scope", help="scope label (repeatable)")]


def _grants(project: list[str] | None, team: list[str] | None, role: list[RoleName] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if project is not None:
        out["projects"] = project
    if team is not None:
        out["teams"] = team
    if role is not None:
        out["roles"] = [r.value for r in role]
    return out


# ------------------------------------------------------------------ provisioning


@app.command("create-tenant", help="create a tenant (operator)")
def create_tenant(tenant: str, name: Annotated[str | None, typer.Option()] = None) -> None:
    emit(STATE.api().admin.create_tenant(tenant, name), _record)


@app.command("create-user", help="create a user in a tenant")
def create_user(tenant: str, user: str, project: Projects = None, team: Teams = None, role: Roles = None) -> None:
    emit(STATE.api().admin.create_user(tenant, user, **_grants(project, team, role)), _record)


@app.command("issue-key", help="issue an API key for a user (printed once)")
def issue_key(
    tenant: str,
    user: str,
    name: Annotated[str, typer.Option()] = "",
    expires_in: Annotated[int | None, typer.Option(help="seconds")] = None,
    project: Projects = None,
    team: Teams = None,
    role: Roles = None,
) -> None:
    values: dict[str, Any] = {"name": name, **_grants(project, team, role)}
    if expires_in is not None:  # 0 too: the server refuses it, rather than a key that never expires
        values["expires_in_s"] = expires_in
    issued = STATE.api().admin.issue_key(tenant, user, **values)
    emit(issued, lambda d: _record({**d, "note": "shown once: store it now (export TENURE_CLI_KEY=...)"}))


@app.command("revoke-key", help="revoke an API key (by key id or the key itself)")
def revoke_key(key_id: str) -> None:
    emit(STATE.api().admin.revoke_key(key_id), _record)  # the SDK sends the id of a whole key


@app.command("grant", help="grant (or with --revoke, take away) projects, teams, roles")
def grant(
    tenant: str,
    user: str,
    revoke: Annotated[bool, typer.Option("--revoke")] = False,
    project: Projects = None,
    team: Teams = None,
    role: Roles = None,
) -> None:
    verb = "remove" if revoke else "add"
    changes = {
        f"{verb}_projects": project or [],
        f"{verb}_teams": team or [],
        f"{verb}_roles": [r.value for r in role or []],
    }
    emit(STATE.api().admin.change_grants(tenant, user, **changes), _record)


@app.command("dev-token", help="issue a development JWT for a user")
def dev_token(tenant: str, user: str, ttl: Annotated[int | None, typer.Option()] = None) -> None:
    emit(STATE.api().admin.dev_token(tenant, user, ttl_s=ttl), _record)


@app.command("revoke-token", help="revoke a JWT until it expires")
def revoke_token(token: str) -> None:
    emit(STATE.api().admin.revoke_token(token), _record)


@app.command("disable-tenant", help="disable a tenant: all its credentials stop working (operator)")
def disable_tenant(tenant: str) -> None:
    emit(STATE.api().admin.disable_tenant(tenant), _record)


@app.command("enable-tenant", help="re-enable a disabled tenant (operator)")
def enable_tenant(tenant: str) -> None:
    emit(STATE.api().admin.enable_tenant(tenant), _record)


@app.command("disable-user", help="disable a user: all their keys and tokens stop working")
def disable_user(tenant: str, user: str) -> None:
    emit(STATE.api().admin.disable_user(tenant, user), _record)


@app.command("enable-user", help="re-enable a disabled user")
def enable_user(tenant: str, user: str) -> None:
    emit(STATE.api().admin.enable_user(tenant, user), _record)


def _collect(fetch: Callable[[str | None], Any], all_pages: bool) -> dict[str, Any]:
    """One page, or with ``all_pages`` every page followed through ``next_cursor``."""
    items: list[Any] = []
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        items += page.items
        cursor = page.next_cursor
        if not all_pages or not cursor:
            return {"items": items, "next_cursor": cursor}


@app.command("list-users", help="users of a tenant (admins; --all-pages follows cursors)")
def list_users(tenant: str, limit: Limit = None, all_pages: AllPages = False) -> None:
    api = STATE.api()
    page = _collect(lambda c: api.admin.list_users(tenant, limit=limit, cursor=c), all_pages)
    emit(page, _page_table(("user_id", "roles", "projects", "teams", "disabled")))


@app.command("list-keys", help="API keys of a tenant, never their secrets (admins; --all-pages follows cursors)")
def list_keys(tenant: str, limit: Limit = None, all_pages: AllPages = False) -> None:
    api = STATE.api()
    page = _collect(lambda c: api.admin.list_keys(tenant, limit=limit, cursor=c), all_pages)
    emit(page, _page_table(("key_id", "user_id", "name", "created_at", "expires_at", "revoked_at", "last_used_at")))


@app.command("whoami", help="show the principal behind the credential")
def whoami() -> None:
    emit(STATE.api().whoami(), _record)


@app.command("audit", help="query the audit trail (admins)")
def audit(
    tenant: Annotated[str | None, typer.Option()] = None,
    actor: Annotated[str | None, typer.Option()] = None,
    belief: Annotated[str | None, typer.Option()] = None,
    session: Annotated[str | None, typer.Option()] = None,
    action: Annotated[str | None, typer.Option()] = None,
    since: Annotated[str | None, typer.Option()] = None,
    until: Annotated[str | None, typer.Option()] = None,
    limit: Limit = None,
    all_pages: AllPages = False,
) -> None:
    filters = {
        "tenant_id": tenant,
        "actor_id": actor,
        "belief_id": belief,
        "session_id": session,
        "action": action,
        "since": since,
        "until": until,
    }
    api = STATE.api()
    page = _collect(lambda c: api.admin.audit(limit=limit, cursor=c, **filters), all_pages)
    emit(page, _page_table(("at", "action", "actor_id", "belief_ids", "session_id", "request_id")))


class TurnStatus(str, Enum):
    pending = "pending"
    running = "running"
    done = "done"
    skipped = "skipped"
    failed = "failed"


@app.command("turns", help="the tenant's turns by extraction status, newest first (admins; default: failed)")
def turns(
    status: Annotated[TurnStatus, typer.Option(help="extraction status")] = TurnStatus.failed,
    owner: Annotated[str | None, typer.Option(help="only this user's turns")] = None,
    limit: Limit = None,
    all_pages: AllPages = False,
) -> None:
    api = STATE.api()
    page = _collect(lambda c: api.admin.turns(status=status.value, owner_id=owner, limit=limit, cursor=c), all_pages)
    emit(page, _page_table(("created_at", "turn_id", "owner_id", "extraction_status", "attempts", "error")))


@app.command("retry-turn", help="send failed turns back for extraction (admins): the ids, or --failed for the newest")
def retry_turn(
    turn_ids: Annotated[list[str] | None, typer.Argument(help="turn ids")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="the tenant's failed turns, newest first")] = False,
    owner: Annotated[str | None, typer.Option(help="with --failed: only this user's")] = None,
    limit: Annotated[int | None, typer.Option(help="with --failed: at most this many (server default 50)")] = None,
) -> None:
    if bool(turn_ids) == failed:
        raise _error("validation_error", "name turn ids, or pass --failed (not both)")
    api = STATE.api()
    if failed:
        emit(api.admin.retry_failed_turns(owner_id=owner, limit=limit))
        return
    retried = [api.admin.retry_turn(turn_id) for turn_id in turn_ids or []]
    emit({"items": retried}, _page_table(("turn_id", "owner_id", "extraction_status", "queued", "previous_error")))


# ----------------------------------------------------------------------- recall


@app.command("recall", help="recall beliefs for a query (writes an injection receipt)")
def recall(
    query: str,
    scope: ScopeOpt = None,
    session: Annotated[str | None, typer.Option(help="session id for the receipt")] = None,
    explain: Annotated[bool, typer.Option("--explain")] = False,
    injection_only: Annotated[bool, typer.Option("--injection-only", help="print only the injection block")] = False,
) -> None:
    result = STATE.api().recall(query, scopes=scope or [], session_id=session, explain=explain)
    if injection_only:
        emit(result.injection.text)
        return

    def render(data: dict[str, Any]) -> Table:
        rows = [{**item, "tier": tier} for tier, items in data["tiers"].items() for item in items]
        title = f"{len(data['injected_ids'])} injected (receipt {data['receipt_id']})"
        return _table(rows, ("tier", "id", "canonical_name", "type", "score", "why_it_matters"), title=title)

    emit(result, render)


# ---------------------------------------------------------------------- beliefs


class BeliefTypeName(str, Enum):
    preference = "preference"
    decision = "decision"
    entity = "entity"
    open_question = "open_question"
    relation = "relation"


class StatusName(str, Enum):
    live = "live"
    superseded = "superseded"
    resolved = "resolved"
    retracted = "retracted"


@app.command("add", help="create a belief")
def add(
    canonical_name: Annotated[str, typer.Argument(help="snake_case name, e.g. session_cache")],
    content: Annotated[str, typer.Option(help="what is settled")],
    scope: Annotated[list[str], typer.Option("--scope", help="scope label (repeatable)")],
    type_: Annotated[BeliefTypeName, typer.Option("--type")] = BeliefTypeName.decision,
    alias: Annotated[list[str] | None, typer.Option("--alias", help="alias (repeatable)")] = None,
    why: Annotated[str, typer.Option(help="the directive an assistant should follow")] = "",
    pinned: Annotated[bool, typer.Option("--pin", help="pin it (always injected)")] = False,
    belief_id: Annotated[str | None, typer.Option("--id", help="your own id (idempotent imports)")] = None,
) -> None:
    created = STATE.api().beliefs.create(
        id=belief_id,
        type=type_.value,
        canonical_name=canonical_name,
        content=content,
        scope=scope,
        aliases=alias or [],
        why_it_matters=why,
        pinned=pinned or None,
    )
    emit(created, _record)


@app.command("list", help="list beliefs (filters; a table on a terminal)")
def list_beliefs(
    type_: Annotated[list[BeliefTypeName] | None, typer.Option("--type", help="(repeatable)")] = None,
    status: Annotated[list[StatusName] | None, typer.Option("--status", help="(repeatable)")] = None,
    scope: ScopeOpt = None,
    pinned: Annotated[bool | None, typer.Option("--pinned/--unpinned", help="only pinned / only unpinned")] = None,
    q: Annotated[str | None, typer.Option("--q", help="match names and aliases")] = None,
    tenant_wide: Annotated[bool, typer.Option("--all", help="admins: the whole tenant")] = False,
    limit: Limit = None,
    all_pages: AllPages = False,
) -> None:
    filters = {
        "type": [t.value for t in type_ or []],
        "status": [s.value for s in status or []],
        "scope": scope or [],
        "pinned": pinned,
        "q": q,
        "all": tenant_wide,
    }
    api = STATE.api()
    page = _collect(lambda c: api.beliefs.list(limit=limit, cursor=c, **filters), all_pages)
    emit(page, _page_table(BELIEF_COLUMNS))


@app.command("get", help="one belief")
def get(belief_id: str) -> None:
    emit(STATE.api().beliefs.get(belief_id), _record)


@app.command("history", help="a belief's supersession chain and change log")
def history(belief_id: str) -> None:
    def render(data: dict[str, Any]) -> Table:
        rows = [{"belief_id": e["belief_id"], "version": e["version"], **e["entry"]} for e in data["change_log"]]
        return _table(rows, ("changed_at", "belief_id", "version", "trigger", "actor", "note"), title="change log")

    emit(STATE.api().beliefs.history(belief_id), render)


@app.command("supersede", help="replace a belief with a new version")
def supersede(
    belief_id: str,
    content: Annotated[str, typer.Option()],
    name: Annotated[str | None, typer.Option("--name", help="a new canonical name")] = None,
    alias: Annotated[list[str] | None, typer.Option("--alias", help="alias (repeatable)")] = None,
    why: Annotated[str | None, typer.Option()] = None,
    reason: Annotated[str | None, typer.Option()] = None,
) -> None:
    result = STATE.api().beliefs.supersede(
        belief_id, content=content, canonical_name=name, aliases=alias or [], why_it_matters=why, reason=reason
    )
    emit(result, lambda d: _record({"superseded": d["superseded"]["id"], **d["current"]}))


@app.command("retract", help="retract a belief (never injected again; kept for history)")
def retract(belief_id: str, reason: Annotated[str | None, typer.Option()] = None) -> None:
    emit(STATE.api().beliefs.retract(belief_id, reason=reason), _record)


@app.command("pin", help="pin a belief (always injected in its scopes)")
def pin(belief_id: str) -> None:
    emit(STATE.api().beliefs.pin(belief_id), _record)


@app.command("unpin", help="unpin a belief")
def unpin(belief_id: str) -> None:
    emit(STATE.api().beliefs.unpin(belief_id), _record)


@app.command("resolve", help="resolve an open question")
def resolve(
    belief_id: str,
    note: Annotated[str | None, typer.Option()] = None,
    by: Annotated[str | None, typer.Option("--by", help="the belief that answers it")] = None,
) -> None:
    emit(STATE.api().beliefs.resolve(belief_id, note=note, resolved_by=by), _record)


@aliases_app.command("add", help="add aliases to a belief (within the cap of 25)")
def aliases_add(belief_id: str, aliases: list[str]) -> None:
    emit(STATE.api().beliefs.add_aliases(belief_id, aliases), _record)


@aliases_app.command("remove", help="take back aliases of a belief (each must be one of its aliases)")
def aliases_remove(belief_id: str, aliases: list[str]) -> None:
    emit(STATE.api().beliefs.remove_aliases(belief_id, aliases), _record)


# ---------------------------------------------------------------- import / export


def _records(path: str, jsonl: bool) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    if jsonl or path.endswith((".jsonl", ".ndjson")):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        data = json.loads(text)
        rows = data["beliefs"] if isinstance(data, dict) and isinstance(data.get("beliefs"), list) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise _error("validation_error", f"{path}: expected a JSON array of beliefs, {{beliefs: [...]}}, or JSONL")
    return rows


@app.command("import", help="bulk import from a JSON or JSONL file ('-' for stdin), chunked, with progress")
def import_(
    file: str,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="the file is JSONL whatever its name")] = False,
    skip: Annotated[int, typer.Option(min=0, help="resume: skip the first N records (see next_record)")] = 0,
    chunk_bytes: Annotated[int, typer.Option(help="request size (stay under the API's body limit)")] = 150_000,
) -> None:
    try:
        rows = _records(file, jsonl)
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 (UnicodeDecodeError)
        raise _error("validation_error", f"{file}: {exc}") from exc
    api = STATE.api()
    summary: dict[str, Any] = {"records": len(rows), "imported": [], "failed": {}, "chunks": 0, "next_record": skip}
    with _progress() as progress:
        task = progress.add_task(f"importing {file}", total=len(rows), completed=skip)
        for batch in chunked(rows[skip:], max_bytes=chunk_bytes):
            try:
                report = api.beliefs.import_(batch)
            except TenureError as exc:
                summary["error"] = exc.to_dict()["error"]
                summary["resume"] = f"tenure import {file} --skip {summary['next_record']}"
                break
            summary["imported"] += report.imported
            summary["failed"].update(report.failed)
            summary["chunks"] += 1
            summary["next_record"] += len(batch)
            progress.advance(task, len(batch))
    emit(summary, _import_table)
    if "error" in summary:
        raise typer.Exit(1)


def _import_table(summary: dict[str, Any]) -> Table:
    table = _record(
        {
            "records": summary["records"],
            "imported": len(summary["imported"]),
            "failed": len(summary["failed"]),
            "requests": summary["chunks"],
            "stopped at record": summary["next_record"] if "error" in summary else None,
            "error": summary.get("error", {}).get("message"),
            "resume with": summary.get("resume"),
        }
    )
    for ref, reason in list(summary["failed"].items())[:20]:
        table.add_row(f"failed {ref}", _cell(reason))
    return table


@app.command("export", help="export beliefs as JSONL (stdout, or --out FILE with progress)")
def export(
    tenant_wide: Annotated[bool, typer.Option("--all", help="the whole tenant (admins)")] = False,
    out: Annotated[str | None, typer.Option("--out")] = None,
    scope: ScopeOpt = None,
) -> None:
    api = STATE.api()
    params: dict[str, Any] = {"scope": scope or []}
    if tenant_wide:
        params["all"] = "true"
    lines: Iterator[str] = api.stream_lines("/v1/beliefs/export", {k: v for k, v in params.items() if v})
    count = 0
    try:
        if out is None:
            for line in lines:
                STATE.out.write(line + "\n")
                count += 1
            return
        with open(out, "w", encoding="utf-8") as target, _progress() as progress:
            task = progress.add_task(f"exporting to {out}", total=None)
            for line in lines:
                target.write(line + "\n")
                count += 1
                progress.advance(task)
    except BrokenPipeError:  # the reader left (`tenure export | head`): main() stops quietly
        raise
    except OSError as exc:  # the file cannot be made or written (no such directory, no space left)
        where = out or "standard output"
        raise _error("output_error", f"cannot write {where}: {exc.strerror or exc}", "choose another --out") from exc
    except IncompleteAnswer as exc:
        # the store failed (or the connection broke) after the export had started: the lines
        # written so far are not the whole export, and nothing in them says so
        where = out or "the output"
        raise _error(
            "incomplete_answer",
            f"the export stopped after {count} beliefs: {where} is incomplete ({exc.message})",
            "run the export again once the service is healthy (GET /readyz)",
        ) from exc
    emit({"exported": count, "file": out}, _record)


# ------------------------------------------------------- operator: OpenSearch direct


def _settings() -> Settings:
    return STATE.settings or get_settings()


def _direct(run: Callable[[Settings], Any]) -> Any:
    """Run an OpenSearch-direct command; a store failure says which store it could not use
    (``bootstrap`` also needs Redis: every account write bumps the tenant's accounts version)."""
    from opensearchpy.exceptions import OpenSearchException

    from service.errors import StoreUnavailable, TenureError

    settings = _settings()
    try:
        return run(settings)
    except OpenSearchException as exc:
        message = f"OpenSearch at {settings.opensearch_url}: {exc}"
        raise CliError(
            {"error": {"code": "store_unavailable", "message": message, "hint": "set TENURE_OPENSEARCH_URL"}}
        ) from exc
    except StoreUnavailable as exc:
        message = f"{exc.message} (OpenSearch at {settings.opensearch_url}, Redis at {settings.redis_url})"
        hint = "set TENURE_OPENSEARCH_URL and TENURE_REDIS_URL"
        raise CliError({"error": {"code": "store_unavailable", "message": message, "hint": hint}}) from exc
    except TenureError as exc:  # refused by the service layer (a disabled or demoted bootstrap user)
        raise _error(exc.code.value, exc.message) from exc


def bootstrap(settings: Settings, user: str) -> dict[str, Any]:
    """The first operator credential, written through the service layer (no HTTP, no prior key)."""
    import redis

    from service.api.state import Services
    from service.storage.client import build_client
    from service.storage.templates import FAMILIES, apply_templates

    client = build_client(settings)
    redis_client = redis.Redis.from_url(settings.redis_url)
    try:
        apply_templates(client, settings.opensearch_namespace, FAMILIES)
        issued = Services.build(settings, client, redis_client).provisioning.bootstrap(user)
    finally:
        client.close()
        redis_client.close()
    return {
        "key": issued.plaintext,
        "key_id": issued.record.key_id,
        "tenant_id": issued.record.tenant_id,
        "user_id": issued.record.user_id,
        "note": "shown once: store it now (export TENURE_CLI_KEY=...)",
    }


@app.command("bootstrap", help="create the first operator key directly in OpenSearch")
def bootstrap_cmd(user: Annotated[str, typer.Option()] = "root") -> None:
    emit(_direct(lambda s: bootstrap(s, user)), _record)


def _on_store(run: Callable[[OpenSearch, Settings], Any], spinner: str | None = None) -> Any:
    """Run an OpenSearch-direct command with a client of its own (closed afterwards), behind a
    spinner saying what it waits for when it can take long."""
    from service.storage.client import build_client

    def direct(settings: Settings) -> Any:
        client = build_client(settings)
        try:
            if spinner is None:
                return run(client, settings)
            with _progress(transient=True) as progress:
                progress.add_task(spinner, total=None)
                return run(client, settings)
        finally:
            client.close()

    return _direct(direct)


def _family(name: str) -> IndexFamily:
    """An index family by its name (beliefs, audit, ...), or a validation error naming them."""
    from service.storage.operations import family_by_name

    try:
        return family_by_name(name)
    except ValueError as exc:
        raise _error("validation_error", str(exc)) from exc


FamilyName = Annotated[str, typer.Argument(help="beliefs, belief-logs, audit, accounts, turns or reviews")]


@app.command(
    "apply-retention",
    help="delete audit events and turns past their tenant's retention now (directly in OpenSearch; idempotent)",
)
def apply_retention_cmd() -> None:
    from service.domain.belief import utcnow
    from service.storage.retention import RetentionStore, apply_retention

    def run(client: OpenSearch, settings: Settings) -> Any:
        store = RetentionStore(client, settings.opensearch_namespace)
        return [e.as_dict() for e in apply_retention(store, settings.retention, utcnow())]

    emit(_on_store(run))


@app.command("apply-templates", help="put every index template and alias (directly in OpenSearch; idempotent)")
def apply_templates_cmd() -> None:
    from service.storage.operations import apply_all

    emit(_on_store(lambda client, settings: apply_all(client, settings.opensearch_namespace)))


@app.command("reindex", help="upgrade a family: current templates, copy into generation N+1, atomic alias swap")
def reindex(
    family: FamilyName,
    keep_writes_open: Annotated[
        bool,
        typer.Option(help="do not write-block the old generation during the copy (writes made meanwhile may be lost)"),
    ] = False,
    delete_old: Annotated[bool, typer.Option(help="delete the old generation after the swap")] = False,
) -> None:
    from dataclasses import asdict

    from service.storage.operations import UpgradeError, upgrade_family

    chosen = _family(family)

    def run(client: OpenSearch, settings: Settings) -> Any:
        try:
            return upgrade_family(
                client, settings.opensearch_namespace, chosen, block_writes=not keep_writes_open, delete_old=delete_old
            )
        except UpgradeError as exc:
            raise _error("reindex_failed", str(exc)) from exc

    emit(asdict(_on_store(run, f"reindexing {family} (copy, then alias swap)")), _record)


@app.command("merge-segments", help="force-merge a family's live index to one segment per shard (after bulk imports)")
def merge_segments_command(family: FamilyName = "beliefs") -> None:
    from service.storage.operations import merge_segments

    chosen = _family(family)
    emit(
        _on_store(
            lambda client, settings: merge_segments(client, chosen.alias(settings.opensearch_namespace)),
            f"merging the segments of {family}",
        )
    )


@app.command(
    "move-change-logs",
    help="move change logs still kept inside belief documents into the belief-logs index (once, after upgrading)",
)
def move_change_logs_command(
    tenant: Annotated[str | None, typer.Option(help="only this tenant's beliefs")] = None,
) -> None:
    from dataclasses import asdict

    from service.storage.beliefs import BeliefStore, move_inline_logs

    emit(
        _on_store(
            lambda client, settings: asdict(
                move_inline_logs(BeliefStore(client, settings.opensearch_namespace), tenant_id=tenant)
            ),
            "moving inline change logs out of the belief documents",
        )
    )


# Placeholders so `tenure --help` lists the commands that main() hands to their own parsers.
@app.command("eval", help="run the evaluation: backends side by side (see evals/README.md)", add_help_option=False)
def eval_placeholder() -> None:  # pragma: no cover - main() dispatches `eval` before Typer
    raise typer.Exit(0)


@app.command("mcp", help="the MCP server over stdio for an editor to spawn (docs/mcp.md)", add_help_option=False)
def mcp_placeholder() -> None:  # pragma: no cover - main() dispatches `mcp` before Typer
    raise typer.Exit(0)


def command_names() -> list[str]:
    """Every top-level command (docker-compose and the docs name some of them)."""
    commands: dict[str, Any] = getattr(typer.main.get_command(app), "commands", {})
    return sorted(commands)


# ------------------------------------------------------------------------- errors


def _hint(exc: TenureError) -> str | None:
    if isinstance(exc, ConnectionFailed):
        return "is the API running there? (./scripts/run.sh) Set TENURE_CLI_URL or --url"
    if isinstance(exc, UnexpectedAnswer):
        return "point TENURE_CLI_URL or --url at the API itself (https:// when it is behind the TLS proxy)"
    if isinstance(exc, AuthenticationFailed):
        return "check TENURE_CLI_KEY: the key may be revoked, expired, or from another deployment"
    if isinstance(exc, PermissionDenied):
        return "this needs the admin role of the tenant, or a grant for that project/team (ask your admin)"
    if exc.code == "payload_too_large":
        return "split the request: `tenure import` chunks files with --chunk-bytes"
    if exc.code == "rate_limited":
        return f"retry in {exc.retry_after_s or 1:.0f} s"
    return None


def _report(payload: dict[str, Any]) -> None:
    if STATE.json_mode or not STATE.err.isatty():
        STATE.err.write(json.dumps(payload, ensure_ascii=False) + "\n")
        return
    error = payload.get("error", {})
    console = STATE.err_console
    where = f" (request {error['request_id']})" if error.get("request_id") else ""
    console.print(f"[bold red]error[/] {error.get('code')}: {error.get('message')}{where}", highlight=False)
    if error.get("hint"):
        console.print(f"  [yellow]→[/] {error['hint']}", highlight=False)


# argparse's (and Click's) exit status for a command line, or a setting, it cannot run with
EXIT_USAGE = 2
# what a shell reports for a tool ended by SIGPIPE (128 + 13): `tenure export | head` then fails a
# `set -o pipefail` script as `cat big.jsonl | head` does
EXIT_READER_GONE = 141


def _reader_gone(out: TextIO) -> int:
    """The output's reader went away (``tenure export | head``): stop without a word, as shell
    tools do. What is still buffered for it goes to /dev/null, so flushing standard output at the
    interpreter's exit does not print "Exception ignored ... BrokenPipeError" (Python's recipe,
    docs "Note on SIGPIPE")."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):  # not a file (a test's StringIO)
        return EXIT_READER_GONE
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return EXIT_READER_GONE


def run_mcp_stdio(argv: Sequence[str]) -> int:
    """``tenure mcp``: the MCP server on stdin/stdout for an editor to spawn (docs/mcp.md). Every
    tool is a REST call to ``--url`` with the user's own ``--key`` (TENURE_CLI_URL/TENURE_CLI_KEY)."""
    import argparse

    parser = argparse.ArgumentParser(prog="tenure mcp", description="MCP server over stdio (see docs/mcp.md)")
    parser.add_argument("--url", help="API base URL (default: TENURE_CLI_URL or http://127.0.0.1:8000)")
    parser.add_argument("--key", help="your API key or JWT (default: TENURE_CLI_KEY)")
    # the other global options, given before the command (`tenure --json mcp`), concern no tool
    parser.add_argument("--session", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv))
    from service.mcp.server import stdio_server

    try:
        cli = _cli_settings()
    except CliError as exc:
        # one line on stderr (stdout is the MCP channel) and argparse's exit status for a
        # command line it cannot run with, which the editor shows in its MCP log
        error = exc.payload["error"]
        sys.stderr.write(f"{parser.prog}: error: {error['message']} ({error['hint']})\n")
        return EXIT_USAGE
    key = args.key or (cli.key.get_secret_value() if cli.key else None)
    stdio_server(args.url or cli.url, key, timeout_s=cli.timeout_s).run("stdio")
    return 0


# the options of `_global`, as `tenure [OPTIONS] COMMAND` takes them before the command
_GLOBAL_VALUE_OPTIONS = ("--url", "--key", "--session")
_GLOBAL_FLAGS = ("--json",)


def _split_global_options(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """``argv`` as (the global options before the command, the command's name, what follows it):
    ``tenure --key K --url U mcp`` names ``mcp`` as ``tenure mcp`` does. ``None``: no command."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in _GLOBAL_FLAGS or word.startswith(tuple(f"{o}=" for o in _GLOBAL_VALUE_OPTIONS)):
            i += 1
        elif word in _GLOBAL_VALUE_OPTIONS:
            i += 2
        else:
            return argv[:i], word, argv[i + 1 :]
    return argv, None, []


def main(
    argv: Sequence[str] | None = None,
    *,
    client: httpx.Client | None = None,
    settings: Settings | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Entry point. Tests pass an ``httpx.Client`` (e.g. FastAPI's TestClient) and settings."""
    global STATE
    argv = list(sys.argv[1:] if argv is None else argv)
    global_options, command_name, rest = _split_global_options(argv)
    if command_name == "eval":
        # `tenure eval ...` is the evaluation tool (evals/cli.py, also `tenure-eval`); imported
        # lazily so the API client never loads matplotlib. It talks to OpenSearch, not the API:
        # the API's options (--url, --key, --json, --session) do not concern it.
        from evals.cli import main as eval_main

        return eval_main(rest)
    if command_name == "mcp":
        return run_mcp_stdio([*global_options, *rest])
    STATE = State(out=out or sys.stdout, err=err or sys.stderr, http=client, settings=settings)
    command = typer.main.get_command(app)
    try:
        # without standalone mode, Click returns the code of a typer.Exit instead of raising it
        returned = command.main(args=argv, prog_name="tenure", standalone_mode=False)
        STATE.out.flush()  # a reader gone (`| head`) shows here, not at the interpreter's exit
        if isinstance(returned, int) and returned:
            return returned
    except BrokenPipeError:
        return _reader_gone(STATE.out)
    except SystemExit as exc:
        # Click's own handling of a broken pipe (sys.exit(1) with sys.stdout replaced); any other
        # SystemExit is not Click's to decide here
        if not isinstance(exc.__context__, BrokenPipeError):
            raise
        return _reader_gone(STATE.out)
    except CliError as exc:
        _report(exc.payload)
        return 1
    except TenureError as exc:
        payload = exc.to_dict()
        hint = _hint(exc)
        if hint:
            payload["error"]["hint"] = hint
        _report(payload)
        return 1
    except typer.Exit as exc:
        return int(exc.exit_code)
    except ClickException as exc:
        exc.show(file=STATE.err)
        return int(exc.exit_code)
    except typer.Abort:
        return 130
    finally:
        STATE.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
