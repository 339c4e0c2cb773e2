"""One worked example per API model, put into the OpenAPI schema so "Try it out" in ``/docs`` sends
a valid request and every documented response shows a real-looking answer.

Examples follow the docs/api.md story (tenant ``acme``, project ``payments``, member ``bob``).
``tests/api/test_openapi_examples.py`` checks that every request body and every JSON response of
the schema has one, that each validates against its schema, and that the request examples are
accepted by the running API.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI

from service.recall.tiers import Tier

AT = "2026-11-30T09:00:00Z"
BELIEF: dict[str, Any] = {
    "id": "b-session-store",
    "tenant_id": "acme",
    "owner_id": "bob",
    "type": "decision",
    "subtype": None,
    "canonical_name": "session_store",
    "aliases": ["sticky sessions", "session cache"],
    "content": "User sessions live in Redis (allkeys-lru); services stay stateless.",
    "why_it_matters": "Never propose sticky sessions or in-process session state.",
    "scope": ["project:payments"],
    "epistemic_status": "active",
    "confidence": 0.9,
    "pinned": False,
    "user_edited": False,
    "reinforcement_count": 2,
    "last_reinforced_at": AT,
    "supersedes": None,
    "superseded_by": None,
    "resolved_at": None,
    "retracted_at": None,
    "participants": [],
    "relation_type": None,
    "expertise_domain": None,
    "expertise_depth": None,
    "compaction_note": None,
    "provenance": {"session_id": "sess-1", "turn_id": None, "source_model": None, "author": "bob"},
    "change_log": [{"changed_at": AT, "trigger": "created", "actor": "bob"}],
    "created_at": AT,
    "updated_at": AT,
    "version": 1,
}
TIER_ITEM: dict[str, Any] = {
    "id": "b-session-store",
    "canonical_name": "session_store",
    "type": "decision",
    "scope": ["project:payments"],
    "content": BELIEF["content"],
    "why_it_matters": BELIEF["why_it_matters"],
    "epistemic_status": "active",
    "confidence": 0.9,
    "score": 19.0,
    "clauses": [{"clause": "aliases.shingle", "term": "sticky sessions", "score": 14.0}],
    "via_relation": None,
    "relation_type": None,
}
# A relation in the paper author's later format (POST /v1/beliefs/import): the paper's seed fields
# plus relation_type, kept, shown in recall's tiers and in the rendered injection.
RELATION_RECORD: dict[str, Any] = {
    "_id": "b-payments-uses-redis",
    "type": "relation",
    "canonical_name": "payments_api_uses_redis",
    "aliases": ["payments redis"],
    "content": "The payments API keeps its sessions and idempotency keys in Redis.",
    "why_it_matters": "A Redis change is a payments change: check both.",
    "scope": ["project:payments"],
    "participants": ["b-payments-api", "b-session-store"],
    "relation_type": "depends_on",
    "confidence": 0.9,
}
IMPORT_EXAMPLE: list[dict[str, Any]] = [RELATION_RECORD]
USER: dict[str, Any] = {
    "tenant_id": "acme",
    "user_id": "bob",
    "roles": ["member"],
    "projects": ["payments"],
    "teams": [],
    "disabled": False,
    "created_at": AT,
    "updated_at": AT,
}
KEY: dict[str, Any] = {
    "key_id": "k7f3a9c2",
    "tenant_id": "acme",
    "user_id": "bob",
    "name": "bob-laptop",
    "roles": ["member"],
    "projects": ["payments"],
    "teams": [],
    "created_at": AT,
    "expires_at": None,
    "revoked_at": None,
    "last_used_at": None,
}
AUDIT_EVENT: dict[str, Any] = {
    "event_id": "ev-4c1d",
    "tenant_id": "acme",
    "at": AT,
    "action": "recall",
    "actor_id": "bob",
    "actor_kind": "api_key",
    "credential_id": "k7f3a9c2",
    "belief_ids": ["b-session-store"],
    "session_id": "sess-1",
    "request_id": "req-1",
    "scopes": ["project:payments"],
    "query": "can we use sticky sessions?",
    "injected": [{"id": "b-session-store", "tier": Tier.RELEVANT.value, "score": 19.0}],
}
FAILED_TURN: dict[str, Any] = {
    "turn_id": "turn-9e2a",
    "owner_id": "bob",
    "session_id": "sess-1",
    "scope": ["project:payments"],
    "source": "proxy",
    "model": "gpt-4o",
    "parse_status": "parsed",
    "gate": "verified",
    "extraction_status": "failed",
    "attempts": 3,
    "error": "gave up after 3 attempts, none finished; the last one: interrupted: SoftTimeLimitExceeded: ",
    "created_at": AT,
    "updated_at": AT,
    "finished_at": AT,
}
RETRIED_TURN: dict[str, Any] = {
    **FAILED_TURN,
    "extraction_status": "pending",
    "attempts": 0,
    "error": f"retry requested by alice at {AT}; it had failed: {FAILED_TURN['error']}",
    "finished_at": None,
    "previous_error": FAILED_TURN["error"],
    "previous_attempts": 3,
    "queued": True,
}
INJECTION = (
    "You have persistent memory of this team's settled decisions...\n"
    '<relevant_beliefs>[{"name": "session_store", "directive": "Never propose sticky sessions or '
    'in-process session state."}]'
)

EXAMPLES: dict[str, Any] = {
    # ------------------------------------------------------------------ requests
    "BeliefCreate": {
        "type": "decision",
        "canonical_name": "session_store",
        "aliases": ["sticky sessions", "session cache"],
        "content": BELIEF["content"],
        "why_it_matters": BELIEF["why_it_matters"],
        "scope": ["project:payments"],
    },
    "RecallIn": {"scopes": ["project:payments"], "query": "can we just use sticky sessions?", "session_id": "sess-1"},
    "SupersedeIn": {
        "content": "User sessions live in Valkey (allkeys-lru); services stay stateless.",
        "aliases": ["valkey sessions"],
        "reason": "migrated from Redis to Valkey",
    },
    "AliasesIn": {"aliases": ["session cache"]},
    "ReinforceIn": {"aliases": ["kv sessions"]},
    "RetractIn": {"reason": "decided in error"},
    "service__api__routes__beliefs__ResolveIn": {"note": "LRU, decided in the design review"},
    # the review queue's ResolveIn (its qualified name follows the module that defines the route)
    "service__proxy__routes__ResolveIn": {"action": "keep_existing"},
    "service__api__routes__memory_loop__ResolveIn": {"action": "keep_existing"},
    "TenantIn": {"tenant_id": "acme", "name": "Acme Corp"},
    "UserIn": {"user_id": "bob", "projects": ["payments"]},
    "GrantsPatch": {"add_teams": ["platform"]},
    "KeyIn": {"name": "bob-laptop"},
    "TokenIn": {"ttl_s": 3600},
    "TokenRevokeIn": {"token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IifQ.c2lnbmF0dXJl"},
    "TurnIn": {
        "session_id": "sess-1",
        "scope": ["project:payments"],
        "model": "gpt-4o",
        "user_message": "Can we just use sticky sessions?",
        "assistant_message": "No: sessions live in Redis so any instance can serve any request.",
        "injected_ids": ["b-session-store"],
    },
    "CompactionIn": {"force": False},
    "BulkRetryIn": {"limit": 50},
    # ----------------------------------------------------------------- responses
    "Belief": BELIEF,
    "BeliefPage": {"items": [BELIEF], "next_cursor": None},
    "ImportResult": {"imported": ["b-session-store"], "failed": {}},
    "SupersedeResult": {
        "superseded": {**BELIEF, "superseded_by": "b-session-store-v2", "epistemic_status": "superseded"},
        "current": {**BELIEF, "id": "b-session-store-v2", "supersedes": "b-session-store"},
    },
    "HistoryOut": {
        "belief_id": "b-session-store",
        "chain": [BELIEF],
        "change_log": [{"belief_id": "b-session-store", "version": 1, "entry": BELIEF["change_log"][0]}],
    },
    "ErasureReceiptOut": {
        "belief_id": "b-session-store",
        "belief_versions_removed": ["b-session-store"],
        "audit_payload_copies_removed": 3,
        "cached_renderings_removed": 1,
        "erased_at": AT,
        "text_copies_redacted": 2,
        "review_items_removed": 1,
        "expunged": False,
    },
    "RecallOut": {
        "scopes": ["project:payments"],
        "query": "can we just use sticky sessions?",
        "persona": None,
        "tiers": {tier.value: [TIER_ITEM] if tier is Tier.RELEVANT else [] for tier in Tier},
        "injected_ids": ["b-session-store"],
        "truncated": False,
        "injection": {
            "text": INJECTION,
            "beliefs_end": INJECTION.index("\n"),
            "dynamic_start": INJECTION.index("\n") + 1,
            "beliefs": None,
            "dynamic": None,
        },
        "receipt_id": "ev-4c1d",
        "explain": None,
    },
    "WhoAmI": {
        "tenant_id": "acme",
        "user_id": "bob",
        "roles": ["member"],
        "projects": ["payments"],
        "teams": [],
        "credential": "api_key",
        "credential_id": "k7f3a9c2",
    },
    "TenantOut": {"tenant_id": "acme", "name": "Acme Corp", "disabled": False, "created_at": AT},
    "UserOut": USER,
    "UserPage": {"items": [USER], "next_cursor": None},
    "KeyOut": KEY,
    "IssuedKeyOut": {**KEY, "key": "tnr_k7f3a9c2_s3cr3tShownOnce"},
    "KeyPage": {"items": [KEY], "next_cursor": None},
    "TokenOut": {"token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IifQ.c2lnbmF0dXJl", "expires_at": 1796029200},
    "TokenRevokedOut": {"jti": "jti-51c0", "revoked": True, "expires_at": 1796029200},
    "AuditPage": {"items": [AUDIT_EVENT], "next_cursor": None, "quarantined": 0},
    "TurnOut": {
        "turn_id": "turn-9e2a",
        "session_id": "sess-1",
        "scope": ["project:payments"],
        "parse_status": "parsed",
        "extraction_status": "queued",
        "visible": None,
        "result": None,
        "model_warning": None,
    },
    "AdminTurnPage": {"items": [FAILED_TURN], "next_cursor": None, "quarantined": 0},
    "AdminTurnDetail": {
        **FAILED_TURN,
        "user_message": "Can we just use sticky sessions?",
        "assistant_text": "No: sessions live in Redis so any instance can serve any request.",
        "sidecar_raw": '{"turn_signal": "substantive", "new_beliefs": []}',
        "injected_ids": ["b-session-store"],
        "result": {},
    },
    "TurnRetryOut": RETRIED_TURN,
    "BulkRetryOut": {"retried": [RETRIED_TURN], "not_retried": {}, "more": False},
    "ReviewItem": {
        "tenant_id": "acme",
        "review_id": "rv-31",
        "kind": "conflict",
        "status": "open",
        "owner_id": "bob",
        "scope": ["project:payments"],
        "belief_id": "b-session-store",
        "canonical_name": "session_store",
        "reason": "extraction proposed superseding a user-edited belief",
    },
    "QuarantinePageOut": {
        "kind": "belief",
        "items": [
            {
                "kind": "belief",
                "record_id": "b-legacy-7",
                "belief_id": "b-legacy-7",
                "owner_id": "bob",
                "scope": ["project:payments"],
                "reason": "content: String should have at most 8000 characters",
            }
        ],
        "scanned": 500,
        "next_cursor": None,
    },
    "QuarantineErasedOut": {
        "belief_id": "b-legacy-7",
        "belief_versions_removed": ["b-legacy-7"],
        "audit_payload_copies_removed": 1,
        "cached_renderings_removed": 0,
        "text_copies_redacted": 2,
        "review_items_removed": 0,
        "expunged": False,
        "erased_at": AT,
    },
    "QuarantinedRecordErasedOut": {"kind": "turn", "record_id": "turn-9e2a", "erased_at": AT},
    "Health": {"status": "ok"},
    "Readiness": {"status": "ready", "opensearch": True, "redis": True, "indices": True},
    "ErrorOut": {
        "error": {
            "code": "not_found",
            "message": "belief not found",
            "details": None,
            "request_id": "req-0b5c7d",
        }
    },
    "AnthropicErrorOut": {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "message": "invalid or revoked API key",
            "code": "unauthenticated",
        },
        "request_id": "req-0b5c7d",
    },
    "OpenAIErrorOut": {
        "error": {
            "message": "invalid or revoked API key",
            "type": "authentication_error",
            "code": "unauthenticated",
            "param": None,
            "request_id": "req-0b5c7d",
        }
    },
}


def ref_name(schema: dict[str, Any]) -> str | None:
    """The model behind a schema: ``$ref``, or the ``$ref`` of an optional body (``anyOf`` with null)."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.rsplit("/", 1)[-1]
    refs = [s["$ref"] for s in schema.get("anyOf", []) if isinstance(s.get("$ref"), str)]
    return refs[0].rsplit("/", 1)[-1] if len(refs) == 1 else None


def add_examples(openapi: dict[str, Any]) -> dict[str, Any]:
    """Put each model's example on its component schema and on every request body and JSON
    response that uses it (the media-type ``example`` is what Swagger UI's "Try it out" sends)."""
    components = openapi.get("components", {}).get("schemas", {})
    for name, example in EXAMPLES.items():
        if name in components:
            components[name]["examples"] = [copy.deepcopy(example)]
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            bodies = [operation.get("requestBody") or {}]
            bodies += list(operation.get("responses", {}).values())
            for holder in bodies:
                media = holder.get("content", {}).get("application/json")
                if media is None:
                    continue
                schema = media.get("schema", {})
                model = ref_name(schema)
                if model is None and schema.get("type") == "array":
                    inner = ref_name(schema.get("items", {}))
                    if inner in EXAMPLES:
                        media["example"] = [copy.deepcopy(EXAMPLES[inner])]
                    continue
                if model in EXAMPLES:
                    media["example"] = copy.deepcopy(EXAMPLES[model])
    return openapi


def install(app: FastAPI) -> None:
    """Wrap ``app.openapi`` so the cached schema carries the examples."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_examples(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
