"""All OpenSearch access for conversation turns (``<namespace>-turns``).

A turn is written *before* its extraction task is enqueued (the index call returns once the
write is in the translog, i.e. durable; no refresh is waited for, so the proxy adds no refresh
latency), keyed
``<tenant>:<turn id>`` and routed by tenant, so a task carrying ``(tenant_id, turn_id)`` can only
ever read a turn of that tenant. Reads for callers take their filters from :mod:`access`; the
maintenance sweep uses :func:`access.maintenance_scan` and yields keys only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from opensearchpy import OpenSearch
from pydantic import BaseModel, ConfigDict, Field

from service.domain.accounts import Credential
from service.domain.belief import utcnow
from service.domain.principal import Principal
from service.errors import NotFound
from service.storage import access, cursor
from service.storage.client import translate_errors
from service.storage.keyed_records import KeyedRecords
from service.storage.templates import TURNS as TURNS  # re-exported: defined in the registry
from service.storage.unreadable import Loaded, RecordKind, load_record, load_records

ExtractionStatus = Literal["pending", "running", "done", "failed", "skipped"]


class TurnRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    turn_id: str
    owner_id: str
    projects: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    # The kind of credential the turn was authenticated with: extraction judges the author's
    # grants by that credential's rule (service.domain.accounts.author_at_extraction). None: a turn
    # recorded before turns carried it (template v2), extracted by the rule such turns always had.
    credential: Credential | None = None
    # Which one credential that was: the API key's id, or the token's jti (never a secret; None for
    # a token without one, or a turn recorded before turns carried it: template v3). Extraction
    # refuses the turn once that credential is revoked (service.auth.revocations).
    credential_id: str | None = None
    session_id: str
    scope: list[str] = Field(default_factory=list)
    source: Literal["proxy", "client"] = "proxy"
    model: str | None = None
    user_message: str = ""
    assistant_text: str = ""
    sidecar_raw: str | None = None
    parse_status: str = "missing"
    gate: str | None = None
    injected_ids: list[str] = Field(default_factory=list)
    extraction_status: ExtractionStatus = "pending"
    attempts: int = 0
    enqueued_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)

    def principal(self) -> Principal:
        """The author of the turn, with the grants recorded when the turn was authenticated."""
        return Principal(
            tenant_id=self.tenant_id,
            user_id=self.owner_id,
            projects=frozenset(self.projects),
            teams=frozenset(self.teams),
        )


TURN_RECORDS = RecordKind("turn", TurnRecord, "turn_id")
# The texts of a turn: what a listing leaves out (the listing's rows are the turn's state; the
# exchange itself is read one turn at a time). Each field has a default, so a row still loads.
HEAVY_FIELDS = ("user_message", "assistant_text", "sidecar_raw", "result")
# Newest first, then by id: created_at never changes, so a page boundary holds while turns are
# retried or finished between two pages (updated_at would move a retried turn past the cursor).
_ADMIN_SORT = [{"created_at": {"order": "desc"}}, {"turn_id": {"order": "desc"}}]


class TurnStore:
    def __init__(self, client: OpenSearch, namespace: str):
        self.client = client
        self.alias = TURNS.alias(namespace)
        self.records = KeyedRecords(client, self.alias, TURN_RECORDS, refresh="false")

    def create(self, turn: TurnRecord) -> None:
        """Durably record a new turn (readable by key at once). Conflict if the id exists."""
        self.records.create(turn, action="record a turn")

    def load(self, tenant_id: str, turn_id: str) -> tuple[TurnRecord, int, int]:
        """A turn by key, with its concurrency token. The key embeds the tenant."""
        loaded = self.records.load(tenant_id, turn_id, action="read a turn")
        if loaded is None:
            raise NotFound(f"turn {turn_id!r} not found")
        return loaded

    def save(self, turn: TurnRecord, *, seq_no: int, primary_term: int) -> None:
        """Optimistic update of a turn's extraction state."""
        turn.updated_at = utcnow()
        self.records.save(turn, seq_no=seq_no, primary_term=primary_term, action="update a turn")

    def get(self, principal: Principal, turn_id: str) -> TurnRecord:
        """A turn of the principal (real-time, by key: the key embeds the principal's tenant).
        Another user's turn is indistinguishable from a missing one, except for the tenant's
        admins."""
        turn, _, _ = self.load(access.routing(principal), turn_id)
        if turn.owner_id != principal.user_id and not principal.is_admin:
            raise NotFound(f"turn {turn_id!r} not found")
        return turn

    def outcome_counts(self, principal: Principal) -> list[tuple[str, int]]:
        """The tenant's turns by extraction status (admins; nothing for a member)."""
        filters = access.for_admin(principal)
        body = {
            "size": 0,
            "query": filters.query(),
            "aggs": {"status": {"terms": {"field": "extraction_status", "size": 10}}},
        }
        with translate_errors("count turns"):
            result = self.client.search(index=self.alias, body=body, routing=filters.routing)
        return [(str(b["key"]), int(b["doc_count"])) for b in result["aggregations"]["status"]["buckets"]]

    def page_for_admin(
        self,
        principal: Principal,
        *,
        status: ExtractionStatus,
        owner_id: str | None = None,
        size: int,
        after: str | None = None,
    ) -> tuple[Loaded[TurnRecord], str | None]:
        """One page of the tenant's turns in ``status`` (admins; nothing for a member), newest
        first, without their texts (:data:`HEAVY_FIELDS`). A turn that cannot be loaded is skipped
        (its id in the page's ``quarantined``); the cursor follows the last hit either way."""
        filters = access.for_admin(principal)
        narrowing: list[dict[str, Any]] = [{"term": {"extraction_status": status}}]
        if owner_id is not None:
            narrowing.append({"term": {"owner_id": owner_id}})
        body: dict[str, Any] = {
            "size": size,
            "query": filters.query(*narrowing),
            "sort": _ADMIN_SORT,
            "_source": {"excludes": list(HEAVY_FIELDS)},
            "track_total_hits": False,
        }
        search_after = cursor.decode(after, arity=2, types=(int, str))
        if search_after is not None:
            body["search_after"] = search_after
        with translate_errors("list turns"):
            hits = self.client.search(index=self.alias, body=body, routing=filters.routing)["hits"]["hits"]
        next_cursor = cursor.encode(hits[-1]["sort"]) if len(hits) == size else None
        return load_records(TURN_RECORDS, hits), next_cursor

    def stale_keys(
        self, *, older_than_s: int, running_older_than_s: int, max_attempts: int, limit: int = 200
    ) -> list[tuple[str, str]]:
        """Maintenance sweep: ``(tenant_id, turn_id)`` of turns whose extraction never finished
        and may be sent again: pending for ``older_than_s``, or running for
        ``running_older_than_s`` (a running turn may be in a live task until its hard time limit;
        sent again sooner, a second task would run it alongside and spend its attempts). A turn
        that cannot be loaded (quarantined) is left out: its extraction could only fail, and the
        sweep would send it again on every tick."""
        attempts_left = {"range": {"attempts": {"lt": max_attempts}}}
        return self._unfinished(older_than_s, running_older_than_s, attempts_left, limit, "sweep turns")

    def exhausted_keys(
        self, *, older_than_s: int, running_older_than_s: int, max_attempts: int, limit: int = 200
    ) -> list[tuple[str, str]]:
        """Unfinished turns, stale as for :meth:`stale_keys`, whose attempts are all spent: the
        sweep sends them no more, so it fails them (else they stay unfinished, with no error)."""
        spent = {"range": {"attempts": {"gte": max_attempts}}}
        return self._unfinished(older_than_s, running_older_than_s, spent, limit, "find turns out of attempts")

    def _unfinished(
        self, older_than_s: int, running_older_than_s: int, attempts: dict[str, Any], limit: int, action: str
    ) -> list[tuple[str, str]]:
        def untouched(status: str, seconds: int) -> dict[str, Any]:
            cutoff = (utcnow() - timedelta(seconds=seconds)).isoformat()
            in_status = {"term": {"extraction_status": status}}
            return {"bool": {"filter": [in_status, {"range": {"updated_at": {"lt": cutoff}}}]}}

        body = {
            "size": limit,
            "query": access.maintenance_scan("extraction sweep").query(
                {
                    "bool": {
                        "should": [untouched("pending", older_than_s), untouched("running", running_older_than_s)],
                        "minimum_should_match": 1,
                    }
                },
                attempts,
            ),
            "sort": [{"created_at": "asc"}],
        }
        with translate_errors(action):
            rows = self.client.search(index=self.alias, body=body)["hits"]["hits"]
        turns = (load_record(TURN_RECORDS, r.get("_source"), hit_id=r.get("_id")) for r in rows)
        return [(t.tenant_id, t.turn_id) for t in turns if t is not None]
