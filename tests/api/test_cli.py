"""The ``tenure`` CLI end to end: bootstrap, provision, import, recall, export, audit, revoke."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.cli import State, main
from service.config import Settings
from tests.api.conftest import auth, belief_body, make_team, ok


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


class _Terminal(io.StringIO):
    """Output a person reads: the CLI prints tables, not JSON."""

    def isatty(self) -> bool:
        return True


def test_belief_commands_tables_and_json(client: TestClient, operator: dict[str, str]) -> None:
    from tests.api.conftest import make_team

    team = make_team(client, operator)
    alice = ["--key", team.keys["alice"]]
    made = _json(
        client, *alice, "add", "deploy_freeze", "--type", "decision", "--scope", "project:pay",
        "--alias", "release freeze", "--content", "No deploys on Fridays.", "--why", "Weekend on-call is thin.",
    )  # fmt: skip
    assert made["canonical_name"] == "deploy_freeze" and made["aliases"] == ["release freeze"]
    bid = made["id"]
    assert _json(client, *alice, "get", bid)["content"] == "No deploys on Fridays."
    assert _json(client, *alice, "pin", bid)["pinned"] is True
    assert _json(client, *alice, "unpin", bid)["pinned"] is False
    assert "friday freeze" in _json(client, *alice, "aliases", "add", bid, "friday freeze")["aliases"]
    assert _json(client, *alice, "aliases", "remove", bid, "friday freeze")["aliases"] == ["release freeze"]
    replaced = _json(client, *alice, "supersede", bid, "--content", "No deploys after Thursday noon.")
    new_id = replaced["current"]["id"]
    chain = _json(client, *alice, "history", new_id)["chain"]
    assert [b["id"] for b in chain] == [bid, new_id]
    question = _json(
        client, *alice, "add", "freeze_exceptions", "--type", "open_question", "--scope", "project:pay",
        "--content", "Who may break the freeze?",
    )  # fmt: skip
    assert _json(client, *alice, "resolve", question["id"], "--note", "the on-call lead")["resolved_at"]
    listed = _json(client, *alice, "list", "--scope", "project:pay", "--status", "live", "--limit", "1", "--all-pages")
    assert sorted(b["id"] for b in listed["items"]) == [new_id]  # the question is resolved, the old superseded
    assert _json(client, *alice, "retract", new_id, "--reason", "policy dropped")["retracted_at"]

    # a colleague's private belief stays invisible through the CLI too
    private = _json(client, *alice, "add", "alice_notes", "--scope", "user:alice", "--content", "Mine.")
    code, _, err = _run(client, "--key", team.keys["bob"], "get", private["id"])
    assert code == 1 and json.loads(err)["error"]["code"] == "not_found"

    # on a terminal: a table, not JSON
    out, err_stream = _Terminal(), io.StringIO()
    assert main([*alice, "list", "--scope", "user:alice"], client=client, out=out, err=err_stream) == 0
    text = out.getvalue()
    assert "alice_notes" in text and "canonical_name" in text and not text.lstrip().startswith("{")
    out = _Terminal()
    assert main([*alice, "--json", "get", private["id"]], client=client, out=out, err=err_stream) == 0
    assert json.loads(out.getvalue())["id"] == private["id"]


def test_import_is_chunked_resumable_and_errors_say_what_to_do(
    client: TestClient, operator: dict[str, str], tmp_path: Path
) -> None:
    from tests.api.conftest import make_team

    team = make_team(client, operator)
    big = tmp_path / "big.jsonl"
    padding = "x" * 1400
    rows = [
        {
            "_id": f"b-imp-{i}",
            "type": "decision",
            "canonical_name": f"imported_{i}",
            "content": f"Imported decision {i}. {padding}",
            "scope": ["project:pay"],
        }
        for i in range(1000)
    ]
    big.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert big.stat().st_size > 1_400_000  # far over the test app's 200 kB body limit
    key = ["--key", team.keys["alice"]]

    code, out, _ = _run(client, *key, "import", str(big), "--chunk-bytes", "400000")  # too big: refused
    summary = json.loads(out)
    assert code == 1 and summary["error"]["code"] == "payload_too_large" and summary["next_record"] == 0
    assert summary["resume"] == f"tenure import {big} --skip 0"

    first = _json(client, *key, "import", str(big), "--skip", "900")
    assert len(first["imported"]) == 100 and first["next_record"] == 1000
    done = _json(client, *key, "import", str(big))  # the whole file: the 100 already there are reported
    assert len(done["imported"]) == 900 and done["chunks"] >= 8 and done["next_record"] == 1000
    assert sorted(done["failed"]) == sorted(f"b-imp-{i}" for i in range(900, 1000))
    exported = tmp_path / "out.jsonl"
    assert _json(client, *key, "export", "--out", str(exported), "--scope", "project:pay")["exported"] == 1000

    code, _, err = _run(client, "--key", "sk-openai-looking-key", "whoami")
    error = json.loads(err)["error"]
    assert code == 1 and error["message"] == "this is not a Tenure key" and "tnr_" in error["hint"]
    code, _, err = _run(client, "--key", team.keys["alice"], "audit")
    assert code == 1 and "admin" in json.loads(err)["error"]["hint"]


def test_bootstrap_without_redis_names_the_store(client: TestClient, api_settings: Settings) -> None:
    """Bootstrap writes accounts, and every account write bumps the tenant's accounts version in
    Redis: without Redis it fails with the service's error shape and says what to set."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = api_settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"})
    code, out, err = _run(client, "--json", "bootstrap", settings=settings)
    assert code != 0
    error = json.loads(err or out)["error"]
    assert error["code"] == "store_unavailable" and "TENURE_REDIS_URL" in error["hint"]


def test_issue_key_with_expires_in_zero_is_refused_not_a_key_that_never_expires(
    client: TestClient, operator: dict[str, str]
) -> None:
    op = ["--key", operator["Authorization"].removeprefix("Bearer ")]
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    _json(client, *op, "create-tenant", tenant)
    _json(client, *op, "create-user", tenant, "dev")
    code, out, err = _run(client, *op, "--json", "issue-key", tenant, "dev", "--expires-in", "0")
    assert code == 1 and out == "", out
    assert json.loads(err)["error"]["code"] == "validation_error"
    assert _json(client, *op, "list-keys", tenant)["items"] == []


def test_eval_is_found_after_global_options(client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    """``tenure --json eval --help`` runs the evaluation tool (it used to exit 0 doing nothing)."""
    with pytest.raises(SystemExit) as done:  # argparse's --help
        _run(client, "--json", "eval", "--help")
    assert done.value.code == 0 and "--opensearch-url" in capsys.readouterr().out


def test_bootstrap_never_prints_a_key_that_is_no_operator_key(
    client: TestClient, api_settings: Settings, operator: dict[str, str]
) -> None:
    """``tenure bootstrap --user <u>`` of an operator user that lost the admin role printed a key
    with the user's roles as they are (member), "an operator key" that could administer nothing;
    of a disabled one it crashed with a traceback. Both now fail in the error shape, naming the
    way out (bootstrap another user)."""
    user = f"ops-{uuid.uuid4().hex[:8]}"
    first = _json(client, "bootstrap", "--user", user, settings=api_settings)["key"]
    assert ok(client.get("/v1/whoami", headers=auth(first)))["roles"] == ["admin", "member"]
    ok(
        client.patch(
            f"/v1/admin/tenants/system/users/{user}/grants", json={"remove_roles": ["admin"]}, headers=operator
        )
    )
    for _ in ("demoted", "disabled"):
        code, out, err = _run(client, "--json", "bootstrap", "--user", user, settings=api_settings)
        assert code != 0, out
        error = json.loads(err)["error"]
        assert error["code"] == "conflict" and "--user" in error["message"]
        ok(client.post(f"/v1/admin/tenants/system/users/{user}/disable", headers=operator))


def test_import_of_a_file_that_is_not_utf8_or_a_negative_skip_is_a_clear_error(
    client: TestClient, operator: dict[str, str], tmp_path: Path
) -> None:
    """A file saved in another encoding ended the command with a Python traceback (the decode
    error was caught by nobody), and ``--skip -1`` silently re-sent the file's last record first."""
    team = make_team(client, operator)
    latin = tmp_path / "latin1.json"
    latin.write_bytes(
        json.dumps([{"canonical_name": "caf\u00e9", "content": "x"}]).encode("latin-1").replace(b"\\u00e9", b"\xe9")
    )
    code, out, err = _run(client, "--key", team.keys["alice"], "import", str(latin))
    assert code == 1, (out, err)
    assert "validation_error" in out + err and "utf-8" in (out + err).lower()
    assert "Traceback" not in out + err
    good = tmp_path / "good.json"
    good.write_text(json.dumps([belief_body("cli_skip_rule")]))
    code, out, err = _run(client, "--key", team.keys["alice"], "import", str(good), "--skip", "-1")
    assert code == 2 and "skip" in (out + err).lower(), (out, err)


def test_failures_outside_the_api_are_clear_errors_not_tracebacks(
    client: TestClient, operator: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export to a directory that does not exist, a TENURE_CLI_* setting that is no value of
    its kind, a URL that is no URL: each ended the command with a Python traceback."""
    team = make_team(client, operator)
    key = ["--key", team.keys["alice"]]
    ok(client.post("/v1/beliefs", json=belief_body("cli_output_rule", "project:pay"), headers=team.h("alice")), 201)
    target = tmp_path / "no-such-dir" / "beliefs.jsonl"
    code, out, err = _run(client, *key, "export", "--out", str(target))
    assert code == 1 and "output_error" in err and str(target) in err, (out, err)
    assert "Traceback" not in out + err and not target.exists()

    monkeypatch.setenv("TENURE_CLI_TIMEOUT_S", "soon")
    code, out, err = _run(client, *key, "whoami")
    assert code == 1 and "validation_error" in err and "TENURE_CLI_TIMEOUT_S" in err, (out, err)
    assert "Traceback" not in out + err
    monkeypatch.delenv("TENURE_CLI_TIMEOUT_S")

    out_io, err_io = io.StringIO(), io.StringIO()  # no test client: the URL is the CLI's to parse
    code = main(["--url", "http://[::1", *key, "whoami"], out=out_io, err=err_io)
    assert code == 1 and "validation_error" in err_io.getvalue() and "http://[::1" in err_io.getvalue()
    assert "Traceback" not in out_io.getvalue() + err_io.getvalue()
    assert _json(client, *key, "whoami")["user_id"] == "alice"  # and the same command, set right, works


def test_the_clis_state_never_shows_its_key(client: TestClient, api_settings: Settings) -> None:
    """The invocation's state is a dataclass: its repr (a log line, a debugger, a traceback's
    locals) listed the API key given with --key."""
    key = f"tnr_{uuid.uuid4().hex[:16]}_{uuid.uuid4().hex}"
    state = State(out=io.StringIO(), err=io.StringIO(), http=client, settings=api_settings, url="http://x", key=key)
    assert key not in repr(state) and key not in str(state) and "http://x" in repr(state)
