"""Per-tenant write versions: one Redis counter per tenant, bumped after every belief write.

Anything derived from a tenant's beliefs and kept between requests (the recall vocabulary,
:mod:`service.recall.vocabulary`; the recall tiers, :mod:`service.recall.tier_cache`) records the
version it was built at; so do the analyses of recent messages
(:mod:`service.recall.analysis_cache`), which a new version drops although they do not depend on
the beliefs, so that a message's words leave memory with the tenant's next write. The bump comes
*after* the write returned, and belief writes are visible when they return (``wait_for``/``true``
refresh), so whoever reads the new version also reads the new document; a reader that read the
old version keeps a cache entry tagged with it, which the next request after the bump replaces. A
new version means a rebuild (the vocabulary is one search over units stored at write time),
so only the counter is kept: which documents a version changed is not recorded.

Each tenant also has an **accounts version** (:class:`TenantAccountsVersions`), bumped around every
write to its account records (the tenant, its users, its API keys; ``AccountStore``): a credential
verified in-process is trusted only while it is unchanged (:mod:`service.auth.authenticator`). Both
versions are read in the one Redis round trip of a request, the rate limit's
(:func:`queue_versions`, :func:`parse_versions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import redis
import redis.asyncio

from service import redis_keys
from service.errors import StoreUnavailable
from service.lean_redis import LeanPipeline


class TenantWriteVersions:
    def __init__(
        self,
        client: redis.Redis[bytes],
        namespace: str,
        *,
        on_bump: Callable[[Sequence[str]], None] | None = None,
    ):
        self.client = client
        self.namespace = namespace
        # told the tenants of every bump that Redis accepted (a worker's vocabulary prebuild:
        # service/recall/prebuild.py)
        self.on_bump = on_bump

    def key(self, tenant_id: str) -> str:
        return redis_keys.tenant_write_version(self.namespace, tenant_id)

    def current(self, tenant_id: str) -> int:
        """The tenant's version (0 before its first write)."""
        try:
            raw = self.client.get(self.key(tenant_id))
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while reading the tenant's write version") from exc
        return int(raw) if raw else 0

    def bump(self, tenant_ids: Iterable[str]) -> None:
        """Mark the tenants as written (one round trip). Raises if Redis is down: the write itself
        succeeded and is idempotent, so the caller's retry is safe, while a silently missed bump
        would leave caches of the old version in use."""
        tenants = sorted(set(tenant_ids))
        if not tenants:
            return
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for tenant_id in tenants:
                    pipe.incr(self.key(tenant_id))
                pipe.execute()
        except redis.RedisError as exc:
            raise StoreUnavailable("Redis is unreachable while recording a belief write") from exc
        if self.on_bump is not None:
            self.on_bump(tenants)


@dataclass(frozen=True)
class TenantVersions:
    """A tenant's write version and accounts version as one request read them (None: Redis did
    not answer)."""

    write: int | None
    accounts: int | None


UNKNOWN = TenantVersions(None, None)


def queue_versions(
    pipe: redis.client.Pipeline[bytes] | redis.asyncio.client.Pipeline[bytes] | LeanPipeline,
    namespace: str,
    tenant_id: str,
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
