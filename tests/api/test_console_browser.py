"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright) against a
real uvicorn serving the app on a free port, with the session's real OpenSearch and Redis.

One browser for the module; each test opens its own context (a fresh cookie jar). With
``TENURE_CONSOLE_SCREENSHOTS=<dir>`` the tests also save a screenshot of each page there (that is
how ``docs/console/*.png`` are made: see ``docs/console.md``).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.state import Services
from service.app import create_app
from service.config import Settings
from tests.api.conftest import Team, belief_body, make_team, ok
from tests.api.test_console import file_conflict
from tests.api.test_console_turns import FAILED, failed_turn, refresh_turns, stored_turn
from tests.live import serve

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Debian's Chromium as root in a closed network: no sandbox, no GPU, no background calls home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = os.environ.get("TENURE_CONSOLE_SCREENSHOTS")

if not Path(CHROMIUM).exists():  # pragma: no cover - scripts/setup.sh installs it
    pytest.skip("chromium is not installed: run scripts/setup.sh", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def console_url(api_settings: Settings, client: TestClient) -> Iterator[str]:
    """The app under a real uvicorn (its own lifespan, the same stores as ``client``)."""
    with serve(create_app(api_settings)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    ctx.set_default_timeout(15_000)
    yield ctx
    ctx.close()


def shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def sign_in(context: BrowserContext, url: str, credential: str, *, screenshot: bool = False) -> Page:
    page = context.new_page()
    page.goto(f"{url}/console/")
    expect(page).to_have_url(f"{url}/console/login?next=/console/")
    if screenshot:
        shot(page, "login")
    page.fill("input[name=credential]", credential)
    page.click("button[type=submit]")
    expect(page.locator("header .who")).to_contain_text("@")
    return page


@pytest.fixture(scope="module")
def team(client: TestClient, operator: dict[str, str]) -> Team:
    """Alice and bob share project pay; alice keeps a personal belief; bob recalls twice."""
    team = make_team(client, operator)
    seed = [
        ("b-psp", "payment_provider", "project:pay", "We use Stripe for card payments.", "alice"),
        ("b-ts", "typescript_strict", "project:pay", "TypeScript strict mode everywhere.", "bob"),
        ("b-mongo", "mongodb_driver", "project:pay", "MongoDB raw driver, not Mongoose.", "alice"),
        ("b-alice-notes", "alice_private_notes", "domain:code", "Alice's private notes.", "alice"),
        ("b-old-ci", "ci_provider", "project:pay", "CI runs on Jenkins.", "bob"),
    ]
    for belief_id, name, scope, content, owner in seed:
        body = belief_body(name, scope, id=belief_id, content=content, why_it_matters=f"Decides how we answer {name}.")
        ok(client.post("/v1/beliefs", json=body, headers=team.h(owner)), 201)
    ok(client.post("/v1/beliefs/b-ts/pin", headers=team.h("bob")))
    for query in ("Which payment provider do we use?", "set up the mongodb driver"):
        recall = {"scopes": ["project:pay"], "query": query, "session_id": "s-tuesday"}
        ok(client.post("/v1/recall", json=recall, headers=team.h("bob")))
    return team


def test_admin_finds_a_belief_supersedes_it_and_sees_the_chain(
    context: BrowserContext, console_url: str, team: Team
) -> None:
    page = sign_in(context, console_url, team.keys["carol"], screenshot=True)
    expect(page.locator("#total-beliefs")).to_have_text("5")
    expect(page.locator("#injections")).to_have_text("2")  # bob's two recalls, drained from the outbox
    shot(page, "overview")
    page.click("text=Beliefs")
    page.fill("input[name=q]", "payment provider")
    page.click("#belief-filters button[type=submit]")
    rows = page.locator("#belief-list tbody tr")
    expect(rows).to_have_count(1)
    shot(page, "beliefs")
    rows.locator("a").first.click()
    expect(page.locator("#belief-content")).to_have_text("We use Stripe for card payments.")
    page.fill("#supersede-form textarea[name=content]", "We use Adyen for card payments since the migration.")
    page.fill("#supersede-form input[name=reason]", "Stripe contract ended")
    page.click("#supersede-form button[type=submit]")
    expect(page.locator("#confirm")).to_contain_text("Adyen")
    shot(page, "confirm")
    page.click("#confirm button[type=submit]")
    expect(page.locator(".notice")).to_contain_text("superseded by")
    chain = page.locator("#chain li")
    expect(chain).to_have_count(2)
    expect(chain.nth(0)).to_contain_text("Stripe")
    expect(chain.nth(0)).to_contain_text("superseded")
    expect(chain.nth(1)).to_contain_text("Adyen")
    expect(page.locator("#change-log")).to_contain_text("Stripe contract ended")
    shot(page, "belief")


def test_recall_playground(context: BrowserContext, console_url: str, team: Team) -> None:
    page = sign_in(context, console_url, team.keys["carol"])
    page.click("text=Recall playground")
    page.select_option("select[name=as_user]", "bob")
    page.fill("input[name=scopes]", "project:pay, team:core")
    page.fill("textarea[name=message]", "which mongodb driver and payment provider? and alice private notes?")
    page.fill("input[name=min_score]", "40")
    page.click("#recall-form button[type=submit]")
    tiers = page.locator("#tiers")
    expect(tiers).to_contain_text("typescript_strict")  # pinned
    expect(tiers.locator("text=mongodb_driver")).to_have_count(0)  # name and alias: 28 < 40
    near = page.locator("#near-misses li[data-reason=below_threshold]").filter(has_text="mongodb_driver")
    expect(near).to_have_count(1)
    expect(near).to_contain_text("score 28.00 < 40")
    explain = page.locator("#explain")
    expect(explain).to_contain_text("team:core")  # bob holds no grant for it
    expect(explain).not_to_contain_text("alice_private_notes")  # named, but not bob's to see
    page.fill("input[name=min_score]", "")
    page.click("#recall-form button[type=submit]")
    expect(tiers).to_contain_text("mongodb_driver")
    expect(page.locator("#injection")).to_contain_text("MongoDB raw driver, not Mongoose.")
    expect(page.locator("#explain")).not_to_contain_text("alice_private_notes")
    shot(page, "recall")


def test_audit_filtered_to_one_receipt_and_exported(context: BrowserContext, console_url: str, team: Team) -> None:
    page = sign_in(context, console_url, team.keys["carol"])
    page.click("header >> text=Audit")
    page.fill("input[name=actor_id]", "bob")
    page.select_option("select[name=action]", "recall")
    page.click("#audit-filters button[type=submit]")
    rows = page.locator("#audit-list tbody tr")
    expect(rows).to_have_count(2)
    shot(page, "audit")
    rows.filter(has_text="payment provider").locator("text=receipt").click()
    expect(page.locator("h1")).to_have_text("Injection receipt")
    expect(page.locator("#receipt-query")).to_contain_text("Which payment provider do we use")
    injected = page.locator("#injected")
    expect(injected).to_contain_text("payment_provider")
    expect(injected).to_contain_text("relevant")
    expect(injected).to_contain_text("typescript_strict")
    shot(page, "receipt")
    page.go_back()
    with page.expect_download() as download:
        page.click("#export-jsonl")
    lines = Path(download.value.path()).read_text().splitlines()
    assert len(lines) == 2 and all('"action":"recall"' in line and '"actor_id":"bob"' in line for line in lines)


def test_resolve_a_review(
    context: BrowserContext, console_url: str, team: Team, services: Services, client: TestClient
) -> None:
    file_conflict(services, team, "b-mongo", "We use Mongoose after all.", "rv-browser", name="mongodb_driver")
    page = sign_in(context, console_url, team.keys["carol"])
    page.click("text=Review queue")
    item = page.locator("[data-review=rv-browser]")
    expect(item.locator(".existing-content")).to_have_text("MongoDB raw driver, not Mongoose.")
    expect(item.locator(".proposed-content")).to_have_text("We use Mongoose after all.")
    shot(page, "reviews")
    item.locator("button", has_text="Reject").click()
    page.click("#confirm button[type=submit]")
    expect(page.locator(".notice")).to_contain_text("reject")
    expect(page.locator("[data-review=rv-browser]")).to_have_count(0)
    assert ok(client.get("/v1/beliefs/b-mongo", headers=team.h("alice")))["content"].startswith("MongoDB raw")


def test_merge_a_review_into_the_existing_belief(
    context: BrowserContext, console_url: str, team: Team, services: Services, client: TestClient
) -> None:
    body = belief_body(
        "deploy_target", "project:pay", id="b-deploy", content="We deploy to Heroku.", aliases=["hosting"]
    )
    ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    proposal = {"why_it_matters": "Autoscaling needs Fly machines.", "aliases": ["fly.io", "fly machines"]}
    file_conflict(services, team, "b-deploy", "We deploy to Fly.io.", "rv-merge", name="deploy_target", **proposal)
    page = sign_in(context, console_url, team.keys["carol"])
    page.click("text=Review queue")
    item = page.locator("[data-review=rv-merge]")
    item.locator("summary", has_text="Merge").click()
    item.locator("input[name=merge_content][value=proposed]").check()
    item.locator("input[name=merge_why_it_matters][value=existing]").check()
    item.scroll_into_view_if_needed()
    shot(page, "review-merge")
    item.locator("button", has_text="Merge").click()
    expect(page.locator("#confirm")).to_contain_text("We deploy to Fly.io.")
    expect(page.locator("#confirm")).to_contain_text("fly machines")
    page.click("#confirm button[type=submit]")
    expect(page.locator(".notice")).to_contain_text("merge")
    chain = page.locator("#chain li")
    expect(chain).to_have_count(2)
    expect(chain.nth(0)).to_contain_text("Heroku")
    expect(chain.nth(1)).to_contain_text("Fly.io")
    expect(page.locator("#change-log")).to_contain_text("merged review rv-merge")
    shot(page, "merged")
    merged = ok(client.get("/v1/beliefs", params={"q": "fly machines"}, headers=team.h("bob")))["items"]
    assert [(b["content"], b["aliases"]) for b in merged] == [
        ("We deploy to Fly.io.", ["hosting", "fly.io", "fly machines"])
    ]


def test_erase_with_receipt(context: BrowserContext, console_url: str, team: Team, client: TestClient) -> None:
    page = sign_in(context, console_url, team.keys["carol"])
    page.goto(f"{console_url}/console/beliefs/b-old-ci")
    page.locator("#actions button", has_text="Erase").click()
    expect(page.locator("#confirm")).to_contain_text("cannot be undone")
    page.click("#confirm button[type=submit]")
    receipt = page.locator("#erasure-receipt")
    expect(receipt).to_contain_text("b-old-ci")
    expect(receipt).to_contain_text("audit payload copies removed")
    shot(page, "erased")
    assert client.get("/v1/beliefs/b-old-ci", headers=team.h("bob")).status_code == 404


def test_team_page(context: BrowserContext, console_url: str, team: Team) -> None:
    page = sign_in(context, console_url, team.keys["carol"])
    page.click("header >> text=Team")
    expect(page.locator("#users tbody tr")).to_have_count(3)
    expect(page.locator("#keys")).to_contain_text("carol")
    shot(page, "team")


def test_failed_turns_listed_and_one_retried(
    context: BrowserContext, console_url: str, team: Team, services: Services, client: TestClient
) -> None:
    """An admin finds the turns an outage failed, reads one (its hostile text shown as text),
    retries it behind the confirmation, and sends the rest back with "Retry all failed"."""
    hostile = "<script>alert('owned')</script> Which CI provider do we use now that Jenkins is gone?"
    answer = "We moved CI to GitHub Actions.\n" + "Each step of the pipeline, in order: " + "lint, test, build. " * 400
    failed_turn(services, team, "bob", session_id="s-monday")
    failed_turn(services, team, "alice", session_id="s-tuesday", error=f"store refused the write: {FAILED}")
    stored_turn(services, team, "alice", session_id="s-tuesday", extraction_status="done", attempts=1)
    turn_id = failed_turn(
        services,
        team,
        "bob",
        session_id="s-tuesday",
        user_message=hostile,
        assistant_text=answer,
        injected_ids=["b-ts"],
    )
    refresh_turns(services)
    page = sign_in(context, console_url, team.keys["carol"])
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.click("header >> text=Turns")
    rows = page.locator("#turn-list tbody tr")
    expect(rows).to_have_count(3)  # the failed ones, newest first; the done one is not listed
    expect(rows.nth(0)).to_contain_text("bob")
    expect(rows.nth(0)).to_contain_text("gave up after 3 attempts")
    expect(page.locator("#turn-statuses a.button:not(.secondary)")).to_have_text("failed")
    shot(page, "turns")
    rows.nth(0).locator("text=details").click()
    expect(page.locator("h1")).to_contain_text(turn_id)
    expect(page.locator("#turn-user")).to_have_text(hostile)  # the markup is text, not a script
    box = page.locator("#turn-assistant").bounding_box()
    assert box is not None and box["height"] <= 340  # a long answer scrolls within its box
    assert page.evaluate("(e => e.scrollHeight > e.clientHeight)(document.querySelector('#turn-assistant'))")
    shot(page, "turn")
    page.click("#retry-turn button")
    expect(page.locator("#confirm")).to_contain_text(f"bob's turn {turn_id}")
    page.click("#confirm button[type=submit]")
    expect(page.locator(".notice")).to_have_text(f"turn {turn_id} sent back for extraction: queued")
    expect(page.locator("#retry-turn")).to_have_count(0)
    assert services.loop.turns.load(team.tenant, turn_id)[0].extraction_status == "pending"
    refresh_turns(services)
    page.click("header >> text=Turns")
    expect(rows).to_have_count(2)
    page.fill("#turn-filters input[name=owner]", "alice")
    page.click("#turn-filters button[type=submit]")
    expect(rows).to_have_count(1)
    page.click("#retry-all button")
    expect(page.locator("#confirm")).to_contain_text("alice's failed turns")
    page.click("#confirm button[type=submit]")
    expect(page.locator(".notice")).to_have_text("1 failed turn sent back for extraction (1 queued)")
    refresh_turns(services)
    page.reload()
    expect(page.locator("#turn-list")).to_contain_text("No failed turn of alice.")
    assert dialogs == []  # no script of the turn's text ever ran


def test_operator_shows_a_tenant(
    context: BrowserContext, console_url: str, team: Team, client: TestClient, operator: dict[str, str]
) -> None:
    other = make_team(client, operator)
    body = belief_body("payment_provider", "project:pay", id="b-psp", content="The other tenant's provider.")
    ok(client.post("/v1/beliefs", json=body, headers=other.h("alice")), 201)
    page = sign_in(context, console_url, operator["Authorization"].removeprefix("Bearer "))
    expect(page.locator("header .who")).to_contain_text("operator")
    expect(page.locator("#shown-tenant")).to_have_text("system")
    page.click("header >> text=Tenants")
    page.locator(f"[data-tenant={team.tenant}] button").click()
    expect(page.locator("#shown-tenant")).to_have_text(team.tenant)
    page.click("header >> text=Tenants")
    expect(page.locator(f"[data-tenant={team.tenant}]")).to_contain_text("shown")
    shot(page, "tenants")
    page.goto(f"{console_url}/console/beliefs/b-mongo")
    expect(page.locator("#belief-content")).to_have_text("MongoDB raw driver, not Mongoose.")
    response = page.goto(f"{console_url}/console/beliefs/b-psp")  # the other tenant's id: not here
    assert response is not None and response.status == 200  # b-psp exists in this tenant too (superseded)
    expect(page.locator("body")).not_to_contain_text("The other tenant's provider.")
    page.click("header >> text=Tenants")
    page.locator(f"[data-tenant={other.tenant}] button").click()
    page.goto(f"{console_url}/console/beliefs/b-psp")
    expect(page.locator("#belief-content")).to_have_text("The other tenant's provider.")
    response = page.goto(f"{console_url}/console/beliefs/b-mongo")
    assert response is not None and response.status == 404


def test_member_cannot_reach_admin_pages_or_a_colleagues_private_belief(
    context: BrowserContext, console_url: str, team: Team
) -> None:
    page = sign_in(context, console_url, team.keys["bob"])
    nav = page.locator("header nav")
    expect(nav).not_to_contain_text("Audit")
    expect(nav).not_to_contain_text("Team")
    expect(page.locator("header .who")).to_contain_text("read-only")
    shot(page, "member")
    expect(nav).not_to_contain_text("Turns")
    for path in (
        "/console/audit",
        "/console/team",
        "/console/reviews",
        "/console/turns",
        "/console/audit/export.csv?actor_id=alice",
    ):
        response = page.goto(f"{console_url}{path}")
        assert response is not None and response.status == 403, path
        expect(page.locator(".error")).to_contain_text("forbidden")
    response = page.goto(f"{console_url}/console/beliefs/b-alice-notes")
    assert response is not None and response.status == 404
    expect(page.locator("body")).not_to_contain_text("Alice's private notes")
    page.goto(f"{console_url}/console/beliefs?q=alice+private+notes")
    expect(page.locator("#belief-list")).to_contain_text("No belief matches.")
    page.goto(f"{console_url}/console/beliefs/b-ts")
    expect(page.locator("#belief-content")).to_have_text("TypeScript strict mode everywhere.")
    expect(page.locator("#actions")).to_have_count(0)


class _Attacker(BaseHTTPRequestHandler):
    """Another site (a different host name, so a different site for SameSite) whose page posts
    a form to the console as soon as it loads."""

    target = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's API
        body = (
            f'<form id="f" method="post" action="{self.target}">'
            '<input name="confirmed" value="yes"><input name="csrf_token" value="guessed"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        return None


def test_cookie_flags_and_cross_site_forms(
    context: BrowserContext, console_url: str, team: Team, client: TestClient
) -> None:
    page = sign_in(context, console_url, team.keys["carol"])
    cookie = next(c for c in context.cookies() if c["name"] == "tenure_console")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    assert cookie["secure"] is False  # development on plain http; Secure elsewhere (test_console.py)
    assert "tenure_console" not in page.evaluate("document.cookie")  # HttpOnly: no script reads it
    # the page's policy (no script, no framing) still lets its own stylesheet in
    assert page.evaluate("getComputedStyle(document.querySelector('header.top')).display") == "flex"
    # the forged post from another site: the Strict cookie is not sent, nothing changes
    _Attacker.target = f"{console_url}/console/beliefs/b-ts/unpin"
    attacker = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    try:
        evil = context.new_page()
        evil.goto(f"http://localhost:{attacker.server_address[1]}/")
        evil.wait_for_url(f"{console_url}/console/**")
        assert "Sign in" in evil.content() or "forbidden" in evil.content() or "unauthenticated" in evil.content()
    finally:
        attacker.shutdown()
    assert ok(client.get("/v1/beliefs/b-ts", headers=team.h("bob")))["pinned"] is True
    # the same post with the session's cookie but without its token: 403
    forged = context.request.post(f"{console_url}/console/beliefs/b-ts/unpin", form={"confirmed": "yes"})
    assert forged.status == 403
    # and no script runs in a console page: its policy blocks even a same-origin fetch
    blocked = page.evaluate(
        """async (url) => { try { await fetch(url, {method: 'POST', body: new URLSearchParams({confirmed: 'yes'})});
           return 'sent'; } catch (e) { return 'blocked'; } }""",
        f"{console_url}/console/beliefs/b-ts/unpin",
    )
    assert blocked == "blocked"
    assert ok(client.get("/v1/beliefs/b-ts", headers=team.h("bob")))["pinned"] is True
    # sign-out revokes: the old cookie value no longer opens a page
    page.goto(f"{console_url}/console/")
    page.click("header button:has-text('Sign out')")
    expect(page).to_have_url(f"{console_url}/console/login")
    context.add_cookies([{**cookie}])  # type: ignore[list-item]
    page.goto(f"{console_url}/console/beliefs")
    expect(page).to_have_url(f"{console_url}/console/login?next=/console/beliefs")
