"""Every Redis key the service writes, built here and nowhere else, all under the deployment's
namespace (``TENURE_OPENSEARCH_NAMESPACE``, default ``tenure``), so two deployments sharing one
Redis never collide and an operator can see in one place what lives where.

Celery's own keys (the queues ``<TENURE_CELERY_QUEUE_PREFIX>.heavy|cheap`` and kombu's bookkeeping)
are named by Celery from its settings, not here.
"""

from __future__ import annotations


def queued_task(namespace: str, task_id: str) -> str:
    """Set while a task's message waits in the broker (``TaskQueue``: the extraction sweep sends a
    stale turn again only if it can SET NX this); lives in the broker's Redis."""
    return f"{namespace}:queued:{task_id}"


def receipts_outbox(namespace: str) -> str:
    """Stream of injection receipts waiting to be moved into the audit index (its unreadable
    entries beside it: :func:`outbox_unreadable`)."""
    return f"{namespace}:audit:receipts"


def parked_turns(namespace: str) -> str:
    """Stream of proxy turns OpenSearch could not take after their answer went out."""
    return f"{namespace}:turns:parked"


def outbox_unreadable(outbox: str) -> str:
    """Entries of the outbox stream ``outbox`` that could not be read back, set aside for an operator."""
    return f"{outbox}:unreadable"


def render_cache(namespace: str, tenant_id: str) -> str:
    """Prefix of a tenant's cached injection renderings (erase drops them all)."""
    return f"{namespace}:render:{tenant_id}:"


def shared_vocabulary(namespace: str, tenant_id: str) -> str:
    """A tenant's built recall vocabulary shared between processes
    (:mod:`service.recall.shared_vocabulary`): under the cached-renderings prefix, so an erase
    sweeps it with them."""
    return f"{render_cache(namespace, tenant_id)}vocabulary"


def shared_vocabulary_stored(namespace: str) -> str:
    """The pub/sub channel (not a key: nothing is stored under it) on which a stored shared
    vocabulary is announced as ``[tenant, version]``, so API processes that hold the tenant can
    restore it before its next recall (:mod:`service.recall.vocabulary_warmer`)."""
    return f"{namespace}:vocabulary:stored"


def compaction_cooldown(namespace: str, bucket: str) -> str:
    """Set while a compacted bucket cools down."""
    return f"{namespace}:compaction:cooldown:{bucket}"


def compaction_lock(namespace: str, bucket: str) -> str:
    """Held (with its holder's token) while one task compacts the bucket."""
    return f"{namespace}:compaction:lock:{bucket}"


def revoked_jwt(namespace: str, digest: str) -> str:
    """A revoked JWT: sha256 of issuer, tenant, subject and jti."""
    return f"{namespace}:revoked-jwt:{digest}"


def legacy_revoked_jti(namespace: str, jti: str) -> str:
    """Revocations written before they were keyed on issuer + tenant + subject; read, never written."""
    return f"{namespace}:revoked-jti:{jti}"


def key_used(namespace: str, key_id: str) -> str:
    """Gate that limits ``last_used_at`` writes of one API key."""
    return f"{namespace}:key-used:{key_id}"


def rate_limit_credential(namespace: str, credential_id: str) -> str:
    return f"{namespace}:rl:key:{credential_id}"


def rate_limit_subject(namespace: str, digest: str) -> str:
    """Token bucket of a JWT subject (tenant + user, hashed)."""
    return f"{namespace}:rl:sub:{digest}"


def rate_limit_tenant(namespace: str, digest: str) -> str:
    return f"{namespace}:rl:tenant:{digest}"


def failed_authentication(namespace: str, subject: str) -> str:
    """Token bucket of failed authentications per client address or API key id."""
    return f"{namespace}:rl:fail:{subject}"


def console_session(namespace: str, digest: str) -> str:
    return f"{namespace}:console:session:{digest}"


def tenant_write_version(namespace: str, tenant_id: str) -> str:
    """Counter bumped after every write to a tenant's beliefs: caches derived from them (the
    recall vocabulary) are valid only for the version they were built at."""
    return f"{namespace}:tenant-version:{tenant_id}"


def tenant_accounts_version(namespace: str, tenant_id: str) -> str:
    """Counter bumped around every write to a tenant's account records (tenant, users, keys): a
    credential verified in-process is trusted only while it is unchanged (service/auth/authenticator.py)."""
    return f"{namespace}:accounts-version:{tenant_id}"


def change_log_sweep_cursor(namespace: str) -> str:
    """The last tenant the change-log orphan sweep finished before its budget ran out: the next
    beat run resumes after it (absent: the next run starts from the first tenant)."""
    return f"{namespace}:change-log-sweep:after"
