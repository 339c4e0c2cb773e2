"""``tenure``: provisioning and everyday use of the API from a shell, over HTTP.

    tenure bootstrap                      # first operator key, written directly (needs OpenSearch)
    export TENURE_CLI_KEY=tnr_...         # then everything else goes over HTTP
    tenure create-tenant acme
    tenure create-user acme alice --project payments
    tenure issue-key acme alice
    tenure disable-user acme alice        # enable-user, disable-tenant, enable-tenant likewise
    tenure recall --scope project:payments "how do we cache sessions?"

Operator commands that talk to OpenSearch directly (TENURE_OPENSEARCH_URL, TENURE_OPENSEARCH_NAMESPACE):

    tenure apply-templates                # every index template and alias a deployment needs
    tenure reindex beliefs                # template upgrade: copy into generation N+1, swap the alias

The API URL and key come from ``--url``/``--key`` or ``TENURE_CLI_URL``/``TENURE_CLI_KEY``. Output
is JSON (JSONL for export); an API error prints its JSON error to stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

from service.config import CliSettings, Settings, get_settings


class CliError(Exception):
    def __init__(self, payload: Any, status: int | None = None):
        super().__init__(str(payload))
        self.payload = payload
        self.status = status


def _check(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        try:
            payload: Any = response.json()
        except ValueError:
            payload = {"error": {"code": "http_error", "message": response.text[:500]}}
        raise CliError(payload, response.status_code)
    return response


class Api:
    def __init__(self, client: httpx.Client, key: str | None):
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return _check(self.client.request(method, path, headers=headers, **kwargs)).json()

    def stream_lines(self, path: str, params: dict[str, Any]) -> Iterator[str]:
        with self.client.stream("GET", path, params=params, headers=self.headers) as response:
            if response.status_code >= 400:
                response.read()
                _check(response)
            yield from response.iter_lines()


# ------------------------------------------------------------------ commands

Handler = Callable[[Api, argparse.Namespace, TextIO], Any]


def _grants(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.project is not None:
        out["projects"] = args.project
    if args.team is not None:
        out["teams"] = args.team
    if args.role is not None:
        out["roles"] = args.role
    return out


def cmd_create_tenant(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    return api.call("POST", "/v1/admin/tenants", json={"tenant_id": args.tenant, "name": args.name or args.tenant})


def cmd_create_user(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    body = {"user_id": args.user, **_grants(args)}
    return api.call("POST", f"/v1/admin/tenants/{args.tenant}/users", json=body)


def cmd_issue_key(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    body: dict[str, Any] = {"name": args.name, **_grants(args)}
    if args.expires_in:
        body["expires_in_s"] = args.expires_in
    return api.call("POST", f"/v1/admin/tenants/{args.tenant}/users/{args.user}/keys", json=body)


def cmd_revoke_key(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    key_id = args.key_id.split("_")[1] if args.key_id.startswith("tnr_") else args.key_id
    return api.call("DELETE", f"/v1/admin/keys/{key_id}")


def cmd_grant(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    verb = "remove" if args.revoke else "add"
    body = {f"{verb}_projects": args.project or [], f"{verb}_teams": args.team or [], f"{verb}_roles": args.role or []}
    return api.call("PATCH", f"/v1/admin/tenants/{args.tenant}/users/{args.user}/grants", json=body)


def cmd_dev_token(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    body = {"ttl_s": args.ttl} if args.ttl else {}
    return api.call("POST", f"/v1/admin/tenants/{args.tenant}/users/{args.user}/tokens", json=body)


def cmd_revoke_token(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    return api.call("POST", "/v1/admin/tokens/revoke", json={"token": args.token})


def cmd_disable_tenant(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    return api.call("POST", f"/v1/admin/tenants/{args.tenant}/{'enable' if args.enable else 'disable'}")


def cmd_disable_user(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    verb = "enable" if args.enable else "disable"
    return api.call("POST", f"/v1/admin/tenants/{args.tenant}/users/{args.user}/{verb}")


def _pages(api: Api, path: str, params: dict[str, Any], all_pages: bool) -> dict[str, Any]:
    """One page, or with ``all_pages`` every page followed through ``next_cursor``."""
    items: list[Any] = []
    while True:
        page = api.call("GET", path, params=params)
        items += page["items"]
        if not all_pages or not page["next_cursor"]:
            return {"items": items, "next_cursor": page["next_cursor"]}
        params = {**params, "cursor": page["next_cursor"]}


def cmd_list_users(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    params = {"limit": args.limit} if args.limit else {}
    return _pages(api, f"/v1/admin/tenants/{args.tenant}/users", params, args.all_pages)


def cmd_list_keys(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    params = {"limit": args.limit} if args.limit else {}
    return _pages(api, f"/v1/admin/tenants/{args.tenant}/keys", params, args.all_pages)


def cmd_whoami(api: Api, _args: argparse.Namespace, _out: TextIO) -> Any:
    return api.call("GET", "/v1/whoami")


def cmd_recall(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    body: dict[str, Any] = {"scopes": args.scope or [], "query": args.query, "explain": args.explain}
    if args.session:
        body["session_id"] = args.session
    result = api.call("POST", "/v1/recall", json=body)
    return result["injection"]["text"] if args.injection_only else result


def cmd_import(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    jsonl = args.jsonl or args.file.endswith((".jsonl", ".ndjson"))
    content_type = "application/x-ndjson" if jsonl else "application/json"
    return api.call("POST", "/v1/beliefs/import", content=text.encode(), headers={"Content-Type": content_type})


def cmd_export(api: Api, args: argparse.Namespace, out: TextIO) -> Any:
    params = {"all": "true"} if args.all else {}
    target = open(args.out, "w") if args.out else out  # noqa: SIM115 - closed below
    try:
        count = 0
        for line in api.stream_lines("/v1/beliefs/export", params):
            if line:
                target.write(line + "\n")
                count += 1
    finally:
        if args.out:
            target.close()
    return {"exported": count, "file": args.out} if args.out else None


def cmd_audit(api: Api, args: argparse.Namespace, _out: TextIO) -> Any:
    params = {
        k: v
        for k, v in {
            "tenant_id": args.tenant,
            "actor_id": args.actor,
            "belief_id": args.belief,
            "session_id": args.session,
            "action": args.action,
            "since": args.since,
            "until": args.until,
            "limit": args.limit,
        }.items()
        if v is not None
    }
    return _pages(api, "/v1/admin/audit", params, args.all_pages)


def bootstrap(settings: Settings, user: str) -> dict[str, Any]:
    """The first operator credential, written through the service layer (no HTTP, no prior key)."""
    import redis

    from service.api.state import Services
    from service.storage.client import build_client
    from service.storage.operations import DEPLOYMENT_FAMILIES
    from service.storage.templates import apply_templates

    client = build_client(settings)
    redis_client = redis.Redis.from_url(settings.redis_url)
    try:
        apply_templates(client, settings.opensearch_namespace, DEPLOYMENT_FAMILIES)
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


def _opensearch(settings: Settings) -> Any:
    from service.storage.client import build_client

    return build_client(settings)


def cmd_apply_templates(settings: Settings, _args: argparse.Namespace) -> Any:
    """Idempotent: safe on every deploy and from several processes at once."""
    from service.storage.operations import apply_all

    client = _opensearch(settings)
    try:
        return apply_all(client, settings.opensearch_namespace)
    finally:
        client.close()


def cmd_reindex(settings: Settings, args: argparse.Namespace) -> Any:
    from dataclasses import asdict

    from service.storage.operations import UpgradeError, family_by_name, upgrade_family

    try:
        family = family_by_name(args.family)
    except ValueError as exc:
        raise CliError({"error": {"code": "validation_error", "message": str(exc)}}) from exc
    client = _opensearch(settings)
    try:
        result = upgrade_family(
            client,
            settings.opensearch_namespace,
            family,
            block_writes=not args.keep_writes_open,
            delete_old=args.delete_old,
        )
    except UpgradeError as exc:
        raise CliError({"error": {"code": "reindex_failed", "message": str(exc)}}) from exc
    finally:
        client.close()
    return asdict(result)


def _run_direct(handler: DirectHandler, settings: Settings, args: argparse.Namespace) -> Any:
    """Run an OpenSearch-direct command; a store failure becomes the CLI's JSON error (exit 1)."""
    from opensearchpy.exceptions import OpenSearchException

    try:
        return handler(settings, args)
    except OpenSearchException as exc:
        message = f"OpenSearch at {settings.opensearch_url}: {exc}"
        raise CliError({"error": {"code": "store_unavailable", "message": message}}) from exc


def cmd_bootstrap(settings: Settings, args: argparse.Namespace) -> Any:
    return bootstrap(settings, args.user)


# Commands that need no API key: they talk to OpenSearch (and Redis) directly with the settings.
DirectHandler = Callable[[Settings, argparse.Namespace], Any]
DIRECT: dict[str, DirectHandler] = {
    "bootstrap": cmd_bootstrap,
    "apply-templates": cmd_apply_templates,
    "reindex": cmd_reindex,
}


# -------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tenure", description="Tenure team service CLI (over HTTP)")
    parser.add_argument("--url", help="API base URL (default: TENURE_CLI_URL or http://127.0.0.1:8000)")
    parser.add_argument("--key", help="API key or JWT (default: TENURE_CLI_KEY)")
    sub = parser.add_subparsers(dest="command", required=True)

    def grant_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--project", action="append", help="project slug (repeatable)")
        p.add_argument("--team", action="append", help="team slug (repeatable)")
        p.add_argument("--role", action="append", choices=["member", "admin"], help="role (repeatable)")

    sub.add_parser("eval", help="run the evaluation: backends side by side (see evals/README.md)", add_help=False)
    p = sub.add_parser("bootstrap", help="create the first operator key directly in OpenSearch")
    p.add_argument("--user", default="root")
    sub.add_parser("apply-templates", help="put every index template and alias (directly in OpenSearch; idempotent)")
    p = sub.add_parser(
        "reindex", help="upgrade a family: current templates, copy into generation N+1, atomic alias swap"
    )
    p.add_argument("family", help="beliefs, audit, accounts, turns or reviews")
    p.add_argument(
        "--keep-writes-open",
        action="store_true",
        help="do not write-block the old generation during the copy (writes made meanwhile may be lost)",
    )
    p.add_argument("--delete-old", action="store_true", help="delete the old generation after the swap")
    p = sub.add_parser("create-tenant", help="create a tenant (operator)")
    p.add_argument("tenant")
    p.add_argument("--name")
    p.set_defaults(handler=cmd_create_tenant)
    p = sub.add_parser("create-user", help="create a user in a tenant")
    p.add_argument("tenant")
    p.add_argument("user")
    grant_flags(p)
    p.set_defaults(handler=cmd_create_user)
    p = sub.add_parser("issue-key", help="issue an API key for a user (printed once)")
    p.add_argument("tenant")
    p.add_argument("user")
    p.add_argument("--name", default="")
    p.add_argument("--expires-in", type=int, help="seconds")
    grant_flags(p)
    p.set_defaults(handler=cmd_issue_key)
    p = sub.add_parser("revoke-key", help="revoke an API key (by key id or the key itself)")
    p.add_argument("key_id")
    p.set_defaults(handler=cmd_revoke_key)
    p = sub.add_parser("grant", help="grant (or with --revoke, take away) projects, teams, roles")
    p.add_argument("tenant")
    p.add_argument("user")
    p.add_argument("--revoke", action="store_true")
    grant_flags(p)
    p.set_defaults(handler=cmd_grant)
    p = sub.add_parser("dev-token", help="issue a development JWT for a user")
    p.add_argument("tenant")
    p.add_argument("user")
    p.add_argument("--ttl", type=int)
    p.set_defaults(handler=cmd_dev_token)
    p = sub.add_parser("revoke-token", help="revoke a JWT until it expires")
    p.add_argument("token")
    p.set_defaults(handler=cmd_revoke_token)
    p = sub.add_parser("disable-tenant", help="disable a tenant: all its credentials stop working (operator)")
    p.add_argument("tenant")
    p.set_defaults(handler=cmd_disable_tenant, enable=False)
    p = sub.add_parser("enable-tenant", help="re-enable a disabled tenant (operator)")
    p.add_argument("tenant")
    p.set_defaults(handler=cmd_disable_tenant, enable=True)
    p = sub.add_parser("disable-user", help="disable a user: all their keys and tokens stop working")
    p.add_argument("tenant")
    p.add_argument("user")
    p.set_defaults(handler=cmd_disable_user, enable=False)
    p = sub.add_parser("enable-user", help="re-enable a disabled user")
    p.add_argument("tenant")
    p.add_argument("user")
    p.set_defaults(handler=cmd_disable_user, enable=True)
    for name, handler in (("list-users", cmd_list_users), ("list-keys", cmd_list_keys)):
        p = sub.add_parser(name, help=f"{name.replace('-', ' ')} of a tenant (admins; --all-pages follows cursors)")
        p.add_argument("tenant")
        p.add_argument("--limit", type=int)
        p.add_argument("--all-pages", action="store_true")
        p.set_defaults(handler=handler)
    p = sub.add_parser("whoami", help="show the principal behind the credential")
    p.set_defaults(handler=cmd_whoami)
    p = sub.add_parser("recall", help="recall beliefs for a query")
    p.add_argument("query")
    p.add_argument("--scope", action="append", help="scope label (repeatable)")
    p.add_argument("--session")
    p.add_argument("--explain", action="store_true")
    p.add_argument("--injection-only", action="store_true", help="print only the injection block")
    p.set_defaults(handler=cmd_recall)
    p = sub.add_parser("import", help="bulk import beliefs from a JSON or JSONL file ('-' for stdin)")
    p.add_argument("file")
    p.add_argument("--jsonl", action="store_true")
    p.set_defaults(handler=cmd_import)
    p = sub.add_parser("export", help="export beliefs as JSONL")
    p.add_argument("--all", action="store_true", help="the whole tenant (admins)")
    p.add_argument("--out")
    p.set_defaults(handler=cmd_export)
    p = sub.add_parser("audit", help="query the audit trail (admins)")
    for flag in ("--tenant", "--actor", "--belief", "--session", "--action", "--since", "--until"):
        p.add_argument(flag)
    p.add_argument("--limit", type=int)
    p.add_argument("--all-pages", action="store_true")
    p.set_defaults(handler=cmd_audit)
    return parser


def _emit(result: Any, out: TextIO) -> None:
    if result is None:
        return
    if isinstance(result, str):
        out.write(result + "\n")
    else:
        out.write(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


def run_mcp_stdio(argv: Sequence[str]) -> int:
    """``tenure mcp``: the MCP server on stdin/stdout for an editor to spawn (docs/mcp.md). Every
    tool is a REST call to ``--url`` with the user's own ``--key`` (TENURE_CLI_URL/TENURE_CLI_KEY)."""
    parser = argparse.ArgumentParser(prog="tenure mcp", description="MCP server over stdio (see docs/mcp.md)")
    parser.add_argument("--url", help="API base URL (default: TENURE_CLI_URL or http://127.0.0.1:8000)")
    parser.add_argument("--key", help="your API key or JWT (default: TENURE_CLI_KEY)")
    args = parser.parse_args(list(argv))
    from service.mcp.server import stdio_server

    cli = CliSettings()
    key = args.key or (cli.key.get_secret_value() if cli.key else None)
    stdio_server(args.url or cli.url, key).run("stdio")
    return 0


def main(
    argv: Sequence[str] | None = None,
    *,
    client: httpx.Client | None = None,
    settings: Settings | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Entry point. Tests pass an ``httpx.Client`` (e.g. FastAPI's TestClient) and settings."""
    out, err = out or sys.stdout, err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        # `tenure eval ...` is the evaluation tool (evals/cli.py, also `tenure-eval`); imported
        # lazily so the API client never loads matplotlib
        from evals.cli import main as eval_main

        return eval_main(argv[1:])
    if argv[:1] == ["mcp"]:
        return run_mcp_stdio(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command in DIRECT:
            _emit(_run_direct(DIRECT[args.command], settings or get_settings(), args), out)
            return 0
        cli = CliSettings()
        key = args.key or (cli.key.get_secret_value() if cli.key else None)
        owned = client is None
        http = client or httpx.Client(base_url=args.url or cli.url, timeout=cli.timeout_s)
        try:
            _emit(args.handler(Api(http, key), args, out), out)
        finally:
            if owned:
                http.close()
    except CliError as exc:
        err.write(json.dumps(exc.payload, ensure_ascii=False) + "\n")
        return 1
    except httpx.HTTPError as exc:
        err.write(json.dumps({"error": {"code": "connection_error", "message": str(exc)}}) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
