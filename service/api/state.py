"""The objects the app lifespan builds once and every request shares."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opensearchpy import AsyncOpenSearch, OpenSearch
from redis import Redis

from service.auth.authenticator import Authenticator
from service.auth.guard import AuthGuard
from service.auth.ratelimit import RateLimiter
from service.auth.tokens import TokenVerifier
from service.beliefs.api_service import BeliefService
from service.beliefs.lifecycle import BeliefLifecycle
from service.beliefs.waiting_records import redact_outboxes
from service.config import Settings
from service.errors import StoreUnavailable, TenureError
from service.extraction.merge import REFRESH as LOOP_REFRESH
from service.extraction.reviews import ReviewService
from service.lean_redis import EventLoopRedis
from service.loops import LoopBound
from service.provisioning.service import ProvisioningService
from service.proxy.service import MemoryLoop
from service.recall.audit_trail import AuditTrail
from service.recall.cache import RenderCache
from service.recall.prebuild import prebuild_enabled
from service.recall.receipts import ReceiptOutbox
from service.recall.service import RecallService
from service.recall.stack import context_builder, recall_store
from service.storage.accounts import AccountStore
from service.storage.audit import AuditStore
from service.storage.beliefs import BeliefStore
from service.storage.client import close_async_client, translate_errors
from service.storage.local_analysis import LocalAnalysis
from service.storage.templates import FAMILIES, apply_templates
from service.telemetry.cache_metrics import CacheSource
from service.write_versions import TenantAccountsVersions, TenantWriteVersions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AsyncClients:
    """The event loop's clients (created and closed by the app lifespan, on the server's loop):
    recall in the API and the proxy runs through them without a thread-pool hop."""

    opensearch: LoopBound[AsyncOpenSearch]
    redis: LoopBound[EventLoopRedis]

    @classmethod
    def here(cls, opensearch: AsyncOpenSearch, redis: EventLoopRedis) -> AsyncClients:
        return cls(LoopBound.here(opensearch), LoopBound.here(redis))

    async def aclose(self) -> None:
        await close_async_client(self.opensearch.client)
        await self.redis.client.aclose()  # type: ignore[union-attr]  # redis>=5 (the stubs are 4.x)


@dataclass
class Services:
    settings: Settings
    opensearch: OpenSearch
    redis: Redis[bytes]
    store: BeliefStore
    audit: AuditStore
    accounts: AccountStore
    verifier: TokenVerifier
    authenticator: Authenticator
    limiter: RateLimiter
    guard: AuthGuard
    beliefs: BeliefService
    recall: RecallService
    provisioning: ProvisioningService
    render_cache: RenderCache
    receipts: ReceiptOutbox
    reviews: ReviewService
    loop: MemoryLoop  # the memory loop: proxy, turn recording, review store, task queue

    @classmethod
    def build(
        cls,
        settings: Settings,
        client: OpenSearch,
        redis_client: Redis[bytes],
        async_clients: AsyncClients | None = None,
        local_analysis: LocalAnalysis | None = None,
    ) -> Services:
        """``async_clients``: without them the async paths (recall, the rate limit) run their
        synchronous twins on a worker thread (scripts, benchmarks that build Services directly).
        ``local_analysis``: recall queries analysed in this process (service/storage/local_analysis.py)."""
        aredis = async_clients.redis if async_clients is not None else None
        ns = settings.opensearch_namespace
        versions = TenantWriteVersions(redis_client, ns)
        store = recall_store(client, ns, settings.recall, versions, local_analysis)
        audit = AuditStore(client, ns)
        accounts = AccountStore(client, ns, TenantAccountsVersions(redis_client, ns))
        verifier = TokenVerifier(settings.auth)
        aopensearch = async_clients.opensearch if async_clients is not None else None
        authenticator = Authenticator(settings.auth, accounts, verifier, redis_client, ns, aopensearch)
        render_cache = RenderCache(redis_client, ns)
        receipts = ReceiptOutbox.from_settings(settings, redis_client, audit, aredis)
        # where an event of a change already stored waits should the audit index refuse it
        audit_outbox = receipts.outbox if receipts.enabled else None
        loop = MemoryLoop(settings, client, redis_client, aredis)
        limiter = RateLimiter(
            redis_client,
            ns,
            per_s=settings.api.rate_limit_per_s,
            burst=settings.api.rate_limit_burst,
            tenant_per_s=settings.api.tenant_rate_limit_per_s,
            tenant_burst=settings.api.tenant_rate_limit_burst,
            async_redis=aredis,
        )
        versions.on_bump = _on_bump(limiter, loop if prebuild_enabled(settings.recall) else None)
        return cls(
            settings=settings,
            opensearch=client,
            redis=redis_client,
            store=store,
            audit=audit,
            accounts=accounts,
            verifier=verifier,
            authenticator=authenticator,
            limiter=limiter,
            guard=AuthGuard(
                authenticator,
                redis_client,
                ns,
                per_s=settings.api.failed_auth_per_s,
                burst=settings.api.failed_auth_burst,
                negative_cache_s=settings.api.failed_auth_cache_s,
            ),
            beliefs=BeliefService(
                BeliefLifecycle(
                    store,
                    audit,
                    refresh=settings.api.write_refresh,
                    render_cache=render_cache,
                    drain_receipts=AuditTrail(audit, receipts).drain_before_erase,
                    redact_outboxes=functools.partial(redact_outboxes, [receipts.outbox, loop.parked.outbox]),
                    audit_outbox=audit_outbox,
                ),
                max_import=settings.api.max_import_records,
                user_exists=accounts.user_exists,
            ),
            recall=RecallService(context_builder(store, settings.recall), receipts, aopensearch),
            provisioning=ProvisioningService(
                accounts, audit, verifier, authenticator, settings.auth, audit_outbox, retention=settings.retention
            ),
            render_cache=render_cache,
            receipts=receipts,
            # admins resolve review items with the memory loop's write policy (visible at once)
            reviews=ReviewService(BeliefLifecycle(store, audit, refresh=LOOP_REFRESH), loop.reviews, settings.loop),
            loop=loop,
        )

    async def aclose(self) -> None:
        """Close what the services opened themselves (the upstream HTTP client, the broker
        connection); the OpenSearch and Redis clients belong to whoever passed them in."""
        await self.loop.aclose()

    def cache_sources(self) -> dict[str, CacheSource]:
        """The recall caches of this process by the name their metrics carry
        (service/telemetry/cache_metrics.py): decoded beliefs, and those that are on."""
        builder = self.recall.builder
        sources: dict[str, CacheSource] = {"decoded_beliefs": self.store.decoded.counts}
        if builder.tier_cache is not None:
            sources["tiers"] = builder.tier_cache.counts
            sources["message_tiers"] = builder.tier_cache.messages.counts
        if builder.matcher is not None:
            sources["vocabularies"] = builder.matcher.cache.counts
            if builder.matcher.analyses is not None:
                sources["message_analyses"] = builder.matcher.analyses.counts
        return sources


def _on_bump(limiter: RateLimiter, loop: MemoryLoop | None) -> Callable[[Sequence[str]], None]:
    """What a write of this process tells the others in it: the limiter forgets the tenants'
    write versions (no recall starts ahead at a version this process knows is old), and with
    prebuilding on, a worker builds what the write changed."""

    def bumped(tenants: Sequence[str]) -> None:
        limiter.forget_write_versions(tenants)
        if loop is not None:
            loop.queue.prebuild_vocabularies(tenants)

    return bumped


def ensure_indices(services: Services) -> bool:
    """Apply templates and aliases; False (not raised) when OpenSearch is down, so the process
    still starts, /healthz answers and /readyz reports the store as unreachable."""
    try:
        with translate_errors("apply index templates"):
            apply_templates(services.opensearch, services.settings.opensearch_namespace, FAMILIES)
    except StoreUnavailable as exc:
        log.warning("index templates not applied yet: %s", exc.message)
        return False
    except TenureError as exc:  # refused (an index squatting on an alias's name): not ready, said why
        log.error("index templates refused by the store, the API is not ready: %s", exc.message)
        return False
    services.store.vocabulary.prepare_local_analysis()
    return True
