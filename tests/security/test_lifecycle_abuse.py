"""Issue 10 findings 2, 5 and 7 (imports), replayed over HTTP against the real stack:

- lifecycle links are made by the server: a member's import cannot set ``supersedes`` /
  ``superseded_by``, an admin's migration import keeps a link only when both sides name each other
  with the same owner, and erase and history follow reciprocal links only (a forged link cannot
  make an admin's erase delete a colleague's private belief, nor show its id);
- a member's import gets the server's values for server-owned fields; an admin's keeps them and
  the audit says so; the import report names what it changed and warns about unknown owners;
- a change log past its cap rolls over (first entry + marker + newest) instead of failing.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from opensearchpy import OpenSearch

from service.config import Settings
from service.domain.belief import MAX_CHANGE_LOG, ROLLOVER_TRIGGER, Belief
from service.storage.templates import BELIEFS
from tests.api.conftest import Team, belief_body, ok


def _private(client: TestClient, team: Team, user: str = "alice") -> str:
    body = belief_body(f"private_{uuid.uuid4().hex[:6]}", scope="user:universal")
    return str(ok(client.post("/v1/beliefs", json=body, headers=team.h(user)), 201)["id"])


def _record(belief_id: str, **extra: Any) -> dict[str, Any]:
    return {**belief_body(belief_id.replace("-", "_")), "_id": belief_id, **extra}


def test_a_members_import_cannot_link_to_a_colleagues_belief(client: TestClient, team: Team) -> None:
    victim = _private(client, team)
    bait = _record("b-bait", supersedes=victim)
    report = ok(client.post("/v1/beliefs/import", json=[bait], headers=team.h("bob")))
    assert report["imported"] == ["b-bait"]
    assert any("supersedes" in note for note in report["changed"]["b-bait"])
    assert ok(client.get("/v1/beliefs/b-bait", headers=team.h("bob")))["supersedes"] is None
    history = ok(client.get("/v1/beliefs/b-bait/history", headers=team.h("bob")))
    assert victim not in str(history)
    erased = ok(client.delete("/v1/beliefs/b-bait", headers=team.h("carol")))
    assert erased["belief_versions_removed"] == ["b-bait"]
    assert ok(client.get(f"/v1/beliefs/{victim}", headers=team.h("alice")))["id"] == victim


def _plant(os_client: OpenSearch, settings: Settings, belief: Belief) -> None:
    os_client.index(
        index=BELIEFS.alias(settings.opensearch_namespace),
        id=f"{belief.tenant_id}:{belief.id}",
        routing=belief.tenant_id,
        body=belief.to_document(),
        refresh=True,
    )


def test_erase_and_history_follow_only_reciprocal_links(
    client: TestClient, team: Team, os_client: OpenSearch, api_settings: Settings
) -> None:
    """A one-sided link already in the index (written before imports were checked) is not followed."""
    victim = _private(client, team)
    chain = [f"b-forged-{i}" for i in range(5)]
    for i, belief_id in enumerate(chain):  # each names the next (and the last the victim); none names back
        target = chain[i + 1] if i + 1 < len(chain) else victim
        bait = Belief(**{**_record(belief_id), "tenant_id": team.tenant, "owner_id": "bob", "supersedes": target})
        _plant(os_client, api_settings, bait)
    history = ok(client.get(f"/v1/beliefs/{chain[0]}/history", headers=team.h("bob")))
    assert [b["id"] for b in history["chain"]] == [chain[0]]
    erased = ok(client.delete(f"/v1/beliefs/{chain[0]}", headers=team.h("carol")))
    assert erased["belief_versions_removed"] == [chain[0]]
    assert ok(client.get(f"/v1/beliefs/{victim}", headers=team.h("alice")))["id"] == victim
    assert ok(client.get(f"/v1/beliefs/{chain[1]}", headers=team.h("bob")))["id"] == chain[1]


def test_an_admin_migration_keeps_only_reciprocal_same_owner_links(client: TestClient, team: Team) -> None:
    old = _record("b-old", epistemic_status="superseded", superseded_by="b-new", owner_id="bob")
    new = _record("b-new", supersedes="b-old", owner_id="bob")
    lonely = _record("b-lonely", supersedes="b-old", owner_id="bob")  # b-old names b-new, not it
    other = _record("b-other-owner", supersedes="b-theirs", owner_id="alice")
    theirs = _record("b-theirs", epistemic_status="superseded", superseded_by="b-other-owner", owner_id="bob")
    report = ok(client.post("/v1/beliefs/import", json=[old, new, lonely, other, theirs], headers=team.h("carol")))
    assert sorted(report["imported"]) == sorted(["b-old", "b-new", "b-lonely", "b-other-owner", "b-theirs"])
    assert set(report["changed"]) == {"b-lonely", "b-other-owner", "b-theirs"}
    history = ok(client.get("/v1/beliefs/b-new/history", headers=team.h("bob")))
    assert [b["id"] for b in history["chain"]] == ["b-old", "b-new"]
    assert ok(client.get("/v1/beliefs/b-lonely", headers=team.h("bob")))["supersedes"] is None
    erased = ok(client.delete("/v1/beliefs/b-new", headers=team.h("carol")))
    assert sorted(erased["belief_versions_removed"]) == ["b-new", "b-old"]


def test_history_of_a_long_chain_is_bounded(client: TestClient, team: Team) -> None:
    """A 130-version chain (reciprocal, same owner: an admin migration may keep it) used to cost one
    search per version on every history call: history follows at most MAX_HISTORY (50) versions
    each way, while the admin's erase still takes the whole chain (up to MAX_CHAIN, 200)."""
    ids = [f"b-long-{i:03d}" for i in range(130)]
    records = []
    for i, belief_id in enumerate(ids):
        links: dict[str, Any] = {"owner_id": "bob"}
        if i > 0:
            links["supersedes"] = ids[i - 1]
        if i < len(ids) - 1:
            links.update(superseded_by=ids[i + 1], epistemic_status="superseded")
        records.append({**_record(belief_id, **links), "canonical_name": "long_chain"})
    report = ok(client.post("/v1/beliefs/import", json=records, headers=team.h("carol")))
    assert sorted(report["imported"]) == ids and not report.get("changed")
    newest = ok(client.get(f"/v1/beliefs/{ids[-1]}/history", headers=team.h("bob")))
    assert [b["id"] for b in newest["chain"]] == ids[-51:]
    middle = ok(client.get(f"/v1/beliefs/{ids[64]}/history", headers=team.h("bob")))
    assert [b["id"] for b in middle["chain"]] == ids[14:115]
    erased = ok(client.delete(f"/v1/beliefs/{ids[-1]}", headers=team.h("carol")))
    assert sorted(erased["belief_versions_removed"]) == ids


def test_an_import_split_across_requests_loses_the_links_that_cross_it(client: TestClient, team: Team) -> None:
    """What ``docs/api.md`` states for a chain cut between two requests (a chunked ``tenure
    import``): each side is dropped in its own request, both versions are stored unlinked, the
    older stays superseded (never injected) and erase takes one version only."""
    old = _record("b-split-old", epistemic_status="superseded", superseded_by="b-split-new", owner_id="bob")
    new = _record("b-split-new", supersedes="b-split-old", owner_id="bob")
    first = ok(client.post("/v1/beliefs/import", json=[old], headers=team.h("carol")))
    assert first["imported"] == ["b-split-old"]
    assert first["changed"]["b-split-old"] == [
        "dropped superseded_by: the other side does not link back with the same owner"
    ]
    second = ok(client.post("/v1/beliefs/import", json=[new], headers=team.h("carol")))
    assert second["changed"]["b-split-new"] == [
        "dropped supersedes: the other side does not link back with the same owner"
    ]
    stored_old = ok(client.get("/v1/beliefs/b-split-old", headers=team.h("bob")))
    assert stored_old["superseded_by"] is None and stored_old["epistemic_status"] == "superseded"
    assert ok(client.get("/v1/beliefs/b-split-new", headers=team.h("bob")))["supersedes"] is None
    history = ok(client.get("/v1/beliefs/b-split-new/history", headers=team.h("bob")))
    assert [b["id"] for b in history["chain"]] == ["b-split-new"]
    erased = ok(client.delete("/v1/beliefs/b-split-new", headers=team.h("carol")))
    assert erased["belief_versions_removed"] == ["b-split-new"]
    assert ok(client.get("/v1/beliefs/b-split-old", headers=team.h("bob")))["id"] == "b-split-old"


FORGED = {
    "change_log": [{"changed_at": "2020-01-01T00:00:00Z", "trigger": "created", "actor": "carol"}],
    "created_at": "2999-01-01T00:00:00Z",
    "updated_at": "2999-01-01T00:00:00Z",
    "last_reinforced_at": "2999-01-01T00:00:00Z",
    "version": 7,
    "reinforcement_count": 99,
}


def test_a_members_import_gets_server_values_an_admins_keeps_them_audited(client: TestClient, team: Team) -> None:
    mine = _record("b-forged-fields", **FORGED)
    report = ok(client.post("/v1/beliefs/import", json=[mine], headers=team.h("bob")))
    assert "server values" in report["changed"]["b-forged-fields"][0]
    stored = ok(client.get("/v1/beliefs/b-forged-fields", headers=team.h("bob")))
    assert stored["version"] == 1 and stored["reinforcement_count"] == 0
    assert stored["last_reinforced_at"] is None
    assert datetime.fromisoformat(stored["created_at"]) < datetime.now(UTC) + timedelta(minutes=1)
    assert [e["actor"] for e in stored["change_log"]] == ["bob"]
    migrated = _record("b-migrated", owner_id="bob", **FORGED)
    report = ok(client.post("/v1/beliefs/import", json=[migrated], headers=team.h("carol")))
    assert "b-migrated" not in report["changed"]
    kept = ok(client.get("/v1/beliefs/b-migrated", headers=team.h("bob")))
    assert kept["version"] == 7 and kept["created_at"].startswith("2999")
    events = _events(client, team, "b-migrated")
    details = events[0]["details"]
    assert set(details["kept_server_fields"]) == set(FORGED)


def _events(client: TestClient, team: Team, belief_id: str) -> list[dict[str, Any]]:
    """The belief's audit events (searchable within the audit index's 1 s refresh)."""
    deadline = time.monotonic() + 5
    while True:
        items: list[dict[str, Any]] = ok(
            client.get("/v1/admin/audit", params={"belief_id": belief_id}, headers=team.h("carol"))
        )["items"]
        if items or time.monotonic() > deadline:
            return items
        time.sleep(0.2)


def test_an_admin_import_warns_about_owners_who_are_not_users(client: TestClient, team: Team) -> None:
    report = ok(client.post("/v1/beliefs/import", json=[_record("b-ghost", owner_id="ghost")], headers=team.h("carol")))
    assert report["imported"] == ["b-ghost"]
    assert len(report["warnings"]) == 1 and "'ghost'" in report["warnings"][0]
    report = ok(client.post("/v1/beliefs/import", json=[_record("b-real", owner_id="bob")], headers=team.h("carol")))
    assert report["warnings"] == []


def test_a_full_change_log_rolls_over_instead_of_failing(client: TestClient, team: Team) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    entries = [
        {"changed_at": (start + timedelta(minutes=i)).isoformat(), "trigger": f"edit {i}", "actor": "bob"}
        for i in range(MAX_CHANGE_LOG)
    ]
    busy = _record("b-busy", owner_id="bob", change_log=entries)
    ok(client.post("/v1/beliefs/import", json=[busy], headers=team.h("carol")))
    for action in ("pin", "unpin", "pin"):
        ok(client.post(f"/v1/beliefs/b-busy/{action}", headers=team.h("bob")))
    log = ok(client.get("/v1/beliefs/b-busy", headers=team.h("bob")))["change_log"]
    assert len(log) == MAX_CHANGE_LOG
    assert log[0]["trigger"] == "edit 0" and log[1]["trigger"] == ROLLOVER_TRIGGER
    assert log[1]["note"].startswith("4 entries")
    assert [e["trigger"] for e in log[-3:]] == ["pinned", "unpinned", "pinned"]
