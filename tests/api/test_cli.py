"""The ``tenure`` CLI end to end: bootstrap, provision, import, recall, export, audit, revoke."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.cli import main
from service.config import Settings


def _run(client: TestClient, *argv: str, settings: Settings | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), client=client, settings=settings, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _json(client: TestClient, *argv: str, settings: Settings | None = None) -> Any:
    code, out, err = _run(client, *argv, settings=settings)
    assert code == 0, err
    return json.loads(out)


def test_cli_from_bootstrap_to_audit(
    client: TestClient, api_settings: Settings, services: Services, tmp_path: Path
) -> None:
    root = _json(client, "bootstrap", settings=api_settings)
    assert root["key"].startswith("tnr_") and root["tenant_id"] == "system"
    op = ["--key", root["key"]]
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    assert _json(client, *op, "create-tenant", tenant)["tenant_id"] == tenant
    _json(client, *op, "create-user", tenant, "lead", "--role", "admin", "--project", "payments")
    _json(client, *op, "create-user", tenant, "dev")
    assert _json(client, *op, "grant", tenant, "dev", "--project", "payments")["projects"] == ["payments"]
    lead = _json(client, *op, "issue-key", tenant, "lead", "--name", "ci")["key"]
    dev = _json(client, *op, "issue-key", tenant, "dev")["key"]

    corpus = tmp_path / "beliefs.jsonl"
    record = {
        "_id": "b-sessions",
        "type": "decision",
        "canonical_name": "session_cache",
        "aliases": ["redis"],
        "content": "Sessions live in Redis.",
        "why_it_matters": "Never add sticky sessions.",
        "scope": ["project:payments"],
    }
    corpus.write_text(json.dumps(record) + "\n")
    assert _json(client, "--key", lead, "import", str(corpus))["imported"] == ["b-sessions"]

    recalled = _json(
        client,
        "--key",
        dev,
        "recall",
        "--scope",
        "project:payments",
        "--session",
        "s-1",
        "where do sessions go? redis?",
    )
    assert recalled["injected_ids"] == ["b-sessions"]
    code, text, _ = _run(client, "--key", dev, "recall", "--scope", "project:payments", "--injection-only", "redis")
    assert code == 0 and "Never add sticky sessions." in text

    code, exported, _ = _run(client, "--key", dev, "export")
    assert code == 0 and json.loads(exported.splitlines()[0])["id"] == "b-sessions"

    services.audit.refresh()
    receipts = _json(client, "--key", lead, "audit", "--session", "s-1", "--action", "recall")["items"]
    assert receipts[0]["belief_ids"] == ["b-sessions"] and receipts[0]["actor_id"] == "dev"
    code, _, err = _run(client, "--key", dev, "audit")
    assert code == 1 and json.loads(err)["error"]["code"] == "forbidden"

    token = _json(client, "--key", lead, "dev-token", tenant, "dev")["token"]
    assert _json(client, "--key", token, "whoami")["credential"] == "jwt"
    assert _json(client, "--key", lead, "revoke-token", token)["revoked"] is True
    assert _run(client, "--key", token, "whoami")[0] == 1
    assert _json(client, "--key", lead, "revoke-key", dev)["revoked_at"]
    code, _, err = _run(client, "--key", dev, "whoami")
    assert code == 1 and json.loads(err)["error"]["code"] == "unauthenticated"


def test_cli_disable_enable_and_list_pages(client: TestClient, operator: dict[str, str]) -> None:
    op = ["--key", operator["Authorization"].removeprefix("Bearer ")]
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    _json(client, *op, "create-tenant", tenant)
    for user in ("lead", "dev", "ops"):
        _json(client, *op, "create-user", tenant, user, *(["--role", "admin"] if user == "lead" else []))
    lead = _json(client, *op, "issue-key", tenant, "lead")["key"]
    dev = _json(client, *op, "issue-key", tenant, "dev")["key"]

    first = _json(client, "--key", lead, "list-users", tenant, "--limit", "2")
    assert len(first["items"]) == 2 and first["next_cursor"]
    every = _json(client, "--key", lead, "list-users", tenant, "--limit", "2", "--all-pages")
    assert sorted(u["user_id"] for u in every["items"]) == ["dev", "lead", "ops"] and every["next_cursor"] is None
    keys = _json(client, "--key", lead, "list-keys", tenant, "--limit", "1", "--all-pages")["items"]
    assert {k["user_id"] for k in keys} == {"lead", "dev"}

    assert _json(client, "--key", lead, "disable-user", tenant, "dev")["disabled"] is True
    code, _, err = _run(client, "--key", dev, "whoami")
    assert code == 1 and json.loads(err)["error"]["code"] == "unauthenticated"
    assert _json(client, "--key", lead, "enable-user", tenant, "dev")["disabled"] is False
    assert _json(client, "--key", dev, "whoami")["user_id"] == "dev"

    code, _, err = _run(client, "--key", lead, "disable-tenant", tenant)  # tenant admins may not
    assert code == 1 and json.loads(err)["error"]["code"] == "forbidden"
    assert _json(client, *op, "disable-tenant", tenant)["disabled"] is True
    assert _run(client, "--key", lead, "whoami")[0] == 1
    assert _json(client, *op, "enable-tenant", tenant)["disabled"] is False
    assert _json(client, "--key", lead, "whoami")["user_id"] == "lead"
