"""Adversarial noisy neighbours through POST /v1/recall (issue 16, docs/scoring-independence.md).

Lucene's fuzzy query expands a query word into at most 20 indexed terms one edit away, drawn from
the whole shard. Other tenants storing many aliases one edit from a tenant's query words (plurals,
typos, insertions: ``kafkab``, ``postgresx``, ``redisz``) would crowd the tenant's own term out of
the 20, and ``kafkas setup`` would stop finding the tenant's ``kafka``. Recall by the tenant's own
vocabulary draws fuzzy candidates from the caller's tenant only: its answers (ids, order, scores)
are identical with and without such neighbours on every shard. A control shows the Lucene query
does lose them, so the test can fail.
"""

from __future__ import annotations

import string
import uuid
from typing import Any

from fastapi.testclient import TestClient

from service.api.state import Services
from service.domain.belief import Belief
from service.recall.context import ContextBuilder
from tests.api.conftest import belief_body, make_team, ok
from tests.conftest import principal

# (canonical name, its single-word alias)
OWN = [("event_bus", "kafka"), ("primary_database", "postgres"), ("session_store", "redis")]
QUERIES = {
    "kafkas setup": "event_bus",
    "kafkaa": "event_bus",
    "kafka": "event_bus",
    "postgress tuning": "primary_database",
    "postgresq replicas": "primary_database",
    "rediss eviction": "session_store",
    "redis": "session_store",
}
ALIASES_PER_BELIEF = 25  # the most a belief may have: every neighbour stores all of them


def one_edit_variants(word: str) -> list[str]:
    """Words one edit from ``word`` behind its two-letter prefix: substitutions, insertions and
    deletions, as a neighbour's plurals and typos would be."""
    out: set[str] = set()
    for i in range(2, len(word) + 1):
        for c in string.ascii_lowercase:
            out.add(word[:i] + c + word[i:])  # insertion
            if i < len(word):
                out.add(word[:i] + c + word[i + 1 :])  # substitution
        if i < len(word):
            out.add(word[:i] + word[i + 1 :])  # deletion
    return sorted(out - {word})


def adversarial_aliases() -> list[str]:
    """Every one-edit neighbour of every query word, except the tenant's own aliases."""
    own = {alias for _, alias in OWN}
    words = {w for q in QUERIES for w in q.split()}
    return sorted({v for w in words for v in one_edit_variants(w)} - own)


def neighbours_on_every_shard(services: Services) -> list[str]:
    """Tenant ids whose routing reaches every primary shard of the beliefs index."""
    client, alias = services.store.client, services.store.alias
    shards: dict[int, str] = {}
    total = int(next(iter(client.indices.get_settings(index=alias).values()))["settings"]["index"]["number_of_shards"])
    while len(shards) < total:
        tenant = f"noisy-{uuid.uuid4().hex[:8]}"
        placed = client.search_shards(index=alias, routing=tenant)["shards"][0][0]["shard"]
        shards.setdefault(int(placed), tenant)
    return list(shards.values())


def answers(client: TestClient, headers: dict[str, str]) -> dict[str, list[tuple[str, Any]]]:
    out = {}
    for query in QUERIES:
        body = ok(client.post("/v1/recall", json={"query": query, "scopes": ["domain:code"]}, headers=headers))
        out[query] = [(item["id"], item["score"]) for item in body["tiers"]["relevant"]]
    return out


def lucene_answers(services: Services, tenant: str) -> dict[str, list[tuple[str, float | None]]]:
    """The same recalls with the Lucene query (the control)."""
    builder = ContextBuilder(services.store, services.settings.recall)
    me = principal(tenant, "alice", projects=("pay",), teams=("core",))
    return {q: [(e.belief.id, e.score) for e in builder.build(me, ["domain:code"], q).relevant] for q in QUERIES}


def test_adversarial_neighbours_change_no_answer(
    client: TestClient, operator: dict[str, str], services: Services
) -> None:
    assert services.recall.builder.matcher is not None, "the service recalls by the tenant's vocabulary"
    team = make_team(client, operator)
    ids = {}
    for name, alias in OWN:
        created = ok(client.post("/v1/beliefs", json=belief_body(name, aliases=[alias]), headers=team.h("alice")), 201)
        ids[name] = created["id"]

    before = answers(client, team.h("alice"))
    for query, name in QUERIES.items():
        assert [i for i, _ in before[query]] == [ids[name]], query  # plurals and typos reach the tenant's own alias
    control_before = lucene_answers(services, team.tenant)

    aliases = adversarial_aliases()
    assert len(aliases) > 500
    noise: list[Belief] = []
    neighbours = neighbours_on_every_shard(services)
    for tenant in neighbours:
        for n, start in enumerate(range(0, len(aliases), ALIASES_PER_BELIEF)):
            chunk = aliases[start : start + ALIASES_PER_BELIEF]
            noise.append(
                Belief.model_validate(
                    {
                        **belief_body(f"noise_{n}", aliases=chunk),
                        "id": f"noise-{n}",
                        "tenant_id": tenant,
                        "owner_id": "mallory",
                    }
                )
            )
    try:
        for start in range(0, len(noise), 100):  # small bulks: each document analyses 25 aliases 10 ways
            assert not services.store.put_many(noise[start : start + 100], refresh="true").failed

        after = answers(client, team.h("alice"))
        assert after == before  # ids, order and scores
        control_after = lucene_answers(services, team.tenant)
        assert control_after != control_before  # the neighbours do crowd the Lucene expansion out
        assert control_before == {q: [(i, s) for i, s in a] for q, a in before.items()}  # same answers alone
    finally:
        # The neighbours share the session's index with later tests. Deleted, their terms still
        # stay in Lucene's term dictionary while OpenSearch retains soft deletes: suites that
        # recall in process use the vocabulary path, as the service does, which never sees them.
        services.store.client.delete_by_query(
            index=services.store.alias,
            body={"query": {"terms": {"tenant_id": neighbours}}},
            refresh=True,
            conflicts="proceed",
        )
