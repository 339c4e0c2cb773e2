"""The console's Turns page over HTTP (no browser): the tenant's turns by extraction status, one
turn whole, and the retry of a failed one or of the newest failed ones, through the same
:class:`FailedTurns` as ``/v1/admin/turns``. Two tenants, a member and an admin in each: members
get 403, another tenant's admin "not found"; every change is a confirmed form with the session's
CSRF token; a turn's text is the client's and is shown escaped."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api.state import Services
from service.console.routes import turns as turns_page
from service.storage.turns import TurnRecord
from tests.api.conftest import Team, make_team, ok
from tests.api.test_console import csrf_of, sign_in

# the error the sweep leaves on a turn whose attempts were all cut short (test_failed_turns.py)
FAILED = "gave up after 3 attempts, none finished; the last one: interrupted: SoftTimeLimitExceeded: slow"
HOSTILE = '<script>alert("owned")</script><img src=x onerror=alert(1)> & what do we use?'
ROW_RE = re.compile(r'<tr data-turn="([^"]+)">')


def stored_turn(services: Services, team: Team, owner: str, **fields: Any) -> str:
    """A turn of ``owner`` stored as ``POST /v1/turns`` stores one, not enqueued (as
    ``tests/memory_loop/test_failed_turns.py`` does); ``fields`` set its texts and extraction state."""
    turn_id = f"turn-{uuid.uuid4().hex[:10]}"
    record = {
        "tenant_id": team.tenant,
        "turn_id": turn_id,
        "owner_id": owner,
        "projects": ["pay"],
        "session_id": "s-failed",
        "scope": ["domain:code"],
        "source": "client",
        "model": "gpt-4o",
        "user_message": "what do we use?",
        "assistant_text": "We use it.",
        "parse_status": "parsed",
        "gate": "verified",
        **fields,
    }
    services.loop.turns.create(TurnRecord(**record))
    return turn_id


def failed_turn(services: Services, team: Team, owner: str, **fields: Any) -> str:
    """A turn the sweep failed: its attempts spent in an outage, final until an admin retries it."""
    return stored_turn(
        services, team, owner, **{"extraction_status": "failed", "attempts": 3, "error": FAILED, **fields}
    )


def refresh_turns(services: Services) -> None:
    services.opensearch.indices.refresh(index=services.loop.turns.alias)


def rows(html: str) -> list[str]:
    return ROW_RE.findall(html)


def notice_of(web: TestClient, response: Any) -> str:
    assert response.status_code == 303, response.text
    location = response.headers["location"]
    shown = web.get(location)
    assert shown.status_code == 200, shown.text
    found = re.search(r'<p class="notice" role="status">([^<]*)</p>', shown.text)
    assert found, shown.text
    return found.group(1)


@pytest.fixture
def two(client: TestClient, operator: dict[str, str]) -> tuple[Team, Team]:
    return make_team(client, operator), make_team(client, operator)


def test_the_list_shows_failed_turns_newest_first_filters_by_status_and_owner_and_pages(
    app: FastAPI, services: Services, two: tuple[Team, Team], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two
    oldest = failed_turn(services, a, "alice")
    middle = failed_turn(services, a, "bob", error="<b>store</b> refused: " + "x" * 400)
    newest = failed_turn(services, a, "alice")
    done = stored_turn(services, a, "alice", extraction_status="done", attempts=1)
    theirs = failed_turn(services, b, "alice")
    refresh_turns(services)
    web = sign_in(app, a.keys["carol"])

    listing = web.get("/console/turns")
    assert listing.status_code == 200, listing.text
    assert rows(listing.text) == [newest, middle, oldest]  # failed by default, newest first, A's only
    assert theirs not in listing.text and done not in listing.text
    for shown in ("alice", "bob", "s-failed", "gpt-4o", "failed", FAILED[:60], f"/console/turns/{newest}"):
        assert shown in listing.text, shown
    assert "&lt;b&gt;store&lt;/b&gt; refused" in listing.text and "<b>store</b>" not in listing.text
    assert "x" * 400 not in listing.text  # the error is clipped in the list
    assert 'id="retry-all"' in listing.text
    assert 'href="/console/turns"' in listing.text  # the nav entry, for admins

    assert rows(web.get("/console/turns", params={"status": "done"}).text) == [done]
    assert rows(web.get("/console/turns", params={"status": "pending"}).text) == []
    assert "No pending turn." in web.get("/console/turns", params={"status": "pending"}).text
    assert 'id="retry-all"' not in web.get("/console/turns", params={"status": "done"}).text
    assert rows(web.get("/console/turns", params={"owner": "bob"}).text) == [middle]
    assert rows(web.get("/console/turns", params={"owner": "alice", "status": "failed"}).text) == [newest, oldest]

    monkeypatch.setattr(turns_page, "PAGE_SIZE", 2)
    first = web.get("/console/turns")
    assert rows(first.text) == [newest, middle]
    more = re.search(r'id="more-turns" href="([^"]+)"', first.text)
    assert more, first.text
    second = web.get(more.group(1).replace("&amp;", "&"))
    assert rows(second.text) == [oldest] and 'id="more-turns"' not in second.text

    for params in ({"status": "broken"}, {"owner": "Not A Slug!"}, {"cursor": "not-a-cursor"}):
        refused = web.get("/console/turns", params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert 'class="error"' in refused.text

    # the other tenant's admin sees only their own
    other = sign_in(app, b.keys["carol"])
    assert rows(other.get("/console/turns").text) == [theirs]


def test_the_detail_page_shows_the_turn_whole_and_its_text_escaped(
    app: FastAPI, services: Services, two: tuple[Team, Team]
) -> None:
    a, _ = two
    long_answer = "A" * (turns_page.TEXT_CLIP + 1234)
    turn_id = failed_turn(
        services,
        a,
        "alice",
        user_message=HOSTILE,
        assistant_text=long_answer,
        sidecar_raw='{"new_beliefs": [{"canonical_name": "</pre><script>x()</script>"}]}',
        injected_ids=["b-pay"],
        result={"note": "<i>kept</i>"},
    )
    web = sign_in(app, a.keys["carol"])
    detail = web.get(f"/console/turns/{turn_id}")
    assert detail.status_code == 200, detail.text
    text = detail.text
    assert "<script" not in text and "<img" not in text and "<i>kept" not in text
    assert "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt; &amp; what" in text
    assert "&lt;/pre&gt;&lt;script&gt;x()&lt;/script&gt;" in text
    assert "A" * turns_page.TEXT_CLIP in text and "A" * (turns_page.TEXT_CLIP + 1) not in text
    assert "Clipped: 1234 more characters" in text
    for shown in (
        "alice",
        "s-failed",
        "gpt-4o",
        "domain:code",
        "parsed",
        "verified",
        FAILED,
        'href="/console/beliefs/b-pay"',
    ):
        assert shown in text, shown
    assert 'id="retry-turn"' in text and "Retry extraction" in text
    assert " style=" not in text and detail.headers["content-security-policy"].startswith("default-src 'none'")
    # a turn not failed has no retry button
    done = stored_turn(services, a, "alice", extraction_status="done", attempts=1, result={"created": ["b-x"]})
    assert 'id="retry-turn"' not in web.get(f"/console/turns/{done}").text
    missing = web.get("/console/turns/turn-nowhere")
    assert missing.status_code == 404 and "not_found" in missing.text
    assert web.get("/console/turns/bad%20id").status_code == 422


def test_members_get_403_and_another_tenants_admin_404(
    app: FastAPI, services: Services, two: tuple[Team, Team]
) -> None:
    a, b = two
    turn_id = failed_turn(services, a, "bob")
    refresh_turns(services)
    member = sign_in(app, a.keys["bob"])  # the turn's own author, but not an admin
    assert 'href="/console/turns"' not in member.get("/console/").text
    for path in ("/console/turns", "/console/turns?status=done", f"/console/turns/{turn_id}"):
        refused = member.get(path)
        assert refused.status_code == 403, path
        assert "forbidden" in refused.text and "what do we use?" not in refused.text
    token = csrf_of(member)
    for path in (f"/console/turns/{turn_id}/retry", "/console/turns/retry"):
        assert member.post(path, data={"csrf_token": token, "confirmed": "yes"}).status_code == 403, path

    stranger = sign_in(app, b.keys["carol"])
    gone = stranger.get(f"/console/turns/{turn_id}")
    assert gone.status_code == 404 and "what do we use?" not in gone.text
    assert turn_id not in stranger.get("/console/turns").text
    token = csrf_of(stranger)
    for data in ({"csrf_token": token}, {"csrf_token": token, "confirmed": "yes"}):
        assert stranger.post(f"/console/turns/{turn_id}/retry", data=data).status_code == 404
    stranger.post("/console/turns/retry", data={"csrf_token": token, "confirmed": "yes"})  # their own tenant's
    assert services.loop.turns.load(a.tenant, turn_id)[0].extraction_status == "failed"  # untouched


def test_retry_round_trip_behind_csrf_and_a_confirmation(
    app: FastAPI, client: TestClient, services: Services, two: tuple[Team, Team]
) -> None:
    a, b = two
    turn_id = failed_turn(services, a, "alice")
    web = sign_in(app, a.keys["carol"])
    for data in ({"confirmed": "yes"}, {"csrf_token": "forged", "confirmed": "yes"}):
        refused = web.post(f"/console/turns/{turn_id}/retry", data=data)
        assert refused.status_code == 403 and "CSRF" in refused.text
    other_session = csrf_of(sign_in(app, a.keys["carol"]))
    assert web.post(f"/console/turns/{turn_id}/retry", data={"csrf_token": other_session}).status_code == 403
    assert services.loop.turns.load(a.tenant, turn_id)[0].extraction_status == "failed"

    token = csrf_of(web, f"/console/turns/{turn_id}")
    asked = web.post(f"/console/turns/{turn_id}/retry", data={"csrf_token": token})
    assert asked.status_code == 200 and "Confirm: retry" in asked.text and 'name="confirmed" value="yes"' in asked.text
    assert "3 attempts spent" in asked.text
    assert services.loop.turns.load(a.tenant, turn_id)[0].extraction_status == "failed"  # not yet

    done = web.post(f"/console/turns/{turn_id}/retry", data={"csrf_token": token, "confirmed": "yes"})
    assert done.headers["location"].startswith(f"/console/turns/{turn_id}?notice=")
    assert notice_of(web, done) == f"turn {turn_id} sent back for extraction: queued"
    turn = services.loop.turns.load(a.tenant, turn_id)[0]
    assert (turn.extraction_status, turn.attempts) == ("pending", 0)
    assert turn.error and turn.error.startswith("retry requested by carol at ") and turn.error.endswith(FAILED)
    page = web.get(f"/console/turns/{turn_id}").text
    assert 'id="retry-turn"' not in page and "retry requested by carol" in page
    services.audit.refresh()
    events = ok(client.get("/v1/admin/audit", params={"action": "turn.retry"}, headers=a.h("carol")))["items"]
    [event] = [e for e in events if e["details"]["turn_id"] == turn_id]
    assert (event["actor_id"], event["details"]["previous_error"], event["details"]["queued"]) == (
        "carol",
        FAILED,
        True,
    )
    assert ok(client.get("/v1/admin/audit", params={"action": "turn.retry"}, headers=b.h("carol")))["items"] == []
    refresh_turns(services)
    assert turn_id not in rows(web.get("/console/turns").text)
    assert turn_id in rows(web.get("/console/turns", params={"status": "pending"}).text)

    # not failed any more: the console's error page with the API's 409, before and after confirming
    for data in ({"csrf_token": token}, {"csrf_token": token, "confirmed": "yes"}):
        again = web.post(f"/console/turns/{turn_id}/retry", data=data)
        assert again.status_code == 409, again.text
        assert 'data-code="turn_not_failed"' in again.text and "is pending, not failed" in again.text


def test_a_retry_the_queue_refused_says_the_sweep_picks_it_up(
    app: FastAPI, services: Services, two: tuple[Team, Team], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refusing the send (fault injected at the queue's send): the turn is pending all the
    same, and the notice says what the API's ``queued: false`` says."""
    a, _ = two
    turn_id = failed_turn(services, a, "alice")

    def refused(*_: object) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(services.loop.queue, "extract", refused)
    web = sign_in(app, a.keys["carol"])
    done = web.post(f"/console/turns/{turn_id}/retry", data={"csrf_token": csrf_of(web), "confirmed": "yes"})
    stale = services.settings.loop.sweep_stale_after_s
    assert notice_of(web, done) == (
        f"turn {turn_id} is pending again; the queue refused the send, so it will be picked up by the sweep "
        f"once it has been pending {stale} s"
    )
    assert services.loop.turns.load(a.tenant, turn_id)[0].extraction_status == "pending"


def test_retry_all_failed_is_confirmed_capped_and_stays_in_the_tenant(
    app: FastAPI, services: Services, two: tuple[Team, Team]
) -> None:
    a, b = two
    alices = [failed_turn(services, a, "alice") for _ in range(3)]
    bobs = failed_turn(services, a, "bob")
    theirs = failed_turn(services, b, "alice")
    refresh_turns(services)
    web = sign_in(app, a.keys["carol"])
    token = csrf_of(web, "/console/turns")
    assert web.post("/console/turns/retry", data={"confirmed": "yes"}).status_code == 403  # no CSRF token
    for limit in ("0", "201", "many"):
        refused = web.post("/console/turns/retry", data={"csrf_token": token, "limit": limit})
        assert refused.status_code == 422, limit
    assert web.post("/console/turns/retry", data={"csrf_token": token, "owner": "Not A Slug!"}).status_code == 422

    asked = web.post("/console/turns/retry", data={"csrf_token": token, "owner": "alice", "limit": "2"})
    assert asked.status_code == 200 and "Confirm: retry" in asked.text and "Send up to 2 of alice" in asked.text
    assert all(services.loop.turns.load(a.tenant, t)[0].extraction_status == "failed" for t in alices)

    form = {"csrf_token": token, "owner": "alice", "limit": "2", "confirmed": "yes"}
    done = web.post("/console/turns/retry", data=form)
    assert done.headers["location"].startswith("/console/turns?owner=alice&notice=")
    said = notice_of(web, done)
    assert said == "2 failed turns sent back for extraction (2 queued); more failed turns remain: retry again"
    states = {t: services.loop.turns.load(a.tenant, t)[0].extraction_status for t in [*alices, bobs]}
    assert states == {alices[0]: "failed", alices[1]: "pending", alices[2]: "pending", bobs: "failed"}  # newest first
    refresh_turns(services)
    rest = web.post("/console/turns/retry", data={"csrf_token": token, "confirmed": "yes"})
    assert notice_of(web, rest) == "2 failed turns sent back for extraction (2 queued)"
    assert services.loop.turns.load(a.tenant, bobs)[0].extraction_status == "pending"
    assert services.loop.turns.load(b.tenant, theirs)[0].extraction_status == "failed"  # the other tenant's
    refresh_turns(services)
    nothing = web.post("/console/turns/retry", data={"csrf_token": token, "confirmed": "yes"})
    assert notice_of(web, nothing) == "no failed turn to retry"


def test_an_operator_sees_and_retries_only_the_tenant_shown(
    app: FastAPI, client: TestClient, services: Services, operator: dict[str, str], two: tuple[Team, Team]
) -> None:
    """An operator who shows tenant A acts as A's admin: A's turns, never B's, and the retry is
    audited in A's trail as the operator."""
    a, b = two
    mine, theirs = failed_turn(services, a, "alice"), failed_turn(services, b, "alice")
    refresh_turns(services)
    web = sign_in(app, operator["Authorization"].removeprefix("Bearer "))
    token = csrf_of(web, "/console/tenants")
    assert web.post("/console/tenants/view", data={"csrf_token": token, "tenant_id": a.tenant}).status_code == 303
    assert rows(web.get("/console/turns").text) == [mine]
    assert web.get(f"/console/turns/{theirs}").status_code == 404
    assert web.post(f"/console/turns/{theirs}/retry", data={"csrf_token": token, "confirmed": "yes"}).status_code == 404
    done = web.post(f"/console/turns/{mine}/retry", data={"csrf_token": token, "confirmed": "yes"})
    assert notice_of(web, done) == f"turn {mine} sent back for extraction: queued"
    assert services.loop.turns.load(b.tenant, theirs)[0].extraction_status == "failed"
    services.audit.refresh()
    events = ok(client.get("/v1/admin/audit", params={"action": "turn.retry"}, headers=a.h("carol")))["items"]
    assert [(e["actor_id"], e["actor_kind"], e["details"]["turn_id"]) for e in events] == [("root", "operator", mine)]
