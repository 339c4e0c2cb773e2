"""Every request body and every JSON response in the OpenAPI schema carries an example that
validates against its schema, and the request examples are accepted by the running API (so
"Try it out" in the offline /docs sends a valid request)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from service.api.examples import ref_name
from tests.api.conftest import Team, auth, ok


def _media(openapi: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            holders = [("request", operation.get("requestBody") or {})]
            holders += [(f"response {code}", r) for code, r in operation.get("responses", {}).items()]
            for what, holder in holders:
                media = holder.get("content", {}).get("application/json")
                schema = media["schema"] if media is not None else {}
                if ref_name(schema) or ref_name(schema.get("items", {})):
                    found.append((f"{method.upper()} {path} {what}", holder["content"]["application/json"]))
    return found


def test_every_body_and_response_has_a_valid_example(app: FastAPI) -> None:
    openapi = app.openapi()
    media = _media(openapi)
    assert len(media) > 100  # every operation, its success and its documented errors
    missing = [where for where, m in media if "example" not in m]
    assert missing == [], "add an example for these models to EXAMPLES in service/api/examples.py"
    for where, m in media:
        validator = Draft202012Validator({**m["schema"], "components": openapi["components"]})
        errors = [e.message for e in validator.iter_errors(m["example"])]
        assert errors == [], f"{where}: {errors}"


def test_request_examples_are_accepted_by_the_api(app: FastAPI, client: TestClient, team: Team) -> None:
    openapi = app.openapi()

    def example(path: str, method: str = "post") -> Any:
        return openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["example"]

    # the docs' example member: bob on project payments (a fresh member of this test's tenant)
    operator = auth(app.state.services.provisioning.bootstrap().plaintext)
    users = f"/v1/admin/tenants/{team.tenant}/users"
    ok(client.post(users, json={"user_id": "dave", "projects": ["payments"]}, headers=operator), 201)
    key = ok(
        client.post(
            f"{users}/dave/keys",
            json=example("/v1/admin/tenants/{tenant_id}/users/{user_id}/keys"),
            headers=operator,
        ),
        201,
    )["key"]
    member = auth(key)
    created = ok(client.post("/v1/beliefs", json=example("/v1/beliefs"), headers=member), 201)
    bid = created["id"]
    recalled = ok(client.post("/v1/recall", json=example("/v1/recall"), headers=member))
    assert recalled["injected_ids"] == [bid]
    for path in ("/v1/beliefs/{belief_id}/reinforce", "/v1/beliefs/{belief_id}/aliases"):
        ok(client.post(path.format(belief_id=bid), json=example(path), headers=member))
    path = "/v1/beliefs/{belief_id}/supersede"
    ok(client.post(path.format(belief_id=bid), json=example(path), headers=member), 201)
    # the import example: a relation in the later format, its relation_type kept and recalled
    relation = example("/v1/beliefs/import")[0]
    assert ok(client.post("/v1/beliefs/import", json=[relation], headers=member))["imported"] == [relation["_id"]]
    recalled = ok(
        client.post("/v1/recall", json={"scopes": relation["scope"], "query": "payments redis"}, headers=member)
    )
    assert [(t["id"], t["relation_type"]) for t in recalled["tiers"]["relevant"]] == [(relation["_id"], "depends_on")]
