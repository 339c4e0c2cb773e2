"""A turn whose very credential was revoked while it waited for extraction writes nothing, through
the real API, the real Celery worker, OpenSearch and Redis: a leaked key's (or token's) injected
turns must not become shared beliefs once an admin revoked it (docs/memory-loop.md, "Merge rules").

- a turn records the id of the credential it came with (the API key's id, the token's ``jti``;
  never a secret), and extraction refuses it (``skipped``, with the reason) once that credential is
  revoked, by the check every request meets;
- only that credential: the same user's turn with another key or token is extracted, and so is
  the other tenant's turn, even one whose token carries the same ``jti``;
- a key that merely expired after recording its turn was valid when it did: the turn is extracted;
  an expired key that was also revoked is refused;
- a turn recorded before turns carried the credential's id is extracted as before.

Two tenants (crew and other_crew), each with bob and alice (project pay)."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from joserfc.jwk import RSAKey
from opensearchpy import OpenSearch

from service.api.state import Services
from service.auth.revocations import KEY_REVOKED, TOKEN_REVOKED, JtiRevocations
from service.config import Settings
from service.domain.accounts import Credential
from service.domain.belief import utcnow
from service.extraction.queue import TaskQueue
from service.storage.accounts import KEY_ROUTING
from service.storage.templates import ACCOUNTS, TURNS
from tests.api.conftest import Team, auth, ok
from tests.memory_loop import test_idp_turns as idp
from tests.memory_loop.conftest import WorkerProcess, wait_turn
from tests.memory_loop.test_idp_turns import answer_with, found, ops_of, post_turn

DAY_S = 86_400
# the identity provider (and development tokens) of test_idp_turns: another API process of the deployment
idp_key, idp_app, idp_api = idp.idp_key, idp.idp_app, idp.idp_api


def key_id(plaintext: str) -> str:
    return plaintext.split("_")[1]


def jti_of(token: str) -> str:
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"])


def waiting_turn(
    services: Services,
    settings: Settings,
    tenant: str,
    owner: str,
    projects: list[str],
    name: str,
    credential: Credential | None,
    credential_id: str | None,
) -> str:
    """A turn stored as the API records it but not yet sent to the worker (what a backlog, the
    sweep or a parked turn leaves waiting), recorded with the credential ``credential_id`` (None
    with ``credential`` None: recorded before turns named it); its sidecar adds the belief
    ``name`` in the first of ``projects``."""
    answer = answer_with(name, f"project:{projects[0]}")
    return idp.recorded_turn(
        services, settings, tenant, owner, projects, answer, credential, credential_id, session_id="s-revoked"
    )


def fresh(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


def stored(os_client: OpenSearch, settings: Settings, tenant: str, turn_id: str) -> dict[str, Any]:
    doc = os_client.get(index=TURNS.alias(settings.opensearch_namespace), id=f"{tenant}:{turn_id}", routing=tenant)
    return dict(doc["_source"])


def test_a_revoked_api_keys_waiting_turn_writes_nothing_and_only_that_keys(
    api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
    os_client: OpenSearch,
) -> None:
    """bob's key K leaked; turns recorded with it wait when the admin revokes K. K's turn is
    skipped and writes nothing; bob's turn with his other key, and his turn recorded before turns
    named their credential, are extracted; the other tenant's bob is untouched. A key that merely
    expired after its turn was valid when it recorded it: extracted; one expired and revoked: not."""
    keys = f"/v1/admin/tenants/{crew.tenant}/users/bob/keys"
    leaked = crew.keys["bob"]
    spare = ok(api.post(keys, json={"name": "spare"}, headers=operator_headers), 201)["key"]
    expiring = ok(api.post(keys, json={"name": "short", "expires_in_s": 60}, headers=operator_headers), 201)["key"]
    expired_revoked = ok(api.post(keys, json={"name": "both", "expires_in_s": 60}, headers=operator_headers), 201)

    # the API records the key's id on the turn, never its secret
    live = post_turn(api, auth(leaked), answer_with(fresh("pay_live"), "project:pay"), ["project:pay"])
    assert ops_of(wait_turn(api, crew.h("carol"), live)) == [("new_beliefs", "inserted")]
    source = stored(os_client, loop_settings, crew.tenant, live)
    assert (source["credential"], source["credential_id"]) == ("api_key", key_id(leaked))
    assert leaked not in json.dumps(source) and leaked.split("_", 2)[2] not in json.dumps(source)

    names = {who: fresh(f"pay_{who}") for who in ("leaked", "spare", "old", "other", "expired", "both")}
    t, o = crew.tenant, other_crew.tenant
    svc, cfg = loop_services, loop_settings
    waiting = {
        "leaked": (t, waiting_turn(svc, cfg, t, "bob", ["pay"], names["leaked"], "api_key", key_id(leaked))),
        "spare": (t, waiting_turn(svc, cfg, t, "bob", ["pay"], names["spare"], "api_key", key_id(spare))),
        "old": (t, waiting_turn(svc, cfg, t, "bob", ["pay"], names["old"], None, None)),
        "other": (
            o,
            waiting_turn(svc, cfg, o, "bob", ["pay"], names["other"], "api_key", key_id(other_crew.keys["bob"])),
        ),
        "expired": (t, waiting_turn(svc, cfg, t, "bob", ["pay"], names["expired"], "api_key", key_id(expiring))),
        "both": (t, waiting_turn(svc, cfg, t, "bob", ["pay"], names["both"], "api_key", expired_revoked["key_id"])),
    }
    # the admin revokes the leaked key (and the third); two keys expire (their records, as time would)
    ok(api.delete(f"/v1/admin/keys/{key_id(leaked)}", headers=crew.h("carol")))
    ok(api.delete(f"/v1/admin/keys/{expired_revoked['key_id']}", headers=crew.h("carol")))
    accounts = ACCOUNTS.alias(loop_settings.opensearch_namespace)
    past = (utcnow() - timedelta(seconds=5)).isoformat()
    for expired in (key_id(expiring), expired_revoked["key_id"]):
        body = {"doc": {"expires_at": past}}
        os_client.update(index=accounts, id=f"key:{expired}", routing=KEY_ROUTING, body=body, refresh=True)
    loop_services.accounts.bump_version(crew.tenant)
    for refused in (leaked, expiring, expired_revoked["key"]):  # as every request with them is
        assert api.get("/v1/whoami", headers=auth(refused)).status_code == 401
    assert api.get("/v1/whoami", headers=auth(spare)).status_code == 200

    queue = TaskQueue(loop_settings)
    for tenant, turn_id in waiting.values():
        queue.extract(tenant, turn_id)
    admins = {t: crew.h("carol"), o: other_crew.h("carol")}
    final = {who: wait_turn(api, admins[tenant], turn_id) for who, (tenant, turn_id) in waiting.items()}
    for who in ("leaked", "both"):
        assert final[who]["extraction_status"] == "skipped", final[who]
        assert final[who]["result"] == {"reason": KEY_REVOKED}
        assert not found(loop_services, t, "pay", names[who])
    for who in ("spare", "old", "expired", "other"):
        assert ops_of(final[who]) == [("new_beliefs", "inserted")], (who, final[who])
    for who in ("spare", "old", "expired"):
        assert found(loop_services, t, "pay", names[who])
    assert found(loop_services, o, "pay", names["other"])
    assert not found(loop_services, o, "pay", names["leaked"])


def idp_token_with(key: RSAKey, tenant: str, sub: str, jti: str) -> str:
    """An identity provider's token for ``sub`` of ``tenant`` (project alpha) with the id ``jti``."""
    return idp.idp_token(key, tenant, sub, ["alpha"], jti=jti)


def test_a_token_revoked_by_its_jti_stops_its_waiting_turns_and_only_its_own(
    api: TestClient,
    idp_api: TestClient,
    crew: Team,
    other_crew: Team,
    worker: WorkerProcess,
    loop_services: Services,
    loop_settings: Settings,
    operator_headers: dict[str, str],
    idp_key: tuple[RSAKey, Path],
    os_client: OpenSearch,
) -> None:
    """alice's development token T1 and dana's identity provider token (jti J) are revoked while
    turns they recorded wait: both are skipped and write nothing. alice's turn with another token
    of hers is extracted; in the other tenant, dana's token carrying the very same jti J, and
    alice's token, are not revoked: their turns are extracted. The revocation is kept past the
    token's expiry for as long as its turns may wait (the tenant's turn retention)."""
    key, _ = idp_key
    t, o = crew.tenant, other_crew.tenant

    def dev_token(tenant: str) -> str:
        issued = idp_api.post(f"/v1/admin/tenants/{tenant}/users/alice/tokens", json={}, headers=operator_headers)
        return str(ok(issued, 201)["token"])

    revoked_dev, other_dev, others_dev = dev_token(t), dev_token(t), dev_token(o)
    shared_jti = f"idp-{uuid.uuid4().hex}"
    dana, others_dana = idp_token_with(key, t, "dana", shared_jti), idp_token_with(key, o, "dana", shared_jti)

    # the API records the token's jti on the turn, never the token
    live = post_turn(idp_api, auth(revoked_dev), answer_with(fresh("pay_live"), "project:pay"), ["project:pay"])
    assert ops_of(wait_turn(idp_api, crew.h("carol"), live)) == [("new_beliefs", "inserted")]
    source = stored(os_client, loop_settings, t, live)
    assert (source["credential"], source["credential_id"]) == ("service_token", jti_of(revoked_dev))
    assert revoked_dev not in json.dumps(source)

    svc, cfg = loop_services, loop_settings
    names = {who: fresh(f"tok_{who}") for who in ("dev", "dev2", "dev_other", "dana", "dana_other")}
    waiting = {
        "dev": (t, waiting_turn(svc, cfg, t, "alice", ["pay"], names["dev"], "service_token", jti_of(revoked_dev))),
        "dev2": (t, waiting_turn(svc, cfg, t, "alice", ["pay"], names["dev2"], "service_token", jti_of(other_dev))),
        "dev_other": (
            o,
            waiting_turn(svc, cfg, o, "alice", ["pay"], names["dev_other"], "service_token", jti_of(others_dev)),
        ),
        "dana": (t, waiting_turn(svc, cfg, t, "dana", ["alpha"], names["dana"], "idp_token", shared_jti)),
        "dana_other": (o, waiting_turn(svc, cfg, o, "dana", ["alpha"], names["dana_other"], "idp_token", shared_jti)),
    }
    for token in (revoked_dev, dana):
        ok(idp_api.post("/v1/admin/tokens/revoke", json={"token": token}, headers=crew.h("carol")))
        assert idp_api.get("/v1/whoami", headers=auth(token)).status_code == 401
    for token in (other_dev, others_dev, others_dana):
        assert idp_api.get("/v1/whoami", headers=auth(token)).status_code == 200

    # kept for the longest a turn of the token may wait (its expiry, then 90 days' turn retention)
    jtis = JtiRevocations(loop_services.redis, cfg.opensearch_namespace, cfg.auth.jwt_issuer, cfg.auth.jwt_leeway_s)
    assert cfg.retention.for_tenant(t).turns_days == 90
    for user, jti in (("alice", jti_of(revoked_dev)), ("dana", shared_jti)):
        assert loop_services.redis.ttl(jtis.key(t, user, jti)) > 90 * DAY_S

    queue = TaskQueue(loop_settings)
    for tenant, turn_id in waiting.values():
        queue.extract(tenant, turn_id)
    admins = {t: crew.h("carol"), o: other_crew.h("carol")}
    final = {who: wait_turn(api, admins[tenant], turn_id) for who, (tenant, turn_id) in waiting.items()}
    for who in ("dev", "dana"):
        assert final[who]["extraction_status"] == "skipped", final[who]
        assert final[who]["result"] == {"reason": TOKEN_REVOKED}
    assert not found(loop_services, t, "pay", names["dev"])
    assert not found(loop_services, t, "alpha", names["dana"])
    for who in ("dev2", "dev_other", "dana_other"):
        assert ops_of(final[who]) == [("new_beliefs", "inserted")], (who, final[who])
    assert found(loop_services, t, "pay", names["dev2"])
    assert found(loop_services, o, "pay", names["dev_other"])
    assert found(loop_services, o, "alpha", names["dana_other"])
