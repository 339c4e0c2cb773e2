"""One typed settings object for the whole service (API, workers, evals, benchmarks).

Read from the environment with the ``TENURE_`` prefix (and an optional ``.env``). Build it once with
:func:`get_settings`; tests construct their own :class:`Settings` instead of patching globals.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class RecallDefaults(BaseSettings):
    """Budget and thresholds of the context builder (paper §5.2 defaults)."""

    model_config = SettingsConfigDict(env_prefix="TENURE_RECALL_", extra="ignore")

    max_beliefs: int = Field(20, ge=0, le=200)
    max_pinned_facts: int = Field(10, ge=0, le=100)
    max_questions: int = Field(15, ge=0, le=100)
    max_chars_per_belief: int = Field(400, ge=40, le=10_000)
    max_persona_chars: int = Field(800, ge=0, le=10_000)
    # A single whole-alias hit (boost 5) clears it, partial/weak evidence does not (paper: minScore 3).
    min_score: float = Field(3.0, ge=0.0)
    max_query_chars: int = Field(1000, ge=16, le=20_000)
    # Relevance from the tenant's own vocabulary, sent as exact weighted terms (same results as
    # the Lucene fuzzy/shingle query, fuzzy candidates from the caller's tenant only: issue 16,
    # docs/scoring-independence.md). Off: the Lucene query expands over the whole shard.
    vocabulary_matching: bool = True
    # The per-process LRU of tenant vocabularies: how many tenants and how much memory (estimated).
    # Measured (docs/benchmarks.md, issue 16): ~164 KB estimated per tenant of 1,000 beliefs (~6,100
    # terms: the terms, the matching pre-filter and 8 bytes a term of order keys), so 256 MB holds
    # ~1,600 tenants of 1,000 beliefs (every tenant of the 1M benchmark).
    vocabulary_cache_tenants: int = Field(2500, ge=0, le=1_000_000)
    vocabulary_cache_mb: int = Field(256, ge=0, le=65_536)
    # Built vocabularies shared between processes through Redis (service/recall/shared_vocabulary.py):
    # a tenant is built once per write version for every API worker, replica and restart, the
    # others load it. An entry lives this long after it was stored (an idle tenant's leaves Redis);
    # ~40 KB compressed per tenant of 1,000 beliefs (docs/operations.md "Recall caches"). 0: off.
    vocabulary_shared_ttl_s: float = Field(21_600.0, ge=0.0, le=30 * 86_400.0)
    # Workers build a tenant's vocabulary right after a belief write (after their own tasks, and on
    # a `vocabulary.prebuild` task the API sends after its writes) and store it in the shared entry
    # above (service/recall/prebuild.py), so the tenant's next recall in every API process restores
    # it (~5 ms at 1,000 beliefs) instead of the first one building it (~30-65 ms). Needs
    # vocabulary_matching and vocabulary_shared_ttl_s > 0.
    vocabulary_prebuild: bool = True
    # Each API process listens for the vocabularies stored in Redis (the prebuilds above, other
    # processes' builds) and restores those of the tenants it holds at an older version before
    # their next recall asks (service/recall/vocabulary_warmer.py): the first recall after a
    # write then skips the restore (~2 ms at 1,000 beliefs). Needs vocabulary_shared_ttl_s > 0.
    vocabulary_refresh: bool = True
    # With vocabulary_refresh: after a tenant write, each API process also searches again the
    # filter tiers (persona, pinned, questions) of the tenant's recalls it served in the last this
    # many seconds (at most 4 per tenant), so the next recall of the same caller finds them in the
    # tier cache below (service/recall/tier_cache.py). Costs one OpenSearch search per such caller
    # per write and process. 0: off.
    tier_refresh_within_s: float = Field(60.0, ge=0.0, le=3600.0)
    # The filter tiers (persona, pinned, questions) of recent recalls, kept per API process and
    # reused until the tenant writes (service/recall/tier_cache.py); 0 entries turns it off. The
    # age bounds how long an entry can live if Redis lost its version counters. Only keys used
    # within the age can hit, so entries beyond recalls/s x age buy nothing: 16,384 holds every
    # distinct (tenant, user, grants, scope list) of a minute at ~270 recalls/s per process. The
    # memory bound is an estimate that counts each entry's beliefs as its own (~10 KB an entry of
    # ~1.8 beliefs on the benchmark corpus; ~0.6 KB actually added while the decode cache shares
    # them): 96 MB holds ~9,800 such entries at most; dense tenants hit it sooner (1M beliefs over
    # 1,000 tenants: ~42 KB estimated an entry, ~2,400 entries, where 1,000 sessions at once in one
    # process kept 97 % of their filter tiers once the per-message entries had their own budget
    # below; 85 % when both shared 128 MB, 54 % at 64). docs/operations.md "Recall caches".
    tier_cache_entries: int = Field(16_384, ge=0, le=1_000_000)
    tier_cache_mb: int = Field(96, ge=0, le=65_536)
    # The relevant tier of a message and the relation hop's read, kept beside the filter tiers
    # under this byte bound of their own (same entry count and age): they hit only when a message
    # comes again (agent loops, retries), so in the filter tiers' budget they would push out the
    # entries every recall of a session looks up. 0: not kept (service/recall/tier_cache.py).
    message_tier_cache_mb: int = Field(32, ge=0, le=65_536)
    tier_cache_max_age_s: float = Field(60.0, ge=0.0, le=86_400.0)
    # Each message's analysis by the index's search analyzers (one _mtermvectors round trip), kept
    # per API process, tenant, analyzers and text until the tenant writes
    # (service/recall/analysis_cache.py), so a repeated message (agent loops, retries) is not
    # analysed again; with the tier cache's relevant entries such a repeat sends nothing to
    # OpenSearch. 0 entries turns it off. An entry holds a message's tokens (words and shingles of
    # the analyses), estimated at ~0.6 KB a word (measured with tracemalloc: ~0.4 KB): ~7.5 KB for
    # 12 words, ~59 KB for 100 words (~1,000 characters, the cleaned query's default cap). 16 MB
    # holds ~2,200 messages of 12 words, ~280 of 1,000 characters; a repeat hits only within the
    # age, so the recent messages are the ones that count. The age also bounds how long a message's
    # words stay in memory when the tenant does not write (every belief write or erase of the
    # tenant drops its entries). docs/operations.md "Recall caches".
    # Stored belief documents decoded once per process and document version (recall's hits,
    # service/storage/unreadable.py), by count: ~1.6 KB a belief of the benchmark corpus beyond its
    # text (docs/operations.md "Recall caches"). 0: every hit is decoded afresh (~17 µs each).
    decode_cache_entries: int = Field(10_000, ge=0, le=10_000_000)
    analysis_cache_entries: int = Field(16_384, ge=0, le=1_000_000)
    analysis_cache_mb: int = Field(16, ge=0, le=65_536)
    analysis_cache_max_age_s: float = Field(60.0, ge=0.0, le=86_400.0)
    # The API analyses a recall query itself, with the node's own analysis code (OpenSearch's
    # analysis module and plugins in a JVM in the API process, through JPype), instead of one
    # _mtermvectors round trip per recall: ~0.6 ms less node CPU and ~0.65 ms less wall time a
    # recall. Used for an index only after its analyzers gave the node's exact tokens on probe texts
    # in every script, with the node's OpenSearch and Lucene versions; else (or without JPype or the
    # jars) the node analyses. service/storage/local_analysis.py, docs/architecture.md.
    local_analysis: bool = True
    # The JVM's classpath (os.pathsep-separated): the node's jars and the compiled QueryAnalysis
    # class. Empty: deploy/opensearch/lib/* and deploy/opensearch/classes (scripts/setup.sh builds them).
    analysis_classpath: str = ""


class AuthSettings(BaseSettings):
    """Credential verification (service/auth). Production: RS256/ES256 against a JWKS; development:
    HS256 with a shared secret. API keys are HMAC-hashed with ``api_key_pepper``."""

    model_config = SettingsConfigDict(env_prefix="TENURE_AUTH_", extra="ignore")

    jwt_issuer: str = "tenure"
    jwt_audience: str = "tenure-api"
    # Only these algorithms are ever accepted; "none" can never be configured in.
    jwt_algorithms: list[str] = Field(default_factory=lambda: ["RS256", "ES256"])
    jwks_url: str | None = None
    jwks_file: str | None = None
    jwks_cache_s: int = Field(300, ge=0, le=86_400)
    # Development only: enables HS256 tokens (and the dev-token endpoint) when set.
    jwt_hs256_secret: SecretStr | None = None
    jwt_leeway_s: int = Field(30, ge=0, le=600)
    dev_token_ttl_s: int = Field(3600, ge=60, le=30 * 86_400)
    api_key_pepper: SecretStr = SecretStr("tenure-dev-pepper-change-me")
    # Verified credentials (API keys, and a JWT subject's disabled status) are cached per process
    # (service/auth/authenticator.py) and trusted while their tenant's accounts version, read in the
    # request's one Redis round trip, is unchanged: every account change bumps it, so revocation
    # takes effect at once everywhere. An LRU of credential_cache_entries keys (and as many
    # subjects; 0 turns the cache off), each re-loaded after credential_cache_max_age_s at the latest
    # (a safety net should Redis lose its counters). When Redis cannot answer, an entry is trusted
    # for api_key_cache_s only (0: not at all): the revocation bound during a Redis outage.
    credential_cache_entries: int = Field(10_000, ge=0, le=10_000_000)
    credential_cache_max_age_s: float = Field(300.0, ge=0.0, le=86_400.0)
    api_key_cache_s: float = Field(5.0, ge=0.0, le=60.0)
    # An API key met for the first time in a process is verified on the event loop (two awaited
    # OpenSearch reads, no worker thread) when its tenant's accounts version was read here before;
    # anything short of success goes to the worker thread's check (service/auth/authenticator.py).
    verify_keys_on_loop: bool = True
    # last_used_at is written at most this often per key: each process asks at most once per
    # interval per key, and one Redis SET NX elects the one process that writes.
    last_used_interval_s: int = Field(60, ge=1, le=86_400)
    # ... and the asks of this window are recorded together: one Redis pipeline, one bulk update
    # (service/auth/last_used.py).
    last_used_flush_s: float = Field(1.0, ge=0.0, le=60.0)


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TENURE_API_", extra="ignore")

    max_body_bytes: int = Field(1_000_000, ge=1024, le=100_000_000)
    # Slow clients (service/api/http_protocol.py): a request's headers must arrive within
    # request_head_timeout_s of its first byte, and its body within request_body_timeout_s of its
    # headers (time the server itself is not reading does not count), or it is answered 408 and
    # its connection closed; a connection that sends nothing is closed after the keep-alive
    # timeout. Raise the body's with max_body_bytes for clients on slow links (120 s for 1 MB is
    # ~8.5 kB/s).
    request_head_timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    request_body_timeout_s: float = Field(120.0, gt=0.0, le=86_400.0)
    # Requests one connection serves before its answer closes it (``connection: close``; 0: no
    # limit), as nginx's keepalive_requests. Clients reuse their most recently used idle
    # connection first (httpx, the SDK, Go's pool in Caddy), so a few connections carry most
    # requests, each held by the worker process that accepted it: one worker can run hot while
    # the other idles. A connection closed after N requests is replaced by a new one, which the
    # kernel hands to whichever worker accepts first (docs/operations.md, "Requests per connection").
    max_requests_per_connection: int = Field(1000, ge=0, le=10_000_000)
    # Threads that run the synchronous parts of requests (anyio's limiter, 40 by default). The
    # OpenSearch connection pool is sized to match (service/storage/client.py): a smaller pool
    # makes threads wait for a connection or open and discard extra ones on every burst.
    thread_pool_size: int = Field(40, ge=1, le=1000)
    max_import_records: int = Field(5000, ge=1, le=100_000)
    retry_after_s: int = Field(5, ge=1, le=600)
    # Refresh policy of API writes: "wait_for" (default) makes a write visible to the next read
    # without forcing a refresh; "true" forces one (tests, tiny deployments).
    write_refresh: Literal["true", "wait_for"] = "wait_for"
    # Per-credential token bucket (API key, or JWT tenant+subject): sustained requests per second
    # and burst size. 0 requests/second turns the limiter off (the request's one Redis round trip
    # then only reads the tenant's write version for recall's cache).
    rate_limit_per_s: float = Field(20.0, ge=0.0, le=100_000.0)
    rate_limit_burst: int = Field(60, ge=1, le=1_000_000)
    # Every request also draws from its tenant's bucket, so more keys do not buy more requests
    # (0 leaves the tenant bucket out).
    tenant_rate_limit_per_s: float = Field(200.0, ge=0.0, le=1_000_000.0)
    tenant_rate_limit_burst: int = Field(600, ge=1, le=10_000_000)
    # Failed authentications per client address and per API key id (service/auth/guard.py): the
    # bucket's refill rate and size (0/s turns the limit off), and how long a credential that can
    # never become valid is remembered in-process (no key lookup while it is; 0 turns it off).
    failed_auth_per_s: float = Field(1.0, ge=0.0, le=100_000.0)
    failed_auth_burst: int = Field(20, ge=1, le=1_000_000)
    failed_auth_cache_s: float = Field(60.0, ge=0.0, le=3600.0)
    # Injection receipts go through a Redis stream and are moved to the audit index in bulk
    # (service/recall/receipts.py): no fsync on the recall path. False writes each one directly.
    receipt_outbox: bool = True
    # POST /v1/recall served without FastAPI's routing and dependency resolution when its body is
    # plain, valid JSON (service/api/recall_lane.py; ~0.15 ms of CPU per recall). False: the route.
    recall_lane: bool = True
    # The lane's recall starts beside the rate limit's Redis round trip, at the tenant's last
    # known write version, and is used only if that round trip confirms it
    # (service/api/recall_ahead.py; ~0.2 ms of latency per recall). False: after the round trip.
    recall_ahead: bool = True
    # Undrained receipts beyond this (the drainer is down) are written directly again.
    receipt_outbox_max_pending: int = Field(100_000, ge=1, le=10_000_000)
    receipt_drain_interval_s: float = Field(1.0, ge=0.1, le=3600.0)
    # Browser origins allowed to call the API and the proxy (CORS), e.g. ["https://chat.example"];
    # "*" allows any origin (credentials are bearer headers, never cookies, so none are allowed).
    cors_origins: list[str] = Field(default_factory=list)
    # Admin console (/console): a sign-in opens a server-side session (Redis) that ends after this
    # many idle seconds, and at the latest after console_session_max_s, whatever the activity.
    console_session_idle_s: int = Field(1800, ge=60, le=86_400)
    console_session_max_s: int = Field(8 * 3600, ge=60, le=7 * 86_400)


class ModelFamily(BaseModel):
    """One model family of the model gate (paper §4.3): detect regex, version floor, grade."""

    model_config = ConfigDict(populate_by_name=True)

    name: str
    detect: str
    floor: str | None = None  # "4.5"; None means every version of the family is verified
    # the paper's "tier" of the family (1 or 2; informational, shown in model_not_supported details)
    grade: int = Field(2, validation_alias=AliasChoices("grade", "tier"))


def _paper_model_families() -> list[ModelFamily]:
    return [
        ModelFamily(name="claude", detect=r"^claude-", floor="4.5", grade=2),
        ModelFamily(name="bedrock-claude", detect=r"^(?:us\.|eu\.|ap\.)?anthropic\.claude", floor="4.5", grade=2),
        ModelFamily(name="bedrock-nova-pro", detect=r"^(?:us\.|eu\.|ap\.)?amazon\.nova-pro", grade=2),
        ModelFamily(name="gpt", detect=r"^gpt-", floor="4.4", grade=2),
        ModelFamily(name="openai-o-series", detect=r"^o[3-9]", grade=1),
    ]


class TenantLoopOverride(BaseModel):
    """Per-tenant switches of the memory loop; unset fields fall back to the global values."""

    model_config = ConfigDict(populate_by_name=True)

    extraction_enabled: bool | None = None
    # True: the proxy refuses models below their floor. "strict_model_tiers" is the old key.
    strict_model_gate: bool | None = Field(
        None, validation_alias=AliasChoices("strict_model_gate", "strict_model_tiers")
    )
    upstream_base_url: str | None = None
    upstream_api_key: SecretStr | None = None
    anthropic_upstream_base_url: str | None = None
    anthropic_upstream_api_key: SecretStr | None = None


# Settings renamed so that "tier" means only the recall tiers; the old names are still read.
# field -> its old name. Read from the environment (TENURE_LOOP_<OLD>) and from nested input
# (TENURE_LOOP__<OLD>, a TENURE_LOOP JSON object, keyword arguments); the new name wins if both are set.
RENAMED_LOOP_SETTINGS: dict[str, str] = {
    "model_families": "tier_families",
    "strict_model_gate": "strict_model_tiers",
}


class MemoryLoopSettings(BaseSettings):
    """Proxy, extraction, merge policy and compaction (paper §4-§6 defaults)."""

    model_config = SettingsConfigDict(env_prefix="TENURE_LOOP_", extra="ignore", populate_by_name=True)

    upstream_base_url: str | None = None  # OpenAI-compatible, e.g. https://api.openai.com/v1
    upstream_api_key: SecretStr | None = None
    upstream_timeout_s: float = Field(120.0, gt=0)
    upstream_connect_timeout_s: float = Field(5.0, gt=0)
    # A whole (non-streamed) answer, from sending the request to its last byte (its status, or
    # an error's message, included): upstream_timeout_s applies to each read, so an upstream
    # trickling its answer a byte at a time held the client's request and both connections for
    # as long as it liked. Long, because real answers legitimately take long: a non-streamed
    # answer comes once the model has written all of it, and gateways that keep the connection
    # open with whitespace while it does send their first bytes at once. A hard bound (the wait
    # for the status line or the next piece ends there too: asyncio.timeout). Past it: 504
    # upstream_timeout, the connection closed, no turn recorded (docs/memory-loop.md "Upstream").
    upstream_answer_timeout_s: float = Field(300.0, gt=0, le=3600)
    # A streamed answer, all of it. Streams legitimately run long (the client sees the answer as
    # it is written), and upstream_timeout_s ends one that falls silent; but keep-alive comments,
    # blank lines, ping events or text trickled within the size bounds never trip a per-read
    # timeout, so an upstream could hold a stream (the client's request, an API task, a pooled
    # connection) for ever. An hour: past any real answer (128k output tokens at ~60 a second is
    # ~35 minutes). Checked as the stream's pieces arrive. Past it: the stream's in-stream error
    # event (upstream_timeout), the connection closed, no turn recorded.
    upstream_stream_timeout_s: float = Field(3600.0, gt=0, le=86400)
    # What the proxy holds of one upstream answer, so a misbehaving upstream cannot fill the API's
    # memory: a whole (non-streamed) body, and a stream's text (kept whole for the turn record);
    # one server-sent event (an unterminated line counts); what a stream relay holds back unshown
    # (a possible marker's prefix and the whitespace before it, the sidecar, the trailing events).
    # Past any of them: 502 upstream_answer_too_large (a stream: its in-stream error event), the
    # upstream connection closed, no turn recorded (docs/memory-loop.md "Upstream").
    upstream_max_body_bytes: int = Field(16 * 1024 * 1024, ge=65_536)
    upstream_max_event_bytes: int = Field(1024 * 1024, ge=4096)
    upstream_max_held_chars: int = Field(1024 * 1024, ge=65_536)
    # POST /v1/messages goes to an Anthropic-compatible upstream, e.g. https://api.anthropic.com/v1
    # (sent as x-api-key; the caller's anthropic-version header is forwarded, else this one)
    anthropic_upstream_base_url: str | None = None
    anthropic_upstream_api_key: SecretStr | None = None
    anthropic_version: str = Field("2023-06-01", min_length=1, max_length=40)
    extraction_enabled: bool = True
    # GET /v1/models answers with the upstream's list; these ids when the upstream has none
    # (or cannot be reached), so OpenAI-compatible tools that list models first still start
    models: list[str] = Field(default_factory=list)
    # The proxy serves a model below its family's version floor without extraction
    # (x-tenure-warning); strict (here, or per tenant in `tenants`) refuses it with 422
    # model_not_supported instead. POST /v1/turns, which exists only for extraction, always
    # refuses such a model. Old names (still read): TENURE_LOOP_STRICT_MODEL_TIERS, TENURE_LOOP_TIER_FAMILIES.
    strict_model_gate: bool = Field(
        False, validation_alias=AliasChoices("TENURE_LOOP_STRICT_MODEL_GATE", "TENURE_LOOP_STRICT_MODEL_TIERS")
    )
    model_families: list[ModelFamily] = Field(
        default_factory=_paper_model_families,
        validation_alias=AliasChoices("TENURE_LOOP_MODEL_FAMILIES", "TENURE_LOOP_TIER_FAMILIES"),
    )
    tenants: dict[str, TenantLoopOverride] = Field(default_factory=dict)
    # merge policy (BeliefMerger defaults)
    min_insert_confidence: float = Field(0.35, ge=0.0, le=1.0)
    conflict_confidence_margin: float = Field(0.15, ge=0.0, le=1.0)
    inferred_promotion_count: int = Field(5, ge=1)
    inferred_promotion_age_s: int = Field(48 * 3600, ge=0)
    # flywheel: a medium-confidence alias candidate seen in this many distinct turns is applied
    alias_candidate_min_sightings: int = Field(2, ge=1)
    # sidecar limits
    sidecar_max_chars: int = Field(32_000, ge=1000)
    # turn records
    max_turn_message_chars: int = Field(200_000, ge=1000)
    # compaction (paper §5.1)
    compaction_llm_base_url: str | None = None
    compaction_llm_api_key: SecretStr | None = None
    compaction_llm_model: str | None = None
    # The whole compaction model call (sending, the model's time, its answer), not each read: a
    # provider trickling its answer never trips a per-read timeout. At most a third of
    # TENURE_CELERY_HEAVY_SOFT_TIME_LIMIT_S is used (a read waiting at the deadline ends at its own
    # timeout, the same length), so the call ends before the task's soft limit, with time left for
    # the merges. Its answer is read up to upstream_max_body_bytes (decoded). Past either: the
    # bucket is left as it is, as for any model failure (docs/memory-loop.md "Compaction").
    compaction_llm_timeout_s: float = Field(80.0, gt=0, le=3600)
    compaction_interval_s: int = Field(1800, ge=10)
    compaction_threshold_preference: int = Field(15, ge=2)
    compaction_threshold_expertise: int = Field(8, ge=2)
    compaction_threshold_entity: int = Field(25, ge=2)
    compaction_threshold_decision: int = Field(20, ge=2)
    compaction_cooldown_s: int = Field(12 * 3600, ge=0)
    # sweep of turns whose extraction never completed
    sweep_interval_s: int = Field(60, ge=1)
    sweep_stale_after_s: int = Field(120, ge=1)
    max_extraction_attempts: int = Field(3, ge=1)
    # proxy turns parked in Redis while OpenSearch was down are stored this often
    parked_drain_interval_s: int = Field(5, ge=1, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _read_old_names(cls, data: object) -> object:
        """Nested input (TENURE_LOOP__TIER_FAMILIES, keyword arguments) under a renamed setting's old name."""
        if not isinstance(data, dict):
            return data
        renamed = dict(data)
        for new, old in RENAMED_LOOP_SETTINGS.items():
            if old in renamed:
                value = renamed.pop(old)
                if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
                    # the nested env source decodes JSON only under a field's own name
                    value = json.loads(value)
                renamed.setdefault(new, value)
        return renamed

    def for_tenant(self, tenant_id: str) -> TenantLoopOverride:
        return self.tenants.get(tenant_id) or TenantLoopOverride()


class CelerySettings(BaseSettings):
    """Worker limits. The broker visibility timeout must exceed the longest hard time limit."""

    model_config = SettingsConfigDict(env_prefix="TENURE_CELERY_", extra="ignore")

    heavy_soft_time_limit_s: int = Field(240, ge=1)
    heavy_time_limit_s: int = Field(300, ge=2)
    cheap_soft_time_limit_s: int = Field(20, ge=1)
    cheap_time_limit_s: int = Field(30, ge=2)
    task_expires_s: int = Field(6 * 3600, ge=60)
    visibility_timeout_s: int = Field(3600, ge=60)
    max_retries: int = Field(5, ge=0)
    queue_prefix: str = "tenure"
    # Beat checks the beliefs index this often and force-merges it when a bulk import (or a long
    # stream of writes) left more than merge_above_segments_per_shard segments per shard: recall's
    # query CPU grows with the segment count (docs/operations.md, "Segments"). 0 turns it off.
    merge_check_interval_s: float = Field(600.0, ge=0.0, le=7 * 86_400.0)
    merge_above_segments_per_shard: float = Field(12.0, ge=1.0, le=10_000.0)
    # The change-log orphan sweep (beat, as often as retention) rests between its pages so that its
    # requests take this share of its wall time (recall shares the node), and starts no new tenant
    # once the budget is spent: the next run resumes after the last tenant it swept
    # (docs/operations.md, "Change logs"). The budget is below the heavy soft time limit so the
    # tenant under way can finish.
    change_log_sweep_work_fraction: float = Field(0.25, gt=0.0, le=1.0)
    change_log_sweep_budget_s: float = Field(120.0, gt=0.0, le=86_400.0)
    # The worker's consumer loop touches this file every worker_heartbeat_interval_s while it
    # consumes; `python -m workers.liveness check FILE [max age]` is the worker's health check
    # (docs/operations.md "Worker liveness"). Empty: no heartbeat (compose and Helm set one).
    worker_heartbeat_file: str = ""
    worker_heartbeat_interval_s: float = Field(5.0, gt=0.0, le=3600.0)

    @model_validator(mode="after")
    def _sweep_budget_fits(self) -> CelerySettings:
        if self.change_log_sweep_budget_s >= self.heavy_soft_time_limit_s:
            raise ValueError(
                "TENURE_CELERY_CHANGE_LOG_SWEEP_BUDGET_S must be below TENURE_CELERY_HEAVY_SOFT_TIME_LIMIT_S"
            )
        return self


class ObservabilitySettings(BaseSettings):
    """Logs, metrics and traces (service/telemetry, docs/operations.md "Observability")."""

    model_config = SettingsConfigDict(env_prefix="TENURE_OBSERVABILITY_", extra="ignore")

    # "json": one object per line with request id, tenant and latency; "text" for a terminal
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # GET /metrics on the API (Prometheus text format; blocked at the TLS proxy)
    metrics_enabled: bool = True
    # the Celery worker's main process serves its pool's metrics on this port (0: not served)
    worker_metrics_port: int = Field(0, ge=0, le=65535)
    # OpenTelemetry traces, exported over OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME);
    # needs the `tracing` extra installed
    tracing_enabled: bool = False


class TenantRetention(BaseModel):
    """One tenant's retention in days (None: the deployment's; 0: forever)."""

    model_config = ConfigDict(extra="forbid")

    audit_days: int | None = Field(None, ge=0, le=36_500)
    turns_days: int | None = Field(None, ge=0, le=36_500)


class RetentionSettings(BaseSettings):
    """How long audit events and proxied turns are kept (service/storage/retention.py). 0 keeps
    them forever. ``tenants`` overrides per tenant: ``{"acme": {"audit_days": 365}}``."""

    model_config = SettingsConfigDict(env_prefix="TENURE_RETENTION_", extra="ignore")

    audit_days: int = Field(0, ge=0, le=36_500)
    turns_days: int = Field(90, ge=0, le=36_500)
    tenants: dict[str, TenantRetention] = Field(default_factory=dict)
    # beat runs the retention sweep this often
    interval_s: int = Field(3600, ge=60, le=7 * 86_400)

    def for_tenant(self, tenant_id: str) -> TenantRetention:
        base = self.tenants.get(tenant_id) or TenantRetention()
        return TenantRetention(
            audit_days=self.audit_days if base.audit_days is None else base.audit_days,
            turns_days=self.turns_days if base.turns_days is None else base.turns_days,
        )


class CliSettings(BaseSettings):
    """The ``tenure`` CLI: where the API is and which credential to use."""

    model_config = SettingsConfigDict(env_prefix="TENURE_CLI_", extra="ignore")

    url: str = "http://127.0.0.1:8000"
    key: SecretStr | None = None
    timeout_s: float = Field(30.0, gt=0, le=600)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TENURE_", env_file=".env", extra="ignore", env_nested_delimiter="__")

    # "development" relaxes one thing: the console's session cookie is not marked Secure, so it
    # works over plain http on a laptop. Every other value gets Secure cookies.
    environment: str = "development"

    # Long-running processes (API and Celery workers) freeze what survives each generation-2
    # collection, so the next walks only what was kept since; every this many seconds one walks
    # everything (reference cycles among frozen objects). 0: only the start-up heap is frozen.
    # service/process.py.
    gc_thaw_interval_s: float = Field(1800.0, ge=0, le=86_400)
    # Container allocations between two generation-0 collections in those processes (CPython's
    # default is 700; 0 keeps it). Recall's short-lived JSON makes the default collect several
    # times per request (service/process.py).
    gc_young_threshold: int = Field(20_000, ge=0, le=1_000_000)
    # One full collection every this many seconds in those processes (0: only CPython's own), on
    # the API worker's event loop, on a thread in a Celery worker. The recall caches' churn keeps
    # CPython's count low while new objects pile up, and one young collection then walked 200,000
    # of them (120-230 ms pauses; service/process.py). Only with gc_thaw_interval_s > 0: without
    # the freezer each collection would walk everything kept since start-up.
    gc_collect_interval_s: float = Field(1.0, ge=0.0, le=3600.0)

    # One node's URL, or a cluster's nodes comma-separated ("http://a:9200,http://b:9200").
    opensearch_url: str = "http://127.0.0.1:9200"
    opensearch_username: str | None = None
    opensearch_password: SecretStr | None = None
    opensearch_timeout_s: float = 10.0
    # How long a new connection to one node may take before that node is given up for this
    # request, marked dead and the request sent to the next node. Much shorter than the request
    # timeout: a lost machine (no TCP reset, unlike a killed process) must not cost a request
    # the whole request timeout, and on the asynchronous client not a failed request.
    opensearch_connect_timeout_s: float = Field(2.0, gt=0)
    # Prefix of every index, alias and index template this deployment owns; tests and evals use
    # their own namespace so they never touch a real deployment's data.
    opensearch_namespace: str = "tenure"

    redis_url: str = "redis://127.0.0.1:6379/0"
    celery_broker_url: str | None = None

    recall: RecallDefaults = Field(default_factory=RecallDefaults)
    loop: MemoryLoopSettings = Field(default_factory=MemoryLoopSettings)
    celery: CelerySettings = Field(default_factory=CelerySettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @property
    def broker_url(self) -> str:
        return self.celery_broker_url or self.redis_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def _prefix(model: type[BaseSettings]) -> str:
    return str(model.model_config.get("env_prefix", "")).upper()


def _nested_settings(annotation: object) -> type[BaseSettings] | None:
    """The settings class of a nested field (``recall: RecallDefaults``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
        return annotation
    return None


def environment_names() -> frozenset[str]:
    """Every environment variable name the service's settings read (upper case).

    Derived from the models, so a compose file, ``.env.example`` or README can be checked against
    it: a misspelled name would otherwise be ignored silently (``extra="ignore"``). For a field
    ``f`` of :class:`Settings`: ``TENURE_F``; for a nested settings class such as ``recall``, the
    whole object as JSON (``TENURE_RECALL``), each sub-field through the nested delimiter
    (``TENURE_RECALL__MAX_BELIEFS``) and through the class's own prefix (``TENURE_RECALL_MAX_BELIEFS``).
    The CLI's :class:`CliSettings` (``TENURE_CLI_*``) is read on its own. Lists and dicts
    (``TENURE_LOOP_TIER_FAMILIES``, ``TENURE_LOOP_TENANTS``) take JSON values.
    """
    top = _prefix(Settings)
    delimiter = str(Settings.model_config.get("env_nested_delimiter") or "")
    names = {f"{_prefix(CliSettings)}{sub.upper()}" for sub in CliSettings.model_fields}
    for field, info in Settings.model_fields.items():
        names.add(f"{top}{field.upper()}")
        nested = _nested_settings(info.annotation)
        if nested is None:
            continue
        for sub, sub_info in nested.model_fields.items():
            names.add(f"{top}{field.upper()}{delimiter}{sub.upper()}")
            aliases = _env_aliases(sub_info.validation_alias)
            names.update(aliases or [f"{_prefix(nested)}{sub.upper()}"])
            # a renamed setting's old name also works nested (MemoryLoopSettings._read_old_names)
            names.update(f"{top}{field.upper()}{delimiter}{a.removeprefix(_prefix(nested))}" for a in aliases)
    return frozenset(names)


def _env_aliases(alias: object) -> list[str]:
    """The environment names a field with a ``validation_alias`` is read from (no prefix added)."""
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if isinstance(alias, str) else []
    return [choice.upper() for choice in choices if isinstance(choice, str)]
