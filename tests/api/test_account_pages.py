"""Cursor pagination of user and API key listings: every record exactly once in a stable order,
never another tenant's, and a forged or foreign cursor is a 422 on ``cursor``, not a 500."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Team, ok

EXTRA_USERS = [f"u{i:02d}" for i in range(8)]


@pytest.fixture
def crowded(client: TestClient, team: Team, operator: dict[str, str]) -> Team:
    """The team plus eight more users with a key each: 11 users, 11 keys."""
    for user in EXTRA_USERS:
        ok(client.post(f"/v1/admin/tenants/{team.tenant}/users", json={"user_id": user}, headers=operator), 201)
        ok(client.post(f"/v1/admin/tenants/{team.tenant}/users/{user}/keys", json={}, headers=operator), 201)
    return team


def _millis(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def _walk(client: TestClient, path: str, headers: dict[str, str], limit: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    params: dict[str, Any] = {"limit": limit}
    pages = 0
    while True:
        page = ok(client.get(path, params=params, headers=headers))
        pages += 1
        assert len(page["items"]) <= limit
        items += page["items"]
        if page["next_cursor"] is None:
            return items, pages
        params["cursor"] = page["next_cursor"]


@pytest.mark.parametrize(("listing", "field"), [("users", "user_id"), ("keys", "key_id")])
def test_pages_cover_every_record_once_in_order(
    client: TestClient, crowded: Team, other_team: Team, listing: str, field: str
) -> None:
    path = f"/v1/admin/tenants/{crowded.tenant}/{listing}"
    everything = ok(client.get(path, params={"limit": 500}, headers=crowded.h("carol")))
    assert len(everything["items"]) == 11 and everything["next_cursor"] is None
    paged, pages = _walk(client, path, crowded.h("carol"), limit=3)
    assert pages == 4
    assert [r[field] for r in paged] == [r[field] for r in everything["items"]]
    assert len({r[field] for r in paged}) == 11
    assert all(r["tenant_id"] == crowded.tenant for r in paged)
    ordered = [(_millis(r["created_at"]), r[field]) for r in paged]
    assert ordered == sorted(ordered)  # OpenSearch sorts dates at millisecond precision
    if listing == "users":
        assert {r["user_id"] for r in paged} == {"alice", "bob", "carol", *EXTRA_USERS}
    else:
        assert {crowded.keys[u].split("_")[1] for u in ("alice", "bob", "carol")} <= {r["key_id"] for r in paged}
        assert all("key_hash" not in r and "key" not in r for r in paged)
    # The other tenant's listing holds only its own three records.
    other = ok(client.get(f"/v1/admin/tenants/{other_team.tenant}/{listing}", headers=other_team.h("carol")))
    assert len(other["items"]) == 3 and {r["tenant_id"] for r in other["items"]} == {other_team.tenant}


def test_a_cursor_reveals_nothing_across_tenants(client: TestClient, crowded: Team, other_team: Team) -> None:
    path = f"/v1/admin/tenants/{crowded.tenant}/users"
    cursor = ok(client.get(path, params={"limit": 2}, headers=crowded.h("carol")))["next_cursor"]
    assert cursor
    # The admin of another tenant cannot use it on this tenant, and on their own it only pages
    # through their own users.
    assert client.get(path, params={"cursor": cursor}, headers=other_team.h("carol")).status_code == 403
    own = f"/v1/admin/tenants/{other_team.tenant}/users"
    page = ok(client.get(own, params={"cursor": cursor}, headers=other_team.h("carol")))
    assert {u["tenant_id"] for u in page["items"]} <= {other_team.tenant}
    assert client.get(path, params={"limit": 2}, headers=crowded.h("alice")).status_code == 403


def _forge(values: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


@pytest.mark.parametrize("listing", ["users", "keys"])
@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "not a cursor!"},
        {"cursor": _forge(["2026-01-01", "alice"])},
        {"cursor": _forge([1, 2])},
        {"cursor": _forge([True, "alice"])},
        {"cursor": _forge([1])},
        {"cursor": _forge({"a": 1})},
        {"limit": 0},
        {"limit": 501},
        {"limit": "many"},
    ],
)
def test_bad_paging_input_is_a_422(client: TestClient, team: Team, listing: str, params: dict[str, Any]) -> None:
    response = client.get(f"/v1/admin/tenants/{team.tenant}/{listing}", params=params, headers=team.h("carol"))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert any(d["loc"][:2] == ["query", next(iter(params))] for d in error["details"])
