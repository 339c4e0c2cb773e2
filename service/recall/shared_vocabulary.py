"""Built tenant vocabularies shared between processes through Redis.

Every API process (each uvicorn worker, each replica, each restart) keeps its own LRU of tenant
vocabularies (:class:`service.recall.vocabulary.VocabularyCache`). Without sharing, a tenant's
first recall in each process pays the build: one routed search over the tenant's stored units
and ~30 ms of Python at 1,000 beliefs (docs/benchmarks.md, issue 16), so a deployment with N
processes builds every tenant N times, and again after every restart. Here the first process to
build a tenant's vocabulary at a write version stores it; the others load it (one GET and a
rebuilt pre-filter) instead of building.

What is stored and when it is trusted:

- one key per tenant, under the tenant's cached-renderings prefix
  (:func:`service.redis_keys.shared_vocabulary`), so an erase sweeps it with the renderings and
  erased text cannot stay in it;
- the value is the encoded vocabulary (:meth:`TenantVocabulary.encode`): its tenant, write
  version and mapping fingerprint travel with it and are checked on load, so an entry of another
  version, another index or another tenant is never used (it is rebuilt and overwritten);
- it is stored only while the tenant's write version is still the one it was built at (a Lua
  check-and-set against the version counter): a build that raced a write, an erase included,
  never lands after the write's bump, and one that landed before it is swept by the erase or
  ignored for its old version;
- entries expire ``ttl_s`` after they were stored, so an idle tenant's vocabulary leaves Redis;
- a stored entry is announced on a pub/sub channel (:func:`service.redis_keys.shared_vocabulary_stored`)
  in the same script, so the API processes that hold an older version of the tenant restore it
  before the tenant's next recall (:mod:`service.recall.vocabulary_warmer`). The notice carries
  the tenant and version only, never the entry; a lost notice only means the next recall
  restores the entry itself.

Failures never fail a recall: an unreachable Redis, a missing or unreadable entry all mean the
vocabulary is built as before (logged, counted in ``tenure_shared_vocabulary_total``).
"""

from __future__ import annotations

import logging

import orjson
import redis

from service import redis_keys
from service.telemetry import metrics

log = logging.getLogger(__name__)

# KEYS[1]: the tenant's write version counter, KEYS[2]: the shared entry. ARGV: the version the
# entry was built at, the entry, its TTL in seconds, the notice channel and the notice. Stores
# (and announces) only while the counter still holds that version (a missing counter is version
# 0, like TenantWriteVersions.current).
_STORE_IF_CURRENT = """
local current = redis.call('GET', KEYS[1]) or '0'
if current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""


class SharedVocabularies:
    """Encoded tenant vocabularies in Redis, one entry per tenant (see the module docstring)."""

    def __init__(self, client: redis.Redis[bytes], namespace: str, *, ttl_s: float):
        self.client = client
        self.namespace = namespace
        self.ttl_s = max(1, int(ttl_s))
        self.channel = redis_keys.shared_vocabulary_stored(namespace)
        self._store_if_current = client.register_script(_STORE_IF_CURRENT)

    def key(self, tenant_id: str) -> str:
        return redis_keys.shared_vocabulary(self.namespace, tenant_id)

    def load(self, tenant_id: str) -> bytes | None:
        """The tenant's stored entry, if any (None also when Redis does not answer)."""
        try:
            raw = self.client.get(self.key(tenant_id))
        except redis.RedisError as exc:
            log.warning("shared vocabulary of %s unreadable (%s); building it", tenant_id, exc)
            metrics.SHARED_VOCABULARY.labels("unreachable").inc()
            return None
        return raw

    def store(self, tenant_id: str, version: int, encoded: bytes) -> bool:
        """Store ``encoded`` (built at ``version``) unless the tenant has written since; returns
        whether it was stored (and announced on :attr:`channel`)."""
        keys = [redis_keys.tenant_write_version(self.namespace, tenant_id), self.key(tenant_id)]
        notice = orjson.dumps([tenant_id, version])
        try:
            stored = bool(
                self._store_if_current(keys=keys, args=[str(version), encoded, self.ttl_s, self.channel, notice])
            )
        except redis.RedisError as exc:
            log.warning("shared vocabulary of %s not stored (%s)", tenant_id, exc)
            metrics.SHARED_VOCABULARY.labels("unreachable").inc()
            return False
        metrics.SHARED_VOCABULARY.labels("stored" if stored else "outdated").inc()
        return stored
