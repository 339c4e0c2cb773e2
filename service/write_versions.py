"""Per-tenant write versions: one Redis counter per tenant, bumped after every belief write, with
the documents each version changed.

Anything derived from a tenant's beliefs and kept between requests (the recall vocabulary,
:mod:`service.recall.vocabulary`; the filter tiers, :mod:`service.recall.tier_cache`) records the
version it was built at. The bump comes *after* the write returned, and belief writes are visible
when they return (``wait_for``/``true`` refresh), so whoever reads the new version also reads the
new document; a reader that read the old version keeps a cache entry tagged with it, which the next
request after the bump replaces.

Each bump also appends ``<version>|<document ids as JSON>`` to the tenant's change log (a capped Redis
list, written by the same script as the counter, so a version is never visible without its entry):
a process whose vocabulary is a few versions old re-reads only those documents instead of the
whole tenant (:meth:`TenantWriteVersions.changes`). A write that cannot name its documents logs
``*``, and a log that no longer reaches back far enough (capped, expired, or lost with Redis) means
a full rebuild, never a wrong vocabulary. Since the vocabulary is one aggregation over units
stored at write time (issue 16), the recall vocabulary no longer reads this log (it rebuilds on a
new version); the log is still written, for now, and can be dropped.

Each tenant also has an **accounts version** (:class:`TenantAccountsVersions`), bumped around every
write to its account records (the tenant, its users, its API keys; ``AccountStore``): a credential
verified in-process is trusted only while it is unchanged (:mod:`service.auth.authenticator`). Both
versions are read in the one Redis round trip of a request, the rate limit's
(:func:`queue_versions`, :func:`parse_versions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import anyio.to_thread
import orjson
import redis
import redis.asyncio

from service import redis_keys
from service.errors import StoreUnavailable
from service.loops import LoopBound, on_loop

# Entries kept per tenant (a process more versions behind rebuilds), and for how long.
CHANGE_LOG_LENGTH = 256
CHANGE_LOG_TTL_S = 24 * 3600
# A write whose documents are unknown: whoever is behind it rebuilds.
EVERYTHING = "*"

# KEYS: counter, change log; ARGV: the changed document ids (comma-joined, or "*"), length, ttl.
_BUMP_SCRIPT = """
local version = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], version .. '|' .. ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return version
"""


@dataclass(frozen=True)
class Changes:
    """The documents written between two versions of a tenant; ``doc_ids`` None: unknown (some
    write did not name them, or the log does not reach back): rebuild."""

    since: int
    until: int
    doc_ids: frozenset[str] | None


class TenantWriteVersions:
    def __init__(
        self,
        client: redis.Redis[bytes],
        namespace: str,
        async_client: LoopBound[redis.asyncio.Redis[bytes]] | None = None,
    ):
        self.client = client
        self.namespace = namespace
        self.async_client = async_client
        self._bump = client.register_script(_BUMP_SCRIPT)

    def key(self, tenant_id: str) -> str:
        return redis_keys.tenant_write_version(self.namespace, tenant_id)

    def log_key(self, tenant_id: str) -> str:
        return redis_keys.tenant_change_log(self.namespace, tenant_id)

    def current(self, tenant_id: str) -> int:
        """The tenant's version (0 before its first write)."""
        try:
            raw = self.client.get(self.key(tenant_id))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while reading the tenant's write version") from exc
        return int(raw) if raw else 0

    def bump(self, written: Mapping[str, Iterable[str] | None]) -> None:
        """Mark the tenants as written, each with the documents the write changed (None: not
        known). Raises if Redis is down: the write itself succeeded and is idempotent, so the
        caller's retry is safe, while a silently missed bump would leave caches of the old version
        in use."""
        if not written:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for tenant_id in sorted(written):
                    doc_ids = written[tenant_id]
                    ids = sorted(set(doc_ids)) if doc_ids is not None else []
                    entry = orjson.dumps(ids).decode() if ids else EVERYTHING
                    self._bump(
                        keys=[self.key(tenant_id), self.log_key(tenant_id)],
                        args=[entry, CHANGE_LOG_LENGTH, CHANGE_LOG_TTL_S],
                        client=pipe,
                    )
                pipe.execute()
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while recording a belief write") from exc

    def changes(self, tenant_id: str, since: int, until: int) -> Changes:
        """What the versions after ``since`` up to ``until`` changed (one Redis read)."""
        try:
            raw = self.client.lrange(self.log_key(tenant_id), 0, -1)
        except redis.RedisError:
            return Changes(since, until, None)
        return parse_changes(raw, since, until)

    async def achanges(self, tenant_id: str, since: int, until: int) -> Changes:
        """:meth:`changes` through the event loop's client (on a worker thread without one)."""
        client = on_loop(self.async_client)
        if client is None:
            return await anyio.to_thread.run_sync(self.changes, tenant_id, since, until)
        try:
            raw = await client.lrange(self.log_key(tenant_id), 0, -1)
        except redis.RedisError:
            return Changes(since, until, None)
        return parse_changes(raw, since, until)


def parse_changes(entries: Iterable[bytes | str], since: int, until: int) -> Changes:
    """The union of the documents of versions ``since + 1 .. until``; unknown (None) when one of
    those versions is missing from ``entries`` or names no documents."""
    wanted = set(range(since + 1, until + 1))
    doc_ids: set[str] = set()
    for raw in entries:
        text = raw.decode() if isinstance(raw, bytes) else raw
        version_text, _, ids = text.partition("|")
        version = int(version_text) if version_text.isdigit() else -1
        if version not in wanted:
            continue
        if ids == EVERYTHING or not ids:
            return Changes(since, until, None)
        wanted.discard(version)
        doc_ids.update(str(i) for i in orjson.loads(ids))
    return Changes(since, until, frozenset(doc_ids) if not wanted else None)


@dataclass(frozen=True)
class TenantVersions:
    """A tenant's write version and accounts version as one request read them (None: Redis did
    not answer)."""

    write: int | None
    accounts: int | None


UNKNOWN = TenantVersions(None, None)


def queue_versions(
    pipe: redis.client.Pipeline[bytes] | redis.asyncio.client.Pipeline[bytes], namespace: str, tenant_id: str
) -> None:
    """Queue the reads of a tenant's write and accounts versions (in that order, the last two
    commands) on someone else's pipeline (the rate limit's), so the request's one Redis round trip
    carries them; :func:`parse_versions` reads the pipeline's results."""
    pipe.get(redis_keys.tenant_write_version(namespace, tenant_id))
    pipe.get(redis_keys.tenant_accounts_version(namespace, tenant_id))


def parse_versions(results: list[object]) -> TenantVersions:
    """The versions queued by :func:`queue_versions`, from the pipeline's results."""
    return TenantVersions(parse(results[-2]), parse(results[-1]))


def parse(raw: object) -> int:
    """A version as read from Redis (0 before the tenant's first write)."""
    return int(raw) if isinstance(raw, bytes | str | int) and raw else 0


class TenantAccountsVersions:
    """One Redis counter per tenant, bumped by ``AccountStore`` before and after every write of the
    tenant's account records. Before: a process that loaded the old records earlier re-loads them
    even if the bump after the write fails. After, once the write is visible (account writes
    refresh): whoever reads the new version also reads the new records. A bump that Redis refuses
    fails the request; the write is idempotent and its retry bumps again."""

    def __init__(self, client: redis.Redis[bytes], namespace: str):
        self.client = client
        self.namespace = namespace

    def key(self, tenant_id: str) -> str:
        return redis_keys.tenant_accounts_version(self.namespace, tenant_id)

    def current(self, tenant_id: str) -> int | None:
        """The tenant's accounts version (0 before its first account write); None when Redis
        cannot answer (callers then fall back to a time bound)."""
        try:
            raw = self.client.get(self.key(tenant_id))
        except redis.RedisError:
            return None
        return parse(raw)

    def bump(self, tenant_id: str) -> None:
        try:
            self.client.incr(self.key(tenant_id))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while recording an account change") from exc
