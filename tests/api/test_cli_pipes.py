"""``tenure export | head``: the reader leaves before the CLI has written everything. The CLI said
``output_error: ... Broken pipe`` and exited 1 (export), or Python printed "Exception ignored ...
BrokenPipeError" when it flushed standard output at exit; now it stops without a word and exits
141, as a shell tool ended by SIGPIPE does.

A real ``tenure`` process (``python -m service.cli``) against the real app under uvicorn (real
OpenSearch and Redis), its standard output a pipe the test closes early."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tenure_client import Tenure

from service.app import create_app
from service.cli import EXIT_READER_GONE
from service.config import Settings
from tests.api.conftest import Team, belief_body, make_team
from tests.live import serve

REPO = Path(__file__).resolve().parents[2]
BELIEFS = 400  # an export of ~300 kB: far more than a pipe holds


@pytest.fixture(scope="module")
def api_url(api_settings: Settings, client: TestClient) -> Iterator[str]:
    with serve(create_app(api_settings)) as url:
        yield url


def _tenure(url: str, key: str, *command: str) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'clients/python'}",
        "TENURE_CLI_URL": url,
        "TENURE_CLI_KEY": key,
    }
    run = [sys.executable, "-m", "service.cli", *command]
    return subprocess.Popen(run, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _read_one_line_then_leave(process: subprocess.Popen[bytes]) -> tuple[bytes, int, bytes]:
    """What ``| head -1`` does: the first line, then the pipe closed; the CLI's exit and stderr."""
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read()
    return first, process.wait(timeout=60), err


@pytest.fixture(scope="module")
def many(api_url: str, client: TestClient, operator: dict[str, str]) -> Team:
    team = make_team(client, operator)
    with Tenure(api_url, team.keys["alice"]) as alice:
        records = [belief_body(f"piped_{n}_{uuid.uuid4().hex[:8]}", "project:pay") for n in range(BELIEFS)]
        for n in range(0, BELIEFS, 100):
            assert not alice.beliefs.import_(records[n : n + 100]).failed
    return team


@pytest.mark.parametrize(
    "command",
    [["export"], ["--json", "list", "--scope", "project:pay", "--all-pages"]],
    ids=["export", "list"],
)
def test_a_reader_that_leaves_early_ends_the_cli_quietly(api_url: str, many: Team, command: list[str]) -> None:
    first, code, err = _read_one_line_then_leave(_tenure(api_url, many.keys["alice"], *command))
    assert first.strip()  # the output had started
    assert (code, err.decode()) == (EXIT_READER_GONE, "")


def test_a_reader_gone_before_anything_was_written_ends_it_quietly_too(api_url: str, many: Team) -> None:
    """The answer is small and waits in standard output's buffer: the broken pipe shows when it
    is flushed, which was at the interpreter's exit."""
    process = _tenure(api_url, many.keys["alice"], "whoami")
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    assert (process.wait(timeout=60), err.decode()) == (EXIT_READER_GONE, "")


def test_a_whole_read_still_succeeds(api_url: str, many: Team) -> None:
    out, err = _tenure(api_url, many.keys["alice"], "export").communicate(timeout=120)
    assert len(out.splitlines()) == BELIEFS and not err
