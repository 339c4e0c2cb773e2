"""What each API operation sends and how its answer is read, shared by the sync and async clients.

A :class:`Call` is a plain description (method, path, query, body, parser); the clients only
execute it, so both surfaces stay identical by construction.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, TypeAdapter
from pydantic_core import from_json

from tenure_client import models
from tenure_client.errors import BadRequest

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SESSION_HEADER = "X-Tenure-Session"
JSONL = "application/x-ndjson"


@dataclass(frozen=True)
class Parser(Generic[T]):
    """How an answer is read: from decoded JSON (``__call__``, what a test or a caller with data in
    hand passes) and straight from the answer's bytes (what the clients use). ``from_bytes`` reads
    with pydantic's own JSON parser: a model is validated from the bytes without building the
    answer as Python dicts and lists first, and raw JSON decodes faster than with the stdlib
    ``json`` (answers of recall are 5-35 KB; docs/benchmarks.md, "The SDK reads answers straight
    from their bytes")."""

    from_data: Callable[[Any], T]
    from_bytes: Callable[[bytes], T]

    def __call__(self, data: Any) -> T:
        return self.from_data(data)


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    parse: Parser[T] | Callable[[Any], T]  # a :class:`Parser` reads the answer's bytes directly
    params: Mapping[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # a write the server answers the same when sent again (a recall, a create carrying its id, a
    # revoke): resent after a dropped connection or a 503 although it may have been done already
    resend_safe: bool = False
    # a create carrying its id: when a resent attempt is told 409 (its earlier attempt was stored
    # before the answer was lost), this reads that id back; ``None`` from it: another write holds
    # the id, and the 409 stands
    on_resent_conflict: Call[T | None] | None = None

    @property
    def idempotent(self) -> bool:
        """Safe to resend after a dropped connection or a 503 (the server may have done it already).
        Not a DELETE: erasing again answers 404, and the caller would lose the receipt."""
        return self.resend_safe or self.method in ("GET", "HEAD", "OPTIONS")


def seg(value: str) -> str:
    """One path segment, escaped (an id can never reach another route): ``/``, ``?``, ``#`` and
    ``%`` are percent-encoded, and so is an id that is all a dot segment (``.``, ``..``), which URL
    normalisation (httpx's, a proxy's) would otherwise resolve against the path: ``users/../disable``
    is the tenant's ``disable``. An empty id would leave the route's own path (``/v1/beliefs/`` is
    the listing's) and is refused before anything is sent."""
    if not value:
        raise BadRequest("an id cannot be empty", code="validation_error")
    escaped = quote(value, safe="")
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def model(cls: type[M]) -> Parser[M]:
    return Parser(cls.model_validate, cls.model_validate_json)


def model_list(cls: type[M]) -> Parser[list[M]]:
    adapter = TypeAdapter(list[cls])  # type: ignore[valid-type]
    return Parser(adapter.validate_python, adapter.validate_json)


def _identity(data: Any) -> Any:
    return data


raw: Parser[Any] = Parser(_identity, from_json)


def as_json(call: Call[Any]) -> Call[Any]:
    """The same request, its answer returned as decoded JSON instead of a model."""
    return replace(call, parse=raw)


def body(cls: type[BaseModel], values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a request body against its model (a typo fails here, not at the server) and drop
    what the caller did not set, so the server's defaults apply."""
    given = {k: v for k, v in values.items() if v is not None}
    return cls.model_validate(given).model_dump(mode="json", by_alias=True, exclude_unset=True)


def query(**values: Any) -> dict[str, Any]:
    """Query parameters without the unset ones; lists stay lists (repeated parameters)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None or (isinstance(value, list | tuple) and not value):
            continue
        out[key.rstrip("_")] = list(value) if isinstance(value, list | tuple) else value
    return out


def bool_param(value: bool | None) -> str | None:
    return None if value is None else ("true" if value else "false")


# ------------------------------------------------------------------ beliefs


def belief_filters(
    *,
    type: Sequence[str] = (),  # noqa: A002 - the API's parameter name
    status: Sequence[str] = (),
    scope: Sequence[str] = (),
    pinned: bool | None = None,
    q: str | None = None,
    all: bool = False,  # noqa: A002
) -> dict[str, Any]:
    return query(type=type, status=status, scope=scope, pinned=bool_param(pinned), q=q, all_=bool_param(all or None))


def new_belief_id() -> str:
    """A belief id made here, as the server makes one (``b-`` and a random UUID): a create sent
    again carries the same id, so the server cannot store it twice."""
    return f"b-{uuid.uuid4().hex}"


def create_belief(values: Mapping[str, Any], session_id: str | None = None) -> Call[models.Belief]:
    given_id = values.get("id")
    payload = body(models.BeliefCreate, {**values, "id": given_id or new_belief_id()})
    return Call(
        "POST",
        "/v1/beliefs",
        model(models.Belief),
        json=payload,
        headers=session(session_id),
        resend_safe=True,
        on_resent_conflict=Call(
            "GET", f"/v1/beliefs/{seg(payload['id'])}", _earlier_create(payload, id_made_here=not given_id)
        ),
    )


def _earlier_create(sent: Mapping[str, Any], *, id_made_here: bool) -> Parser[models.Belief | None]:
    """Reads the belief a resent create met: the create's own earlier attempt, or ``None``. An id
    made here (a random UUID) can only have been stored by that attempt; an id the caller chose
    may be another write's, so the stored belief must say what this create said."""

    def same_write(stored: models.Belief) -> models.Belief | None:
        if id_made_here or (stored.type == sent["type"] and stored.content == _as_stored(sent["content"])):
            return stored
        return None

    return Parser(
        lambda data: same_write(models.Belief.model_validate(data)),
        lambda raw: same_write(models.Belief.model_validate_json(raw)),
    )


def _as_stored(text: Any) -> Any:
    """A statement as the server stores it, as far as a resend's comparison needs: line ends
    unified and the ends trimmed (the server also drops control and bidi characters; a text
    holding those compares unequal, and the resend stays a Conflict, the safe side)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip() if isinstance(text, str) else text


def get_belief(belief_id: str) -> Call[models.Belief]:
    return Call("GET", f"/v1/beliefs/{seg(belief_id)}", model(models.Belief))


def list_beliefs(filters: dict[str, Any], limit: int | None, cursor: str | None) -> Call[models.BeliefPage]:
    return Call("GET", "/v1/beliefs", model(models.BeliefPage), params={**filters, **query(limit=limit, cursor=cursor)})


def history(belief_id: str) -> Call[models.HistoryOut]:
    return Call("GET", f"/v1/beliefs/{seg(belief_id)}/history", model(models.HistoryOut))


def supersede(belief_id: str, values: Mapping[str, Any], session_id: str | None) -> Call[models.SupersedeResult]:
    return Call(
        "POST",
        f"/v1/beliefs/{seg(belief_id)}/supersede",
        model(models.SupersedeResult),
        json=body(models.SupersedeIn, values),
        headers=session(session_id),
    )


def belief_action(
    belief_id: str, action: str, payload: dict[str, Any] | None = None, session_id: str | None = None
) -> Call[models.Belief]:
    return Call(
        "POST",
        f"/v1/beliefs/{seg(belief_id)}/{action}",
        model(models.Belief),
        json=payload,
        headers=session(session_id),
    )


def erase(belief_id: str) -> Call[models.ErasureReceiptOut]:
    return Call("DELETE", f"/v1/beliefs/{seg(belief_id)}", model(models.ErasureReceiptOut))


def import_beliefs(records: Iterable[Mapping[str, Any]], session_id: str | None) -> Call[models.ImportResult]:
    """An import whose records all carry ids (made here for those without one), so sending it
    again stores nothing twice; a made id the server calls taken was stored by an earlier attempt
    of this very request, and is reported as imported."""
    identified, made_ids = _with_ids(records)
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in identified)
    return Call(
        "POST",
        "/v1/beliefs/import",
        _import_result(made_ids),
        content=lines.encode(),
        headers={"Content-Type": JSONL, **session(session_id)},
        resend_safe=True,
    )


def _with_ids(records: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], frozenset[str]]:
    """The records, each with an id (``id`` or the export's ``_id``), and the ids made here."""
    identified: list[dict[str, Any]] = []
    made: set[str] = set()
    for record in records:
        if not record.get("id") and not record.get("_id"):
            made_id = new_belief_id()
            made.add(made_id)
            record = {**record, "id": made_id}
        identified.append(dict(record))
    return identified, frozenset(made)


def _import_result(made_ids: frozenset[str]) -> Parser[models.ImportResult]:
    def own_earlier_writes_imported(result: models.ImportResult) -> models.ImportResult:
        earlier = [i for i, failure in result.failed.items() if i in made_ids and failure.get("code") == "conflict"]
        for belief_id in earlier:
            del result.failed[belief_id]
            result.imported.append(belief_id)
        return result

    return Parser(
        lambda data: own_earlier_writes_imported(models.ImportResult.model_validate(data)),
        lambda raw: own_earlier_writes_imported(models.ImportResult.model_validate_json(raw)),
    )


def session(session_id: str | None) -> dict[str, str]:
    return {SESSION_HEADER: session_id} if session_id else {}


# ------------------------------------------------------------------- recall


def recall(
    query_text: str,
    scopes: Sequence[str],
    session_id: str | None,
    budget: Mapping[str, Any] | None,
    explain: bool,
) -> Call[models.RecallOut]:
    payload = body(
        models.RecallIn,
        {"query": query_text, "scopes": list(scopes), "session_id": session_id, "budget": budget, "explain": explain},
    )
    # a recall reads (its receipt records what was injected): a repeated message is answered the
    # same (tests/api/test_repeat_recall.py), so a dropped answer is asked for again
    return Call("POST", "/v1/recall", recall_out, json=payload, resend_safe=True)


def _with_parts(out: models.RecallOut) -> models.RecallOut:
    """The answer with ``injection.beliefs`` and ``injection.dynamic`` filled in: the server sends
    the block once (since 2026-11-30), and both parts are cut from ``injection.text`` here."""
    injection = out.injection
    if injection.beliefs is None:
        injection.beliefs = injection.text[: injection.beliefs_end]
    if injection.dynamic is None:
        injection.dynamic = injection.text[injection.dynamic_start :]
    return out


def _recall_from_data(data: Any) -> models.RecallOut:
    return _with_parts(models.RecallOut.model_validate(data))


def _recall_from_bytes(content: bytes) -> models.RecallOut:
    return _with_parts(models.RecallOut.model_validate_json(content))


recall_out = Parser(_recall_from_data, _recall_from_bytes)


def whoami() -> Call[models.WhoAmI]:
    return Call("GET", "/v1/whoami", model(models.WhoAmI))


# -------------------------------------------------------------------- admin


def tenants(path: str = "") -> str:
    return f"/v1/admin/tenants{path}"


def create_tenant(tenant_id: str, name: str | None) -> Call[models.TenantOut]:
    payload = body(models.TenantIn, {"tenant_id": tenant_id, "name": name or tenant_id})
    return Call("POST", tenants(), model(models.TenantOut), json=payload)


def tenant_action(tenant_id: str, action: str = "") -> Call[models.TenantOut]:
    suffix = f"/{action}" if action else ""
    return Call("POST" if action else "GET", tenants(f"/{seg(tenant_id)}{suffix}"), model(models.TenantOut))


def create_user(tenant_id: str, values: Mapping[str, Any]) -> Call[models.UserOut]:
    return Call("POST", tenants(f"/{seg(tenant_id)}/users"), model(models.UserOut), json=body(models.UserIn, values))


def user_action(tenant_id: str, user_id: str, action: str = "") -> Call[models.UserOut]:
    suffix = f"/{action}" if action else ""
    path = tenants(f"/{seg(tenant_id)}/users/{seg(user_id)}{suffix}")
    return Call("POST" if action else "GET", path, model(models.UserOut))


def list_users(tenant_id: str, limit: int | None, cursor: str | None) -> Call[models.UserPage]:
    params = query(limit=limit, cursor=cursor)
    return Call("GET", tenants(f"/{seg(tenant_id)}/users"), model(models.UserPage), params=params)


def change_grants(tenant_id: str, user_id: str, values: Mapping[str, Any]) -> Call[models.UserOut]:
    path = tenants(f"/{seg(tenant_id)}/users/{seg(user_id)}/grants")
    return Call("PATCH", path, model(models.UserOut), json=body(models.GrantsPatch, values))


def issue_key(tenant_id: str, user_id: str, values: Mapping[str, Any]) -> Call[models.IssuedKeyOut]:
    path = tenants(f"/{seg(tenant_id)}/users/{seg(user_id)}/keys")
    return Call("POST", path, model(models.IssuedKeyOut), json=body(models.KeyIn, values))


def list_keys(tenant_id: str, limit: int | None, cursor: str | None) -> Call[models.KeyPage]:
    params = query(limit=limit, cursor=cursor)
    return Call("GET", tenants(f"/{seg(tenant_id)}/keys"), model(models.KeyPage), params=params)


def revoke_key(key_id: str) -> Call[models.KeyOut]:
    """By key id or the key itself (``tnr_<key id>_<secret>``): only the id is sent, a secret in a
    URL would reach every access log on the way."""
    bare = key_id.split("_")[1] if key_id.startswith("tnr_") and key_id.count("_") >= 2 else key_id
    # revoking a revoked key answers the key again (the server's revoke_key): safe to resend
    return Call("DELETE", f"/v1/admin/keys/{seg(bare)}", model(models.KeyOut), resend_safe=True)


def dev_token(tenant_id: str, user_id: str, ttl_s: int | None) -> Call[models.TokenOut]:
    path = tenants(f"/{seg(tenant_id)}/users/{seg(user_id)}/tokens")
    return Call("POST", path, model(models.TokenOut), json=body(models.TokenIn, {"ttl_s": ttl_s}))


def revoke_token(token: str) -> Call[models.TokenRevokedOut]:
    payload = body(models.TokenRevokeIn, {"token": token})
    return Call("POST", "/v1/admin/tokens/revoke", model(models.TokenRevokedOut), json=payload)


def audit(filters: Mapping[str, Any], limit: int | None, cursor: str | None) -> Call[models.AuditPage]:
    params = {**query(**filters), **query(limit=limit, cursor=cursor)}
    return Call("GET", "/v1/admin/audit", model(models.AuditPage), params=params)


# -------------------------------------------------------------------- turns


def post_turn(values: Mapping[str, Any], session_id: str | None) -> Call[models.TurnOut]:
    # with a turn_id (made here when the caller gave none, as the server makes one) a turn posted
    # again is answered with the stored one, not recorded twice
    payload = body(models.TurnIn, {**values, "turn_id": values.get("turn_id") or f"turn-{uuid.uuid4().hex}"})
    return Call("POST", "/v1/turns", model(models.TurnOut), json=payload, headers=session(session_id), resend_safe=True)


def get_turn(turn_id: str) -> Call[models.TurnOut]:
    return Call("GET", f"/v1/turns/{seg(turn_id)}", model(models.TurnOut))


def admin_turns(
    status: str | None, owner_id: str | None, limit: int | None, cursor: str | None
) -> Call[models.AdminTurnPage]:
    params = query(status=status, owner_id=owner_id, limit=limit, cursor=cursor)
    return Call("GET", "/v1/admin/turns", model(models.AdminTurnPage), params=params)


def admin_turn(turn_id: str) -> Call[models.AdminTurnDetail]:
    return Call("GET", f"/v1/admin/turns/{seg(turn_id)}", model(models.AdminTurnDetail))


def retry_turn(turn_id: str) -> Call[models.TurnRetryOut]:
    # never resent: an earlier attempt that went through leaves the turn pending, and the resend
    # would be told 409 turn_not_failed about the caller's own retry
    return Call("POST", f"/v1/admin/turns/{seg(turn_id)}/retry", model(models.TurnRetryOut))


def retry_failed_turns(owner_id: str | None, limit: int | None) -> Call[models.BulkRetryOut]:
    payload = body(models.BulkRetryIn, {"owner_id": owner_id, "limit": limit})
    return Call("POST", "/v1/admin/turns/retry", model(models.BulkRetryOut), json=payload)


def health() -> Call[Any]:
    return Call("GET", "/readyz", raw)
