"""The admin console over HTTP (no browser): sessions, cookie flags, CSRF, the read-only member view,
isolation by URL guessing, and the belief actions through the same service layer as the REST API.
The browser scenarios are in ``test_console_browser.py``."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from http.cookies import SimpleCookie

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api.state import Services
from service.app import create_app
from service.config import Settings
from service.console.sessions import COOKIE, LOGIN_CSRF_COOKIE
from service.storage.reviews import ReviewItem, ReviewStore
from tests.api.conftest import Team, belief_body, make_team, ok

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')
LOGIN_RE = re.compile(r'name="login_csrf" value="([^"]+)"')


def browser(app: FastAPI) -> TestClient:
    """A client with its own cookie jar, on the app the session fixture already started."""
    return TestClient(app, follow_redirects=False)


def sign_in(app: FastAPI, credential: str) -> TestClient:
    web = browser(app)
    form = web.get("/console/login")
    token = LOGIN_RE.search(form.text)
    assert token, form.text
    done = web.post("/console/login", data={"credential": credential, "login_csrf": token.group(1), "next": ""})
    assert done.status_code == 303, done.text
    return web


def csrf_of(web: TestClient, path: str = "/console/") -> str:
    page = web.get(path)
    assert page.status_code == 200, page.text
    found = CSRF_RE.search(page.text)
    assert found
    return found.group(1)


def set_cookie_headers(response: object) -> dict[str, SimpleCookie]:
    out: dict[str, SimpleCookie] = {}
    for raw in response.headers.get_list("set-cookie"):  # type: ignore[attr-defined]
        jar: SimpleCookie = SimpleCookie()
        jar.load(raw)
        for name in jar:
            out[name] = jar
    return out


@pytest.fixture(scope="module")
def seeded(client: TestClient, operator: dict[str, str]) -> tuple[Team, Team]:
    """Tenant A: alice's personal belief, a project belief (alice, bob, carol hold project pay),
    a team:core belief only alice holds. Tenant B the same ids."""
    a, b = make_team(client, operator), make_team(client, operator)
    for team in (a, b):
        for belief_id, scope in (("b-private", "domain:code"), ("b-pay", "project:pay"), ("b-core", "team:core")):
            name = belief_id.removeprefix("b-") + "_provider"
            body = belief_body(name, scope, id=belief_id, content=f"{team.tenant} secret {name}")
            ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    return a, b


def test_sign_in_sets_a_strict_httponly_session_cookie_kept_in_redis(
    app: FastAPI, services: Services, seeded: tuple[Team, Team]
) -> None:
    a, _ = seeded
    web = browser(app)
    form = web.get("/console/login")
    login_cookie = set_cookie_headers(form)[LOGIN_CSRF_COOKIE][LOGIN_CSRF_COOKIE]
    assert login_cookie["httponly"] and login_cookie["samesite"] == "strict"
    token = LOGIN_RE.search(form.text)
    assert token
    done = web.post("/console/login", data={"credential": a.keys["carol"], "login_csrf": token.group(1)})
    assert done.status_code == 303 and done.headers["location"] == "/console/"
    morsel = set_cookie_headers(done)[COOKIE][COOKIE]
    assert morsel["httponly"] and morsel["samesite"] == "strict" and morsel["path"] == "/console"
    assert not morsel["secure"]  # development: plain http on a laptop
    assert 0 < int(morsel["max-age"]) <= services.settings.api.console_session_max_s
    digest = hashlib.sha256(morsel.value.encode()).hexdigest()
    key = f"{services.settings.opensearch_namespace}:console:session:{digest}"
    assert services.redis.exists(key) and 0 < services.redis.ttl(key) <= services.settings.api.console_session_idle_s
    assert a.keys["carol"].encode() not in services.redis.get(key)  # the secret is never stored
    home = web.get("/console/")
    assert home.status_code == 200 and "carol" in home.text and a.tenant in home.text
    assert home.headers["cache-control"] == "no-store"


def test_secure_cookie_outside_development(api_settings: Settings, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    production = create_app(api_settings.model_copy(update={"environment": "production"}))
    with TestClient(production, base_url="https://testserver", follow_redirects=False) as web:
        form = web.get("/console/login")
        assert set_cookie_headers(form)[LOGIN_CSRF_COOKIE][LOGIN_CSRF_COOKIE]["secure"]
        token = LOGIN_RE.search(form.text)
        assert token
        done = web.post("/console/login", data={"credential": a.keys["carol"], "login_csrf": token.group(1)})
        assert done.status_code == 303
        assert set_cookie_headers(done)[COOKIE][COOKIE]["secure"]


def test_bad_credentials_and_login_csrf(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = browser(app)
    token = LOGIN_RE.search(web.get("/console/login").text)
    assert token
    wrong = web.post("/console/login", data={"credential": "tnr_0000000000000000_nope", "login_csrf": token.group(1)})
    assert wrong.status_code == 401 and COOKIE not in wrong.cookies
    # a sign-in posted from elsewhere (no login cookie, or another token) is refused
    other = browser(app)
    forged = other.post("/console/login", data={"credential": a.keys["carol"], "login_csrf": token.group(1)})
    assert forged.status_code == 403 and COOKIE not in forged.cookies


def test_pages_need_a_session(app: FastAPI) -> None:
    web = browser(app)
    for path in ("/console/", "/console/beliefs", "/console/beliefs/b-pay"):
        response = web.get(path)
        assert response.status_code == 303 and response.headers["location"].startswith("/console/login?next=")
    web.cookies.set(COOKIE, "made-up-session-id", path="/console")
    assert web.get("/console/beliefs").status_code == 303


def test_open_redirect_is_refused(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = browser(app)
    token = LOGIN_RE.search(web.get("/console/login").text)
    assert token
    done = web.post(
        "/console/login",
        data={"credential": a.keys["carol"], "login_csrf": token.group(1), "next": "//evil.example/console/"},
    )
    assert done.headers["location"] == "/console/"


def test_forms_without_the_session_csrf_token_change_nothing(
    app: FastAPI, client: TestClient, seeded: tuple[Team, Team]
) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["carol"])
    for data in ({}, {"csrf_token": "forged"}, {"csrf_token": csrf_of(sign_in(app, a.keys["carol"]))}):
        response = web.post("/console/beliefs/b-pay/pin", data={**data, "confirmed": "yes"})
        assert response.status_code == 403, response.text
    assert ok(client.get("/v1/beliefs/b-pay", headers=a.h("carol")))["pinned"] is False
    # with the session's own token it goes through (after the confirmation step)
    token = csrf_of(web)
    confirm = web.post("/console/beliefs/b-pay/pin", data={"csrf_token": token})
    assert confirm.status_code == 200 and 'name="confirmed" value="yes"' in confirm.text
    assert ok(client.get("/v1/beliefs/b-pay", headers=a.h("carol")))["pinned"] is False
    done = web.post("/console/beliefs/b-pay/pin", data={"csrf_token": token, "confirmed": "yes"})
    assert done.status_code == 303
    assert ok(client.get("/v1/beliefs/b-pay", headers=a.h("carol")))["pinned"] is True
    web.post("/console/beliefs/b-pay/unpin", data={"csrf_token": token, "confirmed": "yes"})
    assert ok(client.get("/v1/beliefs/b-pay", headers=a.h("carol")))["pinned"] is False


def test_sign_out_revokes_the_session(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["bob"])
    stolen = web.cookies.get(COOKIE)
    assert stolen
    assert web.post("/console/logout", data={}).status_code == 403  # sign-out is a form too
    out = web.post("/console/logout", data={"csrf_token": csrf_of(web)})
    assert out.status_code == 303
    replay = browser(app)
    replay.cookies.set(COOKIE, stolen, path="/console")
    assert replay.get("/console/").status_code == 303


def test_revoking_the_key_ends_its_console_sessions(app: FastAPI, client: TestClient, operator: dict[str, str]) -> None:
    team = make_team(client, operator)
    web = sign_in(app, team.keys["carol"])
    assert web.get("/console/").status_code == 200
    keys = ok(client.get(f"/v1/admin/tenants/{team.tenant}/keys", headers=operator))["items"]
    carol_key = next(k["key_id"] for k in keys if k["user_id"] == "carol")
    ok(client.delete(f"/v1/admin/keys/{carol_key}", headers=operator))
    assert web.get("/console/").status_code == 303


def test_dev_jwt_sign_in(app: FastAPI, client: TestClient, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    token = ok(
        client.post(f"/v1/admin/tenants/{a.tenant}/users/bob/tokens", json={"ttl_s": 600}, headers=a.h("carol")), 201
    )
    web = sign_in(app, token["token"])
    page = web.get("/console/beliefs")
    assert page.status_code == 200 and "pay_provider" in page.text
    ok(client.post("/v1/admin/tokens/revoke", json={"token": token["token"]}, headers=a.h("carol")))
    assert web.get("/console/beliefs").status_code == 303


def test_member_view_is_read_only_and_shows_only_what_they_may_see(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["bob"])
    listing = web.get("/console/beliefs")
    assert listing.status_code == 200
    assert "pay_provider" in listing.text
    assert "private_provider" not in listing.text and "core_provider" not in listing.text
    # URL guessing: a colleague's personal or unshared belief is "not found", like a missing one
    for belief_id in ("b-private", "b-core", "b-does-not-exist"):
        assert web.get(f"/console/beliefs/{belief_id}").status_code == 404
    page = web.get("/console/beliefs/b-pay")
    assert page.status_code == 200 and "Supersede" not in page.text and 'id="actions"' not in page.text
    token = csrf_of(web)
    for action in ("pin", "retract", "erase", "supersede", "alias"):
        refused = web.post(f"/console/beliefs/b-pay/{action}", data={"csrf_token": token, "confirmed": "yes"})
        assert refused.status_code == 403, action


def test_admin_of_another_tenant_sees_nothing_of_this_one(
    app: FastAPI, client: TestClient, seeded: tuple[Team, Team]
) -> None:
    a, b = seeded
    ok(
        client.post("/v1/beliefs", json=belief_body("only_in_a", "project:pay", id="b-only-a"), headers=a.h("alice")),
        201,
    )
    web = sign_in(app, b.keys["carol"])
    assert web.get("/console/beliefs/b-only-a").status_code == 404
    listing = web.get("/console/beliefs?q=only+in+a")
    assert listing.status_code == 200 and "only_in_a" not in listing.text
    own = web.get("/console/beliefs/b-pay")
    assert b.tenant in own.text and a.tenant not in own.text
    token = csrf_of(web)
    erase = web.post("/console/beliefs/b-only-a/erase", data={"csrf_token": token, "confirmed": "yes"})
    assert erase.status_code == 404
    assert ok(client.get("/v1/beliefs/b-only-a", headers=a.h("alice")))["id"] == "b-only-a"


def test_operators_choose_the_tenant_and_act_through_the_same_grants(
    app: FastAPI, client: TestClient, operator: dict[str, str], services: Services
) -> None:
    """Two tenants with the same belief ids: an operator shows one, then the other, and sees only
    the one shown (beliefs, audit, team); changes go through that tenant's admin rules (erase yes,
    a shared-scope supersede without a grant no) and are audited as the operator. A tenant admin
    cannot switch, neither by the form nor by guessing the page."""
    a, b = make_team(client, operator), make_team(client, operator)
    for team in (a, b):
        for belief_id in ("b-pay", "b-gone"):
            body = belief_body(belief_id[2:] + "_note", "project:pay", id=belief_id, content=f"{team.tenant} text")
            ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    services.audit.refresh()
    web = sign_in(app, operator["Authorization"].removeprefix("Bearer "))
    assert 'id="shown-tenant">system<' in web.get("/console/").text
    listed = web.get("/console/tenants")
    assert listed.status_code == 200 and a.tenant in listed.text and b.tenant in listed.text
    token = csrf_of(web, "/console/tenants")
    assert web.post("/console/tenants/view", data={"tenant_id": a.tenant}).status_code == 403  # no CSRF token
    assert web.post("/console/tenants/view", data={"csrf_token": token, "tenant_id": "t-nowhere"}).status_code == 404

    for shown, hidden in ((a, b), (b, a)):
        switched = web.post("/console/tenants/view", data={"csrf_token": token, "tenant_id": shown.tenant})
        assert switched.status_code == 303
        assert f'id="shown-tenant">{shown.tenant}<' in web.get("/console/").text
        page = web.get("/console/beliefs/b-pay").text
        assert f"{shown.tenant} text" in page and f"{hidden.tenant} text" not in page
        listing = web.get("/console/beliefs").text
        assert f"{shown.tenant} text" in listing and hidden.tenant not in listing
        team_page = web.get("/console/team").text
        assert f"Team · {shown.tenant}" in team_page and hidden.tenant not in team_page
        audit = web.get("/console/audit", params={"action": "belief.create"}).text
        assert "b-pay" in audit and hidden.tenant not in audit

    # b is shown: the operator acts as b's admin, holding no one's shared-scope grants
    erased = web.post("/console/beliefs/b-gone/erase", data={"csrf_token": token, "confirmed": "yes"})
    assert erased.status_code == 200 and "b-gone" in erased.text
    assert client.get("/v1/beliefs/b-gone", headers=b.h("alice")).status_code == 404
    assert ok(client.get("/v1/beliefs/b-gone", headers=a.h("alice")))["content"] == f"{a.tenant} text"
    supersede = {"csrf_token": token, "confirmed": "yes", "content": "Overwritten by an operator."}
    assert web.post("/console/beliefs/b-pay/supersede", data=supersede).status_code == 404  # as over REST
    services.audit.refresh()  # events are appended without a refresh
    events = ok(client.get("/v1/admin/audit", params={"action": "belief.erase"}, headers=b.h("carol")))["items"]
    assert [(e["actor_id"], e["actor_kind"], e["belief_ids"]) for e in events] == [("root", "operator", ["b-gone"])]
    assert ok(client.get("/v1/admin/audit", params={"action": "belief.erase"}, headers=a.h("carol")))["items"] == []

    # a tenant admin cannot switch, and the session keeps showing their own tenant
    admin = sign_in(app, a.keys["carol"])
    assert admin.get("/console/tenants").status_code == 403
    refused = admin.post("/console/tenants/view", data={"csrf_token": csrf_of(admin), "tenant_id": b.tenant})
    assert refused.status_code == 403
    assert f'id="shown-tenant">{a.tenant}<' in admin.get("/console/").text
    assert f"{a.tenant} text" in admin.get("/console/beliefs/b-pay").text
    member = sign_in(app, a.keys["bob"])
    assert (
        member.post("/console/tenants/view", data={"csrf_token": csrf_of(member), "tenant_id": b.tenant}).status_code
        == 403
    )


def test_admin_sees_the_tenant_and_the_same_whole_unit_search(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["carol"])
    everything = web.get("/console/beliefs")
    for name in ("private_provider", "pay_provider", "core_provider"):
        assert name in everything.text
    assert "private_provider" not in web.get("/console/beliefs?mine=true").text
    found = web.get("/console/beliefs", params={"q": "pay provider"})
    assert "pay_provider" in found.text and "core_provider" not in found.text
    assert "pay_provider" not in web.get("/console/beliefs", params={"q": "provider"}).text  # part of a unit
    by_owner = web.get("/console/beliefs", params={"owner": "bob"})
    assert "pay_provider" not in by_owner.text
    bad = web.get("/console/beliefs", params={"scope": "nonsense scope"})
    assert bad.status_code == 422 and "validation_error" in bad.text
    # a colleague's personal belief: readable for the admin, but only erasable (as over REST)
    private = web.get("/console/beliefs/b-private")
    assert private.status_code == 200 and "Erase" in private.text and "Supersede" not in private.text


def test_supersede_then_the_chain_and_change_log(app: FastAPI, client: TestClient, operator: dict[str, str]) -> None:
    team = make_team(client, operator)
    ok(
        client.post(
            "/v1/beliefs",
            json=belief_body("payment_provider", "project:pay", id="b-psp", content="We use Stripe."),
            headers=team.h("alice"),
        ),
        201,
    )
    web = sign_in(app, team.keys["carol"])
    token = csrf_of(web)
    form = {"csrf_token": token, "content": "We use Adyen <b>now</b>.", "reason": "contract ended"}
    confirm = web.post("/console/beliefs/b-psp/supersede", data=form)
    assert confirm.status_code == 200 and "Adyen &lt;b&gt;now&lt;/b&gt;" in confirm.text
    done = web.post("/console/beliefs/b-psp/supersede", data={**form, "confirmed": "yes"})
    assert done.status_code == 303
    new_page = web.get(done.headers["location"])
    assert new_page.status_code == 200
    chain = new_page.text[new_page.text.index('id="chain"') : new_page.text.index("</ol>")]
    assert chain.index("We use Stripe.") < chain.index("We use Adyen &lt;b&gt;now&lt;/b&gt;.")
    assert "superseded" in chain and "contract ended" in new_page.text
    assert "<b>now</b>" not in new_page.text  # stored text never becomes markup
    current = ok(client.get("/v1/beliefs/b-psp/history", headers=team.h("carol")))["chain"]
    assert [b["content"] for b in current] == ["We use Stripe.", "We use Adyen <b>now</b>."]


def test_erase_shows_the_receipt(app: FastAPI, client: TestClient, operator: dict[str, str]) -> None:
    team = make_team(client, operator)
    ok(client.post("/v1/beliefs", json=belief_body("doomed", "domain:code", id="b-doomed"), headers=team.h("bob")), 201)
    web = sign_in(app, team.keys["carol"])
    token = csrf_of(web)
    confirm = web.post("/console/beliefs/b-doomed/erase", data={"csrf_token": token})
    assert confirm.status_code == 200 and "cannot be undone" in confirm.text
    assert ok(client.get("/v1/beliefs/b-doomed", headers=team.h("bob")))["id"] == "b-doomed"
    receipt = web.post(
        "/console/beliefs/b-doomed/erase", data={"csrf_token": token, "confirmed": "yes", "expunge": "yes"}
    )
    assert receipt.status_code == 200 and 'id="erasure-receipt"' in receipt.text and "b-doomed" in receipt.text
    assert re.search(r"expunged from segments</dt><dd>yes", receipt.text)
    assert client.get("/v1/beliefs/b-doomed", headers=team.h("bob")).status_code == 404


def test_recall_playground_as_a_chosen_user(app: FastAPI, client: TestClient, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["carol"])
    token = csrf_of(web, "/console/recall")
    form = {"csrf_token": token, "as_user": "bob", "scopes": "project:pay, team:core", "message": "pay provider?"}
    shown = web.post("/console/recall", data=form)
    assert shown.status_code == 200, shown.text
    tiers = shown.text[shown.text.index('id="tiers"') : shown.text.index('id="injection"')]
    assert "pay_provider" in tiers and "core_provider" not in tiers  # bob holds no team:core
    assert f"{a.tenant} secret pay_provider" in shown.text  # the rendered block
    assert "team:core" in shown.text and "no grant" in shown.text  # explain: why core is filtered
    receipt_id = re.search(r'id="receipt-id">([^<]+)<', shown.text)
    assert receipt_id
    events = ok(client.get("/v1/admin/audit", params={"action": "recall.preview"}, headers=a.h("carol")))["items"]
    preview = next(e for e in events if e["event_id"] == receipt_id.group(1))
    assert preview["actor_id"] == "carol" and preview["details"] == {"as_user": "bob"}
    assert preview["belief_ids"] == ["b-pay"]
    bob_recalls = ok(
        client.get("/v1/admin/audit", params={"actor_id": "bob", "action": "recall"}, headers=a.h("carol"))
    )
    assert all(e["event_id"] != receipt_id.group(1) for e in bob_recalls["items"])  # not an injection


def test_playground_explains_what_the_message_named_but_was_not_injected(
    app: FastAPI, client: TestClient, operator: dict[str, str]
) -> None:
    """Superseded, below the threshold, outside the session's scopes: each named with its reason,
    and only among the beliefs the user it runs as may see (never alice's personal or team:core
    belief in a preview as bob, whose message names them too)."""
    team = make_team(client, operator)
    seed = [
        ("b-psp", "payment_provider", "project:pay", ["psp"]),
        ("b-host", "deploy_target", "project:pay", ["hosting"]),
        ("b-kafka", "kafka_topics", "domain:code", ["event bus"]),
        ("b-core", "core_budget", "team:core", ["headcount"]),
    ]
    for belief_id, name, scope, aliases in seed:
        body = belief_body(name, scope, id=belief_id, aliases=aliases, content=f"{name} content")
        ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    new = ok(
        client.post("/v1/beliefs/b-psp/supersede", json={"content": "We use Adyen."}, headers=team.h("alice")), 201
    )
    new_id = new["current"]["id"]
    message = "which payment provider, hosting, kafka topics and core budget?"
    web = sign_in(app, team.keys["carol"])
    token = csrf_of(web, "/console/recall")
    form = {"csrf_token": token, "scopes": "project:pay", "message": message, "min_score": "6"}

    as_bob = web.post("/console/recall", data={**form, "as_user": "bob"})
    assert as_bob.status_code == 200, as_bob.text
    misses = dict(re.findall(r'<li data-reason="([a-z_]+)"><a href="/console/beliefs/([^"]+)"', as_bob.text))
    assert {v: k for k, v in misses.items()} == {"b-psp": "superseded", "b-host": "below_threshold"}
    assert f"superseded by {new_id}" in as_bob.text and "score 5.00 &lt; 6" in as_bob.text
    assert f'href="/console/beliefs/{new_id}"' in as_bob.text  # injected
    for hidden in ("b-kafka", "b-core", "kafka_topics", "core_budget"):
        assert hidden not in as_bob.text

    as_alice = web.post("/console/recall", data={**form, "as_user": "alice"})
    reasons = {
        bid: why
        for why, bid in re.findall(r'<li data-reason="([a-z_]+)"><a href="/console/beliefs/([^"]+)"', as_alice.text)
    }
    assert reasons == {
        "b-psp": "superseded",
        "b-host": "below_threshold",
        "b-kafka": "out_of_scope",
        "b-core": "out_of_scope",
    }
    assert "filtered by scope: domain:code is outside this session&#39;s scopes" in as_alice.text

    default = web.post("/console/recall", data={**form, "as_user": "bob", "min_score": ""})
    assert 'data-reason="below_threshold"' not in default.text  # 5 clears the deployment's 3
    assert web.post("/console/recall", data={**form, "min_score": "lots"}).status_code == 422

    # the same explain over REST, as bob himself
    body = {"scopes": ["project:pay"], "query": message, "explain": True, "budget": {"minScore": 6}}
    explain = ok(client.post("/v1/recall", json=body, headers=team.h("bob")))["explain"]
    assert {n["id"]: n["reason"] for n in explain if "reason" in n} == {
        "b-psp": "superseded",
        "b-host": "below_threshold",
    }


def test_members_preview_only_as_themselves(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["bob"])
    token = csrf_of(web, "/console/recall")
    mine = web.post("/console/recall", data={"csrf_token": token, "as_user": "bob", "message": "pay provider"})
    assert mine.status_code == 200 and "pay_provider" in mine.text
    as_alice = web.post(
        "/console/recall", data={"csrf_token": token, "as_user": "alice", "message": "private provider"}
    )
    assert as_alice.status_code == 403 and "private_provider" not in as_alice.text
    assert web.post("/console/recall", data={"as_user": "bob", "message": "x"}).status_code == 403  # no CSRF token


def test_audit_finds_what_was_injected_into_whose_prompt(
    app: FastAPI, client: TestClient, operator: dict[str, str]
) -> None:
    team = make_team(client, operator)
    ok(
        client.post(
            "/v1/beliefs",
            json=belief_body("payment_provider", "project:pay", id="b-psp", content="We use Stripe."),
            headers=team.h("alice"),
        ),
        201,
    )
    injected = ok(
        client.post(
            "/v1/recall",
            json={"scopes": ["project:pay"], "query": "=HYPERLINK(payment provider)", "session_id": "s-tuesday"},
            headers=team.h("bob"),
        )
    )
    ok(client.post("/v1/recall", json={"scopes": ["project:pay"], "query": "unrelated"}, headers=team.h("alice")))
    web = sign_in(app, team.keys["carol"])
    listing = web.get("/console/audit", params={"actor_id": "bob", "action": "recall"})
    assert listing.status_code == 200
    rows = listing.text[listing.text.index('id="audit-list"') :]
    assert rows.count("receipt →") == 1 and "b-psp" in rows
    receipt = web.get(f"/console/audit/{injected['receipt_id']}")
    assert receipt.status_code == 200
    assert (
        "Injection receipt" in receipt.text and "payment_provider" in receipt.text and "We use Stripe." in receipt.text
    )
    assert "s-tuesday" in receipt.text and "bob" in receipt.text
    # a time range that ends before the recall finds nothing
    empty = web.get("/console/audit", params={"actor_id": "bob", "until": "2000-01-01T00:00"})
    assert "No event matches." in empty.text
    assert web.get("/console/audit", params={"since": "yesterday"}).status_code == 422
    # export of the filtered view
    jsonl = web.get("/console/audit/export.jsonl", params={"actor_id": "bob", "action": "recall"})
    assert jsonl.status_code == 200 and jsonl.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in jsonl.text.splitlines()]
    assert [e["event_id"] for e in lines] == [injected["receipt_id"]]
    assert "attachment" in jsonl.headers["content-disposition"]
    table = web.get("/console/audit/export.csv", params={"actor_id": "bob", "action": "recall"})
    rows_csv = list(csv.DictReader(io.StringIO(table.text)))
    assert [r["event_id"] for r in rows_csv] == [injected["receipt_id"]]
    assert rows_csv[0]["query"].startswith("'=")  # no formula injection into a spreadsheet
    assert rows_csv[0]["belief_ids"] == "b-psp"


def test_members_cannot_reach_admin_pages(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    a, _ = seeded
    web = sign_in(app, a.keys["bob"])
    for path in (
        "/console/audit",
        "/console/audit?actor_id=alice",
        "/console/audit/export.jsonl",
        "/console/audit/export.csv",
        "/console/audit/ev-0123",
    ):
        response = web.get(path)
        assert response.status_code == 403, path
        assert "forbidden" in response.text
    assert 'href="/console/audit"' not in web.get("/console/").text


def file_conflict(
    services: Services,
    team: Team,
    belief_id: str,
    content: str,
    review_id: str,
    name: str = "payment_provider",
    **proposed: object,
) -> None:
    """A conflict as extraction files it (BeliefMerger._queue_conflict's shape), into the real store."""
    created = ReviewStore(services.opensearch, services.settings.opensearch_namespace).create(
        ReviewItem(
            tenant_id=team.tenant,
            review_id=review_id,
            kind="conflict",
            owner_id="alice",
            scope=["project:pay"],
            belief_id=belief_id,
            canonical_name=name,
            reason="contradicts an explicit belief with similar confidence",
            paper_outcome="conflict",
            proposed={"content": content, "confidence": 0.8, **proposed},
            session_id="s-1",
            turn_ids=["turn-1"],
        )
    )
    assert created
    services.opensearch.indices.refresh(index=f"{services.settings.opensearch_namespace}-reviews")


def test_review_queue_side_by_side_accept_and_reject(
    app: FastAPI, client: TestClient, operator: dict[str, str], services: Services
) -> None:
    team = make_team(client, operator)
    body = belief_body("payment_provider", "project:pay", id="b-psp", content="We use Stripe.")
    ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    file_conflict(services, team, "b-psp", "We moved to Adyen.", "rv-accept")
    file_conflict(services, team, "b-psp", "We use PayPal.", "rv-reject")
    web = sign_in(app, team.keys["carol"])
    queue = web.get("/console/reviews")
    assert queue.status_code == 200
    assert queue.text.count("We use Stripe.") == 2 and "We moved to Adyen." in queue.text
    token = csrf_of(web, "/console/reviews")
    reject = {"csrf_token": token, "action": "keep_existing"}
    assert "confirm" in web.post("/console/reviews/rv-reject", data=reject).text.lower()
    assert web.post("/console/reviews/rv-reject", data={**reject, "confirmed": "yes"}).status_code == 303
    accepted = web.post(
        "/console/reviews/rv-accept", data={"csrf_token": token, "action": "accept_proposed", "confirmed": "yes"}
    )
    assert accepted.status_code == 303 and "/console/beliefs/" in accepted.headers["location"]
    chain = ok(client.get("/v1/beliefs/b-psp/history", headers=team.h("carol")))["chain"]
    assert [b["content"] for b in chain] == ["We use Stripe.", "We moved to Adyen."]
    assert "Nothing open." in web.get("/console/reviews").text
    closed = web.get("/console/reviews", params={"status": "resolved"}).text
    assert "rv-accept" in closed and "rv-reject" in closed and "reject" in closed
    wrong = web.post("/console/reviews/rv-accept", data={"csrf_token": token, "action": "apply_alias"})
    assert wrong.status_code == 422
    member = sign_in(app, team.keys["bob"])
    assert member.get("/console/reviews").status_code == 403
    refused = member.post(
        "/console/reviews/rv-accept", data={"csrf_token": csrf_of(member), "action": "dismiss", "confirmed": "yes"}
    )
    assert refused.status_code == 403


def test_review_merge_with_chosen_fields_and_united_aliases(
    app: FastAPI, client: TestClient, operator: dict[str, str], services: Services
) -> None:
    team, other = make_team(client, operator), make_team(client, operator)
    body = belief_body("payment_provider", "project:pay", id="b-psp", content="We use Stripe.", aliases=["psp"])
    ok(client.post("/v1/beliefs", json=body, headers=team.h("alice")), 201)
    extra = {"why_it_matters": "EU cards need 3-D Secure.", "aliases": ["adyen", "card processor"]}
    file_conflict(services, team, "b-psp", "We moved to Adyen.", "rv-merge", name="card_processor", **extra)
    file_conflict(services, team, "b-psp", "We use PayPal.", "rv-later")
    web = sign_in(app, team.keys["carol"])
    queue = web.get("/console/reviews").text
    assert queue.count("Merge into the existing belief") == 2 and "EU cards need 3-D Secure." in queue
    token = csrf_of(web, "/console/reviews")
    merge = {"csrf_token": token, "action": "merge", "merge_content": "proposed", "merge_why_it_matters": "proposed"}

    assert web.post("/console/reviews/rv-merge", data={**merge, "csrf_token": "forged"}).status_code == 403
    stranger = sign_in(app, other.keys["carol"])  # another tenant's admin: not found
    assert (
        stranger.post("/console/reviews/rv-merge", data={**merge, "csrf_token": csrf_of(stranger)}).status_code == 404
    )
    member = sign_in(app, team.keys["bob"])
    assert member.post("/console/reviews/rv-merge", data={**merge, "csrf_token": csrf_of(member)}).status_code == 403
    impossible = web.post("/console/reviews/rv-later", data={**merge, "confirmed": "yes"})  # proposal has no why
    assert impossible.status_code == 422 and "no why-it-matters" in impossible.text
    shown = web.post("/console/reviews/rv-merge", data=merge)
    assert shown.status_code == 200 and "Confirm: merge" in shown.text
    assert "We moved to Adyen." in shown.text and "&#39;adyen&#39;, &#39;card processor&#39;" in shown.text
    assert ok(client.get("/v1/beliefs/b-psp", headers=team.h("carol")))["content"] == "We use Stripe."  # not yet

    done = web.post("/console/reviews/rv-merge", data={**merge, "confirmed": "yes"})
    assert done.status_code == 303 and "/console/beliefs/" in done.headers["location"]
    new_id = done.headers["location"].split("/console/beliefs/")[1].split("?")[0]
    merged = ok(client.get(f"/v1/beliefs/{new_id}", headers=team.h("alice")))
    assert (merged["canonical_name"], merged["scope"]) == ("payment_provider", ["project:pay"])
    assert (merged["content"], merged["why_it_matters"]) == ("We moved to Adyen.", "EU cards need 3-D Secure.")
    assert merged["aliases"] == ["psp", "adyen", "card processor"]  # the proposal's name was already an alias
    page = web.get(done.headers["location"]).text
    assert "We use Stripe." in page and "merged review rv-merge into belief b-psp" in page  # chain and change log

    # the second conflict on the same belief: the belief it names is no longer live
    gone = web.post("/console/reviews/rv-later", data={**merge, "merge_why_it_matters": "existing", "confirmed": "yes"})
    assert gone.status_code == 409
    # written anew: an edited text wins over the side chosen
    file_conflict(services, team, new_id, "We use PayPal.", "rv-edit")
    edited = {**merge, "merge_why_it_matters": "existing", "merge_edited_content": "Adyen for cards, PayPal too."}
    again = web.post("/console/reviews/rv-edit", data={**edited, "confirmed": "yes"})
    assert again.status_code == 303
    newest = again.headers["location"].split("/console/beliefs/")[1].split("?")[0]
    assert ok(client.get(f"/v1/beliefs/{newest}", headers=team.h("alice")))["content"] == "Adyen for cards, PayPal too."
    closed = web.get("/console/reviews", params={"status": "resolved"}).text
    assert "rv-merge" in closed and "(merge)" in closed


def test_team_keys_grants_and_disable(app: FastAPI, client: TestClient, operator: dict[str, str]) -> None:
    team = make_team(client, operator)
    web = sign_in(app, team.keys["carol"])
    page = web.get("/console/team")
    assert page.status_code == 200 and all(u in page.text for u in ("alice", "bob", "carol"))
    token = csrf_of(web, "/console/team")
    created = web.post(
        "/console/team/users", data={"csrf_token": token, "user_id": "dana", "projects": "pay", "teams": ""}
    )
    assert created.status_code == 303
    issued = web.post("/console/team/keys", data={"csrf_token": token, "user_id": "dana", "name": "laptop"})
    assert issued.status_code == 200 and issued.headers["cache-control"] == "no-store"
    secret = re.search(r'<pre id="secret">(tnr_[^<]+)</pre>', issued.text)
    assert secret
    dana = {"Authorization": f"Bearer {secret.group(1)}"}
    assert ok(client.get("/v1/whoami", headers=dana))["projects"] == ["pay"]
    assert "laptop" in web.get("/console/team").text
    # grants: confirm, then dana holds team core and no longer project pay (which her key loses at once)
    grants = {"csrf_token": token, "add_teams": "core", "remove_projects": "pay"}
    assert "Change dana" in web.post("/console/team/users/dana/grants", data=grants).text
    assert ok(client.get("/v1/whoami", headers=dana))["projects"] == ["pay"]
    web.post("/console/team/users/dana/grants", data={**grants, "confirmed": "yes"})
    record = ok(client.get(f"/v1/admin/tenants/{team.tenant}/users/dana", headers=team.h("carol")))
    assert record["teams"] == ["core"] and record["projects"] == []
    assert ok(client.get("/v1/whoami", headers=dana))["projects"] == []
    # disable ends dana's access (and her console session); enable brings it back
    dana_web = sign_in(app, secret.group(1))
    web.post("/console/team/users/dana/disable", data={"csrf_token": token, "confirmed": "yes"})
    assert client.get("/v1/whoami", headers=dana).status_code == 401
    assert dana_web.get("/console/").status_code == 303
    web.post("/console/team/users/dana/enable", data={"csrf_token": token, "confirmed": "yes"})
    assert ok(client.get("/v1/whoami", headers=dana))["user_id"] == "dana"
    # revoke the key
    key_id = ok(client.get("/v1/whoami", headers=dana))["credential_id"]
    web.post(f"/console/team/keys/{key_id}/revoke", data={"csrf_token": token, "confirmed": "yes"})
    assert client.get("/v1/whoami", headers=dana).status_code == 401
    assert f"revoked {key_id}" not in web.get("/console/team").text  # the list shows the state, not the secret
    assert secret.group(1) not in web.get("/console/team").text
    bad = web.post("/console/team/users", data={"csrf_token": token, "user_id": "Not A Slug"})
    assert bad.status_code == 422
    member = sign_in(app, team.keys["bob"])
    assert member.get("/console/team").status_code == 403
    forged = member.post("/console/team/keys", data={"csrf_token": csrf_of(member), "user_id": "bob"})
    assert forged.status_code == 403


def test_add_and_remove_aliases(app: FastAPI, client: TestClient, operator: dict[str, str]) -> None:
    team = make_team(client, operator)
    ok(
        client.post(
            "/v1/beliefs", json=belief_body("payment_provider", "project:pay", id="b-psp"), headers=team.h("bob")
        ),
        201,
    )
    web = sign_in(app, team.keys["carol"])
    token = csrf_of(web)
    web.post("/console/beliefs/b-psp/alias", data={"csrf_token": token, "aliases": "psp, stripe", "confirmed": "yes"})
    assert set(ok(client.get("/v1/beliefs/b-psp", headers=team.h("bob")))["aliases"]) >= {"psp", "stripe"}
    page = web.get("/console/beliefs/b-psp")
    assert 'id="unalias-form"' in page.text and 'value="stripe"' in page.text
    form = {"csrf_token": token, "alias_00": "stripe"}
    confirm = web.post("/console/beliefs/b-psp/unalias", data=form)
    assert confirm.status_code == 200 and "stops finding it" in confirm.text
    assert "stripe" in ok(client.get("/v1/beliefs/b-psp", headers=team.h("bob")))["aliases"]
    assert web.post("/console/beliefs/b-psp/unalias", data={**form, "confirmed": "yes"}).status_code == 303
    aliases = ok(client.get("/v1/beliefs/b-psp", headers=team.h("bob")))["aliases"]
    assert "stripe" not in aliases and "psp" in aliases
    nothing = web.post("/console/beliefs/b-psp/unalias", data={"csrf_token": token, "confirmed": "yes"})
    assert nothing.status_code == 422
    unknown = web.post(
        "/console/beliefs/b-psp/unalias", data={"csrf_token": token, "alias_00": "adyen", "confirmed": "yes"}
    )
    assert unknown.status_code == 422 and "not aliases of this belief" in unknown.text


def test_a_non_ascii_csrf_token_is_refused_like_a_wrong_one(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    """compare_digest raises TypeError on a non-ASCII str: a posted ``é`` answered 500."""
    a, _ = seeded
    web = browser(app)
    assert LOGIN_RE.search(web.get("/console/login").text)  # sets the login CSRF cookie
    login = web.post("/console/login", data={"credential": a.keys["carol"], "login_csrf": "é"})
    assert login.status_code == 403 and COOKIE not in login.cookies
    signed_in = sign_in(app, a.keys["carol"])
    pin = signed_in.post("/console/beliefs/b-pay/pin", data={"csrf_token": "é", "confirmed": "yes"})
    assert pin.status_code == 403, pin.text


def test_an_unreadable_form_body_is_a_400_page(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    """A malformed multipart body (a truncated upload, a hand-made post) escaped the CSRF check as
    python-multipart's parse error: 500; and a sign-in body the framework could not read answered
    JSON instead of the console's page."""
    a, _ = seeded
    broken = {"content": b"--nope\r\n", "headers": {"content-type": "multipart/form-data; boundary=XyZ"}}
    web = sign_in(app, a.keys["carol"])
    for path in ("/console/recall", "/console/beliefs/b-pay/pin", "/console/logout"):
        refused = web.post(path, **broken)  # type: ignore[arg-type]
        assert refused.status_code == 400, (path, refused.text)
        assert refused.headers["content-type"].startswith("text/html") and 'data-code="bad_request"' in refused.text
    assert web.get("/console/").status_code == 200  # still signed in
    login = browser(app)
    assert LOGIN_RE.search(login.get("/console/login").text)
    refused = login.post("/console/login", **broken)  # type: ignore[arg-type]
    assert refused.status_code == 400 and refused.headers["content-type"].startswith("text/html")


def test_an_invalid_grant_is_refused_before_the_confirmation(
    app: FastAPI, client: TestClient, operator: dict[str, str]
) -> None:
    """A project or team that is not a slug was confirmed first ("Change bob's grants: …"), then
    answered the API's JSON 422 instead of a console page; upper case is lowered, as on creation."""
    team = make_team(client, operator)
    web = sign_in(app, team.keys["carol"])
    token = csrf_of(web, "/console/team")
    for field in ("add_projects", "remove_projects", "add_teams", "remove_teams"):
        for confirmed in ({}, {"confirmed": "yes"}):
            data = {"csrf_token": token, field: "pay, not a slug!", **confirmed}
            refused = web.post("/console/team/users/bob/grants", data=data)
            assert refused.status_code == 422, (field, confirmed, refused.text)
            assert refused.headers["content-type"].startswith("text/html") and "not a slug!" in refused.text
    before = ok(client.get(f"/v1/admin/tenants/{team.tenant}/users/bob", headers=team.h("carol")))
    assert "not a slug!" not in str(before)
    done = web.post(
        "/console/team/users/bob/grants", data={"csrf_token": token, "add_teams": "Core", "confirmed": "yes"}
    )
    assert done.status_code == 303
    assert "core" in ok(client.get(f"/v1/admin/tenants/{team.tenant}/users/bob", headers=team.h("carol")))["teams"]


def test_every_console_answer_forbids_scripts_and_framing(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    """No Content-Security-Policy, X-Frame-Options or nosniff: a page of a sibling subdomain (same
    site, so the SameSite=Strict cookie goes along) could frame a confirmation page and have an
    admin click "Yes, erase", and nothing but escaping stood between stored text and a script. The
    console has no script at all: the policy allows none, and no page relies on inline styles."""
    a, _ = seeded
    web = sign_in(app, a.keys["carol"])
    token = csrf_of(web)
    answers = {
        "sign-in": browser(app).get("/console/login"),
        "redirect to sign-in": browser(app).get("/console/beliefs"),
        "home": web.get("/console/"),
        "recall": web.post("/console/recall", data={"csrf_token": token, "message": "pay provider"}),
        "team": web.get("/console/team"),
        "confirmation": web.post("/console/beliefs/b-pay/erase", data={"csrf_token": token}),
        "error": web.get("/console/beliefs/b-nowhere"),
        "export": web.get("/console/audit/export.csv"),
    }
    for what, answer in answers.items():
        policy = answer.headers.get("content-security-policy", "")
        directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in policy.split(";") if d.strip())
        assert directives.get("default-src") == "'none'" and "script-src" not in directives, (what, policy)
        assert directives.get("frame-ancestors") == "'none'" and directives.get("form-action") == "'self'", what
        assert directives.get("style-src") == "'self'" and directives.get("base-uri") == "'none'", what
        assert answer.headers.get("x-frame-options") == "DENY", what
        assert answer.headers.get("x-content-type-options") == "nosniff", what
        assert answer.headers.get("referrer-policy") == "same-origin", what
        if answer.headers.get("content-type", "").startswith("text/html"):
            assert " style=" not in answer.text and "<script" not in answer.text, what  # blocked by the policy


def test_a_notice_only_the_console_itself_wrote_is_shown(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    """Any ?notice= was shown in the console's green status box: a colleague's link could make a
    page say "Security: your key leaked, paste a new one at …". Only a notice the console put in
    its own redirect, for this session, is shown now."""
    a, _ = seeded
    web = sign_in(app, a.keys["carol"])
    spoof = "Security: your key leaked. Paste a new one at evil.example"
    for path in ("/console/", "/console/team", "/console/beliefs/b-pay"):
        page = web.get(path, params={"notice": spoof})
        assert page.status_code == 200 and "evil.example" not in page.text and 'class="notice"' not in page.text
    token = csrf_of(web)
    done = web.post("/console/beliefs/b-pay/pin", data={"csrf_token": token, "confirmed": "yes"})
    assert done.status_code == 303
    assert '<p class="notice" role="status">pinned</p>' in web.get(done.headers["location"]).text
    forged = done.headers["location"].replace("notice=pinned", "notice=" + spoof.replace(" ", "+"))
    assert "evil.example" not in web.get(forged).text  # the signature is of the console's own text
    other = sign_in(app, a.keys["carol"])  # the same link in another session
    assert 'class="notice"' not in other.get(done.headers["location"]).text
    web.post("/console/beliefs/b-pay/unpin", data={"csrf_token": token, "confirmed": "yes"})


def test_aliases_left_out_for_the_cap_are_named_not_reported_as_added(
    app: FastAPI, client: TestClient, operator: dict[str, str]
) -> None:
    """With 24 aliases, adding three kept one and dropped two for the cap of 25, and the console
    said "aliases added" at both steps: the admin believed recall would find the belief by all three."""
    team = make_team(client, operator)
    body = belief_body("payment_provider", "project:pay", id="b-full", aliases=[f"name {i}" for i in range(24)])
    ok(client.post("/v1/beliefs", json=body, headers=team.h("bob")), 201)
    web = sign_in(app, team.keys["carol"])
    form = {"csrf_token": csrf_of(web), "aliases": "name 3, psp, adyen, card processor"}
    confirm = web.post("/console/beliefs/b-full/alias", data=form)
    assert confirm.status_code == 200
    assert "would not be added" in confirm.text and "&#39;adyen&#39;, &#39;card processor&#39;" in confirm.text
    done = web.post("/console/beliefs/b-full/alias", data={**form, "confirmed": "yes"})
    assert done.status_code == 303
    notice = web.get(done.headers["location"]).text
    assert "aliases added: psp" in notice and "not added (at most 25 aliases): adyen, card processor" in notice
    assert ok(client.get("/v1/beliefs/b-full", headers=team.h("bob")))["aliases"][-1] == "psp"
    again = web.post("/console/beliefs/b-full/alias", data={**form, "aliases": "psp", "confirmed": "yes"})
    assert "no alias added" in web.get(again.headers["location"]).text


def test_either_of_two_open_sign_in_forms_signs_in(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    """Every sign-in page replaced the double-submit cookie: with two tabs sent to the sign-in page
    (a session that ended under both), signing in from the first answered 403 "the sign-in form
    expired". The browser's own token is kept; one another browser posts is still refused."""
    a, _ = seeded
    web = browser(app)
    first = LOGIN_RE.search(web.get("/console/login").text)
    second = LOGIN_RE.search(web.get("/console/beliefs", follow_redirects=True).text)
    assert first and second
    done = web.post("/console/login", data={"credential": a.keys["carol"], "login_csrf": first.group(1)})
    assert done.status_code == 303 and COOKIE in done.cookies
    elsewhere = browser(app)
    assert LOGIN_RE.search(elsewhere.get("/console/login").text)
    forged = elsewhere.post("/console/login", data={"credential": a.keys["carol"], "login_csrf": second.group(1)})
    assert forged.status_code == 403


def test_signing_out_of_an_ended_session_goes_to_the_sign_in_page(app: FastAPI, seeded: tuple[Team, Team]) -> None:
    """Signed out in one tab, "Sign out" in another (or after the idle timeout) showed the error
    page "unauthenticated: sign in again" instead of the sign-in page."""
    a, _ = seeded
    web = sign_in(app, a.keys["bob"])
    token = csrf_of(web)
    assert web.post("/console/logout", data={"csrf_token": token}).status_code == 303
    again = web.post("/console/logout", data={"csrf_token": token})  # the other tab's stale page
    assert again.status_code == 303 and again.headers["location"] == "/console/login"
    assert web.post("/console/beliefs/b-pay/pin", data={"csrf_token": token}).status_code == 401  # other forms: still


def test_a_review_queue_longer_than_a_page_says_so(
    app: FastAPI, client: TestClient, operator: dict[str, str], services: Services
) -> None:
    """The queue showed the newest 100 items and nothing more, with no word that older ones exist:
    an admin who cleared the page believed the queue was empty while the oldest waited unseen."""
    team = make_team(client, operator)
    ok(
        client.post(
            "/v1/beliefs", json=belief_body("payment_provider", "project:pay", id="b-psp"), headers=team.h("alice")
        ),
        201,
    )
    reviews = ReviewStore(services.opensearch, services.settings.opensearch_namespace)
    for n in range(101):
        item = ReviewItem(
            tenant_id=team.tenant, review_id=f"rv-{n:03d}", kind="conflict", owner_id="alice", scope=["project:pay"],
            belief_id="b-psp", canonical_name="payment_provider", reason="contradicts", proposed={"content": f"v{n}"},
        )  # fmt: skip
        assert reviews.create(item)
    services.opensearch.indices.refresh(index=f"{services.settings.opensearch_namespace}-reviews")
    web = sign_in(app, team.keys["carol"])
    full = web.get("/console/reviews")
    assert full.status_code == 200 and full.text.count('class="card review"') == 100
    assert "Only the newest 100 open items are listed" in full.text
    web.post("/console/reviews/rv-100", data={"csrf_token": csrf_of(web), "action": "dismiss", "confirmed": "yes"})
    services.opensearch.indices.refresh(index=f"{services.settings.opensearch_namespace}-reviews")
    cleared = web.get("/console/reviews")
    assert cleared.text.count('class="card review"') == 100 and "Only the newest" not in cleared.text


def test_a_re_run_link_for_a_user_past_the_pickers_page_previews_as_that_user(
    app: FastAPI, seeded: tuple[Team, Team], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The picker lists a tenant's first page of users; a link naming a later one preselected the
    browser's first option instead, so the preview ran as somebody else."""
    from service.console.routes import recall as playground

    monkeypatch.setattr(playground, "USER_CHOICES", 1)
    a, _ = seeded
    web = sign_in(app, a.keys["carol"])
    listed = web.get("/console/recall")
    assert listed.status_code == 200
    first = re.findall(r'<option value="([^"]+)"', listed.text)
    assert len(first) <= 2  # the first page's user, and carol herself (the chosen one)
    later = next(u for u in ("alice", "bob", "carol") if u not in first)
    linked = web.get("/console/recall", params={"as_user": later, "message": "pay provider"})
    assert linked.status_code == 200
    assert re.search(rf'<option value="{later}" selected>', linked.text), linked.text
    token = CSRF_RE.search(linked.text)
    assert token
    shown = web.post("/console/recall", data={"csrf_token": token.group(1), "as_user": later, "message": "x"})
    assert re.search(rf'<option value="{later}" selected>', shown.text)
    assert web.get("/console/recall", params={"as_user": "nobody"}).status_code == 404
    member = sign_in(app, a.keys["bob"])
    assert member.get("/console/recall", params={"as_user": "alice"}).status_code == 403
    assert member.get("/console/recall", params={"as_user": "bob"}).status_code == 200


def test_an_admin_is_offered_only_the_changes_the_service_accepts(
    app: FastAPI, client: TestClient, seeded: tuple[Team, Team]
) -> None:
    """Alice's belief of project pay that also lives in her own domain:code: carol (admin, holds
    pay) sees it as a user, but a change of hers would reach alice's own sessions, which the
    service refuses (403). The page offered pin, supersede and the rest, each ending in an error."""
    a, _ = seeded
    body = belief_body("ledger_provider", "project:pay", id="b-mixed")
    ok(client.post("/v1/beliefs", json={**body, "scope": ["project:pay", "domain:code"]}, headers=a.h("alice")), 201)
    web = sign_in(app, a.keys["carol"])
    mixed = web.get("/console/beliefs/b-mixed")
    assert mixed.status_code == 200 and "Erase" in mixed.text
    assert "Supersede" not in mixed.text and "Pin…" not in mixed.text and "Retract" not in mixed.text
    shared = web.get("/console/beliefs/b-pay")  # pay alone: carol may change it
    assert "Supersede" in shared.text and "Pin…" in shared.text
