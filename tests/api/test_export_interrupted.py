"""A JSONL export the store stops serving part-way: the client must say the export is incomplete
(and how far it got), not that the API cannot be reached, over real HTTP (uvicorn) and OpenSearch."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from opensearchpy import OpenSearch
from tenure_client import ConnectionFailed, Tenure

from service.app import create_app
from service.cli import main
from service.config import Settings
from tests.api.conftest import Team, belief_body, ok
from tests.live import serve

BELIEFS = 600  # more than one export page (500): the second page is read after the answer started


@pytest.fixture
def exported_team(client: TestClient, team: Team) -> Team:
    # big beliefs (~10 kB): the first page alone (~5 MB) is more than the socket buffers can hold
    # (the sender's at most tcp_wmem's 4 MB), so the server is still sending it when the test
    # blocks the index
    rows = [
        belief_body(
            f"bulk_thing_x{i:04d}", "project:pay", id=f"b-{i:04d}", content="x" * 8000, why_it_matters="y" * 2000
        )
        for i in range(BELIEFS)
    ]
    for start in range(0, BELIEFS, 15):
        body = "\n".join(json.dumps(r) for r in rows[start : start + 15])
        ok(
            client.post(
                "/v1/beliefs/import", content=body, headers={**team.h("alice"), "Content-Type": "application/x-ndjson"}
            )
        )
    return team


@pytest.fixture
def reads_blocked_once_answering(api_settings: Settings, os_client: OpenSearch) -> Iterator[httpx.Client]:
    """An HTTP client (small receive buffer) to a real uvicorn serving the app: as soon as an
    answer's head arrives, reads of the beliefs index are blocked (a store failing mid-export)."""
    index = f"{api_settings.opensearch_namespace}-beliefs"

    def block(response: httpx.Response) -> None:
        if response.url.path.endswith("/export") and response.status_code == 200:
            os_client.indices.put_settings(index=index, body={"index": {"blocks": {"read": True}}})

    transport = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)])
    try:
        with (
            serve(create_app(api_settings)) as url,
            httpx.Client(base_url=url, transport=transport, event_hooks={"response": [block]}, timeout=60) as http,
        ):
            yield http
    finally:
        os_client.indices.put_settings(index=index, body={"index": {"blocks": {"read": False}}})


def test_the_sdk_says_an_interrupted_export_is_incomplete(
    exported_team: Team, reads_blocked_once_answering: httpx.Client
) -> None:
    alice = Tenure(
        str(reads_blocked_once_answering.base_url),
        exported_team.keys["alice"],
        http_client=reads_blocked_once_answering,
    )
    got: list[str] = []

    def read_all() -> None:
        for belief in alice.beliefs.export():
            got.append(belief.id or "")

    with pytest.raises(ConnectionFailed) as cut:  # still a ConnectionFailed, for callers that catch that
        read_all()
    assert 0 < len(got) < BELIEFS
    assert cut.value.code == "incomplete_answer", cut.value
    assert "cannot reach" not in cut.value.message and f"after {len(got)} lines" in cut.value.message


def test_the_cli_says_an_interrupted_export_file_is_incomplete(
    exported_team: Team, reads_blocked_once_answering: httpx.Client, tmp_path: Path
) -> None:
    target = tmp_path / "acme.jsonl"
    out, err = io.StringIO(), io.StringIO()
    argv = ["--json", "--key", exported_team.keys["alice"], "export", "--out", str(target)]
    code = main(argv, client=reads_blocked_once_answering, out=out, err=err)
    written = target.read_text().splitlines()
    assert code == 1 and 0 < len(written) < BELIEFS
    error = json.loads(err.getvalue())["error"]
    assert error["code"] == "incomplete_answer", error
    assert str(target) in error["message"] and f"{len(written)} beliefs" in error["message"], error
    assert "is the API running" not in (error.get("hint") or "")
