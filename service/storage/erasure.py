"""Erasure beyond the belief documents: the erased text is redacted wherever the namespace kept a
copy of it, and deleted documents can be expunged from Lucene's segments.

A belief's text reaches other indices of the namespace as copies: the turns that stated it
(``user_message``, ``assistant_text``, ``sidecar_raw``), the review queue's proposals, and the
audit trail (event ``details`` such as conflict proposals, recall ``query`` text). One
``update_by_query`` per index, confined to the tenant by the chokepoint's filter and routing,
walks every string of each document (painless) and replaces every occurrence of the erased texts
with :data:`REDACTED`; documents without one are left untouched (``noop``, no new version).

Deleting or rewriting a document leaves its old bytes in Lucene segments until they merge;
:func:`expunge_deletes` forces that (``_forcemerge?only_expunge_deletes=true``) for the indices an
erase touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from opensearchpy import OpenSearch

from service.domain.principal import Principal
from service.storage import access
from service.storage.client import translate_errors

REDACTED = "[erased]"
# An erase rewrites every document of the tenant in each copy index (a painless walk of each): on
# a tenant with millions of recall receipts that takes far longer than a search's timeout, and a
# call cut off by the client would stop the erase half-way.
ERASE_TIMEOUT_S = 900
MIN_NEEDLE_CHARS = 8  # shorter texts ("yes", "Redis") are everywhere; only whole statements are redacted

# Identifiers, scopes and vocabulary words are never text a statement was copied into: a belief
# whose content happens to equal a tenant, user or session id must not rewrite those (the records
# would leave their tenant's filters, or stop loading).
KEPT_FIELDS = (
    "tenant_id",
    "owner_id",
    "user_id",
    "actor_id",
    "actor_kind",
    "credential_id",
    "request_id",
    "turn_id",
    "turn_ids",
    "session_id",
    "review_id",
    "event_id",
    "belief_id",
    "belief_ids",
    "result_belief_id",
    "injected_ids",
    "id",
    "scope",
    "scopes",
    "projects",
    "teams",
    "kind",
    "status",
    "action",
    "tier",
)

_SCRUB_SCRIPT = """
def scrub(def value, List needles, String mark, List hits, List kept) {
  if (value instanceof String) {
    String out = value;
    for (def needle : needles) {
      if (out.contains(needle)) { out = out.replace(needle, mark); hits.add(1); }
    }
    return out;
  }
  if (value instanceof Map) {
    for (def key : new ArrayList(value.keySet())) {
      if (!kept.contains(key)) { value.put(key, scrub(value.get(key), needles, mark, hits, kept)); }
    }
    return value;
  }
  if (value instanceof List) {
    for (int i = 0; i < value.size(); ++i) { value.set(i, scrub(value.get(i), needles, mark, hits, kept)); }
    return value;
  }
  return value;
}
List hits = new ArrayList();
for (def key : new ArrayList(ctx._source.keySet())) {
  if (!params.kept.contains(key)) {
    ctx._source.put(key, scrub(ctx._source.get(key), params.needles, params.mark, hits, params.kept));
  }
}
if (hits.isEmpty()) { ctx.op = 'noop'; }
"""


def needles(texts: Iterable[str]) -> list[str]:
    """The erased texts as they may be stored: as written, and as a JSON string body (a sidecar's
    raw JSON, with escaped quotes, newlines or non-ASCII); longest first, so a longer text is
    redacted whole before a shorter one inside it."""
    out: set[str] = set()
    for text in texts:
        if len(text.strip()) < MIN_NEEDLE_CHARS:
            continue
        out.add(text)
        out.add(json.dumps(text)[1:-1])
        out.add(json.dumps(text, ensure_ascii=False)[1:-1])
    return sorted(out, key=len, reverse=True)


def scrub_value(value: Any, wanted: list[str], mark: str = REDACTED) -> tuple[Any, int]:
    """The painless walk of :func:`redact` in Python, for copies kept outside the index (the Redis
    outboxes): every string outside :data:`KEPT_FIELDS` with each of ``wanted`` (from
    :func:`needles`) replaced by ``mark``; returns the value and how many strings changed."""
    if isinstance(value, str):
        out = value
        for needle in wanted:
            out = out.replace(needle, mark)
        return out, int(out != value)
    if isinstance(value, dict):
        changed = 0
        scrubbed: dict[Any, Any] = {}
        for key, item in value.items():
            scrubbed[key], hits = (item, 0) if key in KEPT_FIELDS else scrub_value(item, wanted, mark)
            changed += hits
        return scrubbed, changed
    if isinstance(value, list):
        pairs = [scrub_value(item, wanted, mark) for item in value]
        return [item for item, _ in pairs], sum(hits for _, hits in pairs)
    return value, 0


def redact(client: OpenSearch, aliases: Iterable[str], principal: Principal, texts: Iterable[str]) -> int:
    """Replace every occurrence of ``texts`` in the tenant's documents of ``aliases``; returns how
    many documents were rewritten."""
    wanted = needles(texts)
    if not wanted:
        return 0
    rewritten = 0
    filters = access.for_admin(principal)
    with translate_errors("redact erased text"):
        for alias in aliases:
            client.indices.refresh(index=alias, request_timeout=ERASE_TIMEOUT_S)  # written a moment ago: searchable
            result = client.update_by_query(
                index=alias,
                routing=filters.routing,
                body={
                    "query": filters.query(),
                    "script": {
                        "source": _SCRUB_SCRIPT,
                        "lang": "painless",
                        "params": {"needles": wanted, "mark": REDACTED, "kept": list(KEPT_FIELDS)},
                    },
                },
                conflicts="proceed",
                refresh=True,
                request_timeout=ERASE_TIMEOUT_S,
            )
            rewritten += int(result.get("updated", 0))
    return rewritten


def remove_reviews_about(client: OpenSearch, alias: str, principal: Principal, belief_ids: Iterable[str]) -> int:
    """Delete the tenant's review items about erased beliefs (a conflict filed against one, a
    resolution that created one): their proposals quote or answer the erased text, and with the
    belief gone they can never be resolved. Returns how many were deleted."""
    ids = list(belief_ids)
    if not ids:
        return 0
    about = {
        "bool": {
            "should": [{"terms": {"belief_id": ids}}, {"terms": {"result_belief_id": ids}}],
            "minimum_should_match": 1,
        }
    }
    filters = access.for_admin(principal)
    with translate_errors("remove review items of erased beliefs"):
        result = client.delete_by_query(
            index=alias,
            routing=filters.routing,
            body={"query": filters.query(about)},
            conflicts="proceed",
            refresh=True,
            request_timeout=ERASE_TIMEOUT_S,
        )
    return int(result.get("deleted", 0))


def expunge_deletes(client: OpenSearch, aliases: Iterable[str]) -> None:
    """Merge away the deleted and superseded copies in the segments of ``aliases`` (I/O heavy:
    admin-requested only)."""
    with translate_errors("expunge deleted documents"):
        client.indices.forcemerge(index=",".join(aliases), only_expunge_deletes=True, request_timeout=3600)
