"""All OpenSearch access for accounts (tenants, users, API keys). The only module that touches the
``<namespace>-accounts`` alias.

Point reads go by document id (real time, no refresh needed); documents carry ``tenant_id`` and are
routed by it. Listings take their tenant filter from :mod:`service.storage.access`.

Every write of an account record goes through :meth:`AccountStore._changing`, which bumps the
tenant's accounts version (:class:`service.write_versions.TenantAccountsVersions`) before the write
and again once it is visible, so every process drops the credentials it verified against the old
records at its next request (``tests/test_structure.py`` checks that no write escapes it). The only
write outside it is ``touch_keys`` (``last_used_at``, which no credential check reads).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from opensearchpy import OpenSearch
from pydantic import BaseModel

from service.domain.accounts import ApiKeyRecord, Grants, TenantRecord, UserRecord
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import NotFound
from service.storage import access, calls, cursor
from service.storage.calls import Call, Reads
from service.storage.client import found_item, get_routed, index_routed, translate_errors
from service.storage.templates import ACCOUNTS
from service.write_versions import TenantAccountsVersions

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)

# Keys live under a fixed routing value: a key is looked up by id alone before the tenant is known.
KEY_ROUTING = "_keys"

GRANT_FIELDS = tuple(Grants.model_fields)  # what a user record grants: roles, projects, teams


def _tenant_doc(tenant_id: str) -> str:
    return f"tenant:{tenant_id}"


def _user_doc(tenant_id: str, user_id: str) -> str:
    return f"user:{tenant_id}:{user_id}"


def _key_doc(key_id: str) -> str:
    return f"key:{key_id}"


class AccountStore:
    def __init__(self, client: OpenSearch, namespace: str, versions: TenantAccountsVersions):
        self.client = client
        self.alias = ACCOUNTS.alias(namespace)
        self.versions = versions

    # ------------------------------------------------------------ primitives

    @contextmanager
    def _changing(self, tenant_id: str) -> Iterator[None]:
        """THE way to write a tenant's account records: the tenant's accounts version is bumped
        before the write and after it, also when the write failed part-way (it may have landed).
        A bump Redis refuses fails the request; the write is idempotent and its retry bumps."""
        self.versions.bump(tenant_id)
        try:
            yield
        finally:
            self.versions.bump(tenant_id)

    def bump_version(self, tenant_id: str) -> None:
        """For a request that finds its change already made: an earlier attempt may have written it
        and then failed to bump, so the retry bumps (cheap, and a bump too many costs one reload)."""
        self.versions.bump(tenant_id)

    def _write(
        self, tenant_id: str, doc_id: str, record: BaseModel, kind: str, action: str, on_conflict: str, **extra: Any
    ) -> None:
        """The one writer of account documents (visible on return: ``refresh=true``)."""
        body = {"kind": kind, **record.model_dump(mode="json")}
        with self._changing(tenant_id):
            index_routed(
                self.client,
                index=self.alias,
                doc_id=doc_id,
                body=body,
                routing=KEY_ROUTING if kind == "key" else tenant_id,
                refresh="true",
                action=action,
                on_conflict=on_conflict,
                **extra,
            )

    def _create(self, tenant_id: str, doc_id: str, kind: str, record: BaseModel, what: str) -> None:
        self._write(tenant_id, doc_id, record, kind, f"create {what}", f"{what} already exists", op_type="create")

    def _get(self, doc_id: str, routing: str, model: type[R], what: str) -> tuple[R, int, int]:
        found = get_routed(self.client, index=self.alias, doc_id=doc_id, routing=routing, action=f"read {what}")
        if found is None:
            raise NotFound(f"{what} not found")
        return _record(model, found["_source"]), int(found["_seq_no"]), int(found["_primary_term"])

    def _replace(
        self, tenant_id: str, doc_id: str, kind: str, record: BaseModel, seq: tuple[int, int], what: str
    ) -> None:
        self._write(
            tenant_id,
            doc_id,
            record,
            kind,
            f"update {what}",
            f"{what} was changed concurrently; retry",
            if_seq_no=seq[0],
            if_primary_term=seq[1],
        )

    # --------------------------------------------------------------- tenants

    def create_tenant(self, tenant: TenantRecord) -> None:
        self._create(tenant.tenant_id, _tenant_doc(tenant.tenant_id), "tenant", tenant, f"tenant {tenant.tenant_id!r}")

    def get_tenant(self, tenant_id: str) -> TenantRecord:
        return self.get_tenant_versioned(tenant_id)[0]

    def get_tenant_versioned(self, tenant_id: str) -> tuple[TenantRecord, int, int]:
        return self._get(_tenant_doc(tenant_id), tenant_id, TenantRecord, f"tenant {tenant_id!r}")

    def replace_tenant(self, tenant: TenantRecord, seq: tuple[int, int]) -> None:
        tenant.updated_at = utcnow()
        self._replace(
            tenant.tenant_id, _tenant_doc(tenant.tenant_id), "tenant", tenant, seq, f"tenant {tenant.tenant_id!r}"
        )

    def list_tenants(self, principal: Principal, *, size: int) -> list[TenantRecord]:
        """Every tenant, by id (operators only: anyone else gets an empty list from the
        chokepoint's filter). Tenants are few; ``size`` caps the page."""
        body: dict[str, Any] = {
            "size": size,
            "query": access.for_operator(principal).query({"term": {"kind": "tenant"}}),
            "sort": [{"tenant_id": "asc"}],
            "track_total_hits": False,
        }
        with translate_errors("list tenants"):
            hits = self.client.search(index=self.alias, body=body)["hits"]["hits"]
        return [_record(TenantRecord, h["_source"]) for h in hits]

    def account_status(self, tenant_id: str, user_id: str) -> tuple[bool, Grants | None]:
        """Whether the tenant or the user is disabled, and the user's grants as provisioned here
        (None without a user record), in one real-time ``mget`` (both documents share the tenant's
        routing). A missing record is not a disabled one: JWT subjects from an identity provider
        need not be provisioned here."""
        docs = [
            {"_id": _tenant_doc(tenant_id), "routing": tenant_id, "_source": ["disabled"]},
            {"_id": _user_doc(tenant_id, user_id), "routing": tenant_id, "_source": ["disabled", *GRANT_FIELDS]},
        ]
        try:
            with translate_errors("check whether an account is disabled", on_missing="no accounts index"):
                found = self.client.mget(index=self.alias, body={"docs": docs})["docs"]
        except NotFound:  # no accounts index yet: no record, so nothing disabled
            return False, None
        action = "check whether an account is disabled"
        disabled = any(found_item(d, action) and d.get("_source", {}).get("disabled") is True for d in found)
        user = found[1]
        if not found_item(user, action):
            return disabled, None
        source = user.get("_source", {})
        return disabled, _record(Grants, {name: source[name] for name in GRANT_FIELDS if name in source})

    def key_and_owner(self, key_id: str, tenant_id: str, user_id: str) -> tuple[ApiKeyRecord, UserRecord, TenantRecord]:
        """An API key, its user and its tenant in one real-time ``mget`` (each document with its own
        routing), for re-checking a key whose owner is known; NotFound when any is missing or the
        key belongs to someone else."""
        return calls.run(self.client, self.key_and_owner_reads(key_id, tenant_id, user_id))

    def key_and_owner_reads(
        self, key_id: str, tenant_id: str, user_id: str
    ) -> Reads[tuple[ApiKeyRecord, UserRecord, TenantRecord]]:
        """:meth:`key_and_owner` as a read, also for the event loop (:mod:`service.storage.calls`)."""
        docs = [
            {"_id": _key_doc(key_id), "routing": KEY_ROUTING},
            {"_id": _user_doc(tenant_id, user_id), "routing": tenant_id},
            {"_id": _tenant_doc(tenant_id), "routing": tenant_id},
        ]
        answer = yield Call("mget", {"index": self.alias, "body": {"docs": docs}}, "read an API key and its account")
        key_doc, user_doc, tenant_doc = answer["docs"]
        if not all(found_item(d, "read an API key and its account") for d in (key_doc, user_doc, tenant_doc)):
            raise NotFound(f"API key {key_id!r} of user {user_id!r} of tenant {tenant_id!r} not found")
        key = _record(ApiKeyRecord, key_doc["_source"])
        if (key.tenant_id, key.user_id) != (tenant_id, user_id):
            raise NotFound(f"API key {key_id!r} not found")
        return key, _record(UserRecord, user_doc["_source"]), _record(TenantRecord, tenant_doc["_source"])

    # ----------------------------------------------------------------- users

    def create_user(self, user: UserRecord) -> None:
        self._create(user.tenant_id, _user_doc(user.tenant_id, user.user_id), "user", user, f"user {user.user_id!r}")

    def user_exists(self, tenant_id: str, user_id: str) -> bool:
        try:
            self.get_user(tenant_id, user_id)
        except NotFound:
            return False
        return True

    def get_user(self, tenant_id: str, user_id: str) -> UserRecord:
        return self.get_user_versioned(tenant_id, user_id)[0]

    def get_user_versioned(self, tenant_id: str, user_id: str) -> tuple[UserRecord, int, int]:
        return self._get(_user_doc(tenant_id, user_id), tenant_id, UserRecord, f"user {user_id!r}")

    def replace_user(self, user: UserRecord, seq: tuple[int, int]) -> None:
        user.updated_at = utcnow()
        self._replace(
            user.tenant_id, _user_doc(user.tenant_id, user.user_id), "user", user, seq, f"user {user.user_id!r}"
        )

    def list_users(
        self, principal: Principal, *, size: int, after: str | None = None
    ) -> tuple[list[UserRecord], str | None]:
        """One page of the admin's tenant's users in (created_at, user_id) order, and the cursor
        of the next page (None at the end)."""
        return self._page(principal, "user", "user_id", principal.tenant_id, UserRecord, size, after)

    # ------------------------------------------------------------------ keys

    def create_key(self, key: ApiKeyRecord) -> None:
        self._create(key.tenant_id, _key_doc(key.key_id), "key", key, f"API key {key.key_id!r}")

    def get_key(self, key_id: str) -> ApiKeyRecord:
        return calls.run(self.client, self.key_reads(key_id))

    def key_reads(self, key_id: str) -> Reads[ApiKeyRecord]:
        """:meth:`get_key` as a read, also for the event loop (:mod:`service.storage.calls`): the
        worker thread's check and the loop's read a key the same way."""
        what = f"API key {key_id!r}"
        params = {"index": self.alias, "id": _key_doc(key_id), "routing": KEY_ROUTING}
        try:
            found = yield Call("get", params, f"read {what}", on_missing=f"no document {_key_doc(key_id)!r}")
        except NotFound as exc:
            raise NotFound(f"{what} not found") from exc
        return _record(ApiKeyRecord, found["_source"])

    def get_key_versioned(self, key_id: str) -> tuple[ApiKeyRecord, int, int]:
        return self._get(_key_doc(key_id), KEY_ROUTING, ApiKeyRecord, f"API key {key_id!r}")

    def replace_key(self, key: ApiKeyRecord, seq: tuple[int, int]) -> None:
        key.updated_at = utcnow()
        self._replace(key.tenant_id, _key_doc(key.key_id), "key", key, seq, f"API key {key.key_id!r}")

    def touch_keys(self, used: Mapping[str, datetime]) -> None:
        """Record the keys' last use, in one bulk request. Partial updates, no concurrency check:
        last writer wins, which is exactly what a last-used time wants, and it never clobbers a
        concurrent revoke. The one write that does not bump the accounts version: no credential
        check reads ``last_used_at``, and a bump per interval per key would make every process
        reload the tenant's credentials. A key deleted meanwhile is skipped; other item failures
        are logged (bookkeeping, never an error for the caller)."""
        lines: list[dict[str, Any]] = []
        for key_id, when in used.items():
            lines.append({"update": {"_id": _key_doc(key_id), "routing": KEY_ROUTING, "retry_on_conflict": 3}})
            lines.append({"doc": {"last_used_at": when.isoformat()}})
        if not lines:
            return
        with translate_errors("record API key use"):
            response = self.client.bulk(index=self.alias, body=lines, filter_path="errors,items.*.error,items.*._id")
        if response.get("errors"):
            failed = [
                (item.get("_id"), error.get("type"))
                for entry in response.get("items", [])
                for item in entry.values()
                if (error := item.get("error")) and error.get("type") != "document_missing_exception"
            ]
            if failed:
                log.warning("last_used_at not recorded for %d keys: %s", len(failed), failed[:5])

    def list_keys(
        self, principal: Principal, *, size: int, after: str | None = None
    ) -> tuple[list[ApiKeyRecord], str | None]:
        """One page of the admin's tenant's API keys in (created_at, key_id) order. Keys share one
        routing value (looked up by id alone), so the tenant term from the chokepoint does the
        isolation."""
        return self._page(principal, "key", "key_id", KEY_ROUTING, ApiKeyRecord, size, after)

    def _page(
        self,
        principal: Principal,
        kind: str,
        id_field: str,
        routing: str,
        model: type[R],
        size: int,
        after: str | None,
    ) -> tuple[list[R], str | None]:
        body: dict[str, Any] = {
            "size": size,
            "query": access.for_admin(principal).query({"term": {"kind": kind}}),
            "sort": [{"created_at": "asc"}, {id_field: "asc"}],
            "track_total_hits": False,
        }
        search_after = cursor.decode(after, arity=2, types=(int, str))
        if search_after is not None:
            body["search_after"] = search_after
        with translate_errors(f"list {kind}s"):
            hits = self.client.search(index=self.alias, body=body, routing=routing)["hits"]["hits"]
        records = [model.model_validate({k: v for k, v in h["_source"].items() if k != "kind"}) for h in hits]
        return records, (cursor.encode(hits[-1]["sort"]) if len(hits) == size else None)


def _record(model: type[R], source: dict[str, Any]) -> R:
    """A stored account document as its record (the ``kind`` discriminator is storage-only)."""
    return model.model_validate({k: v for k, v in source.items() if k != "kind"})
