"""A tenant's results must not depend on other tenants' data (docs/scoring-independence.md).

BM25 statistics (document frequency, average field length) are per shard and shared by every
tenant routed there, so in a shared index one tenant's data would shift another's scores. Our
search fields use the ``boolean`` similarity (score = boost x fuzzy factor per matched whole unit),
which reads no corpus statistics at all. This test proves it end to end: the paper suite for
tenant A yields identical tiers AND identical scores with and without a second tenant holding
100,000 beliefs built from the same vocabulary, written to the same shards.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

from evals.cases import paper_case_set
from evals.runner import RunResult, run_case_set
from service.domain.belief import Belief
from service.storage.beliefs import BeliefStore
from tests.conftest import SuiteBackend, fingerprint

NOISE_BELIEFS = 100_000
CASES = paper_case_set()


def noise_beliefs(tenant: str, count: int, seed: int = 7) -> Iterator[Belief]:
    """Beliefs for another tenant made of the paper's own vocabulary (names, aliases, users, scopes),
    so they would match the same queries and, under plain BM25, shift document frequencies."""
    rng = random.Random(seed)
    vocab = sorted({a for r in CASES.beliefs for a in r["aliases"]} | {r["canonical_name"] for r in CASES.beliefs})
    for i in range(count):
        template: dict[str, Any] = dict(rng.choice(CASES.beliefs))
        template.update(
            _id=f"noise-{i}",
            canonical_name=f"{rng.choice(vocab)}_{i % 97}",
            aliases=rng.sample(vocab, k=rng.randint(1, 4)),
            pinned=rng.random() < 0.1,
            resolved_at=None,
            superseded_by=None,
            epistemic_status="active",
        )
        if template["type"] == "open_question":
            template["type"] = "decision"
        yield Belief.from_record(template, tenant_id=tenant)


def run_for(store: BeliefStore, suite_backend: SuiteBackend, tenant: str) -> RunResult:
    """One run of the paper suite over ``store`` with a fresh backend (its own vocabulary cache)."""
    return run_case_set(
        CASES, suite_backend(store), store, static_tenant=f"{tenant}-static", session_tenant=f"{tenant}-session"
    )


def test_paper_suite_is_identical_with_and_without_a_100k_neighbour(
    store: BeliefStore, suite_backend: SuiteBackend
) -> None:
    run_id = uuid.uuid4().hex[:6]
    before = run_for(store, suite_backend, f"indep-a1-{run_id}")

    batch: list[Belief] = []
    for belief in noise_beliefs(f"indep-b-{run_id}", NOISE_BELIEFS):
        batch.append(belief)
        if len(batch) == 5000:
            assert not store.put_many(batch, refresh="false").failed
            batch = []
    assert not store.put_many(batch, refresh="false").failed
    store.refresh()
    count = store.client.count(index=store.alias, body={"query": {"term": {"tenant_id": f"indep-b-{run_id}"}}})["count"]
    assert count == NOISE_BELIEFS

    after = run_for(store, suite_backend, f"indep-a2-{run_id}")
    assert before.passed == after.passed == 72
    assert fingerprint(before) == fingerprint(after)


def test_control_plain_bm25_would_leak_statistics(store: BeliefStore, suite_backend: SuiteBackend) -> None:
    """The same check against an index whose name fields keep OpenSearch's default BM25: a few
    thousand neighbour beliefs change tenant A's scores. This is why the design is deliberate,
    and it shows the main test above can fail."""
    import json

    from service.storage.templates import BELIEF_LOGS, apply_templates, drop_namespace, load_json

    ns = f"bm25ctl-{uuid.uuid4().hex[:6]}"
    analysis = load_json("component/tenure-analysis.json")["template"]
    body = json.loads(json.dumps(analysis).replace('"similarity": "boolean", ', ""))
    belief_mappings = load_json("component/tenure-belief-fields.json")["template"]["mappings"]
    common = load_json("component/tenure-common-fields.json")["template"]["mappings"]["properties"]
    body["mappings"]["properties"].update({**belief_mappings["properties"], **common})
    body["mappings"]["_source"] = belief_mappings["_source"]  # the analysed units stay out of the source
    body["settings"]["number_of_shards"] = 1
    body["settings"]["number_of_replicas"] = 0
    index = f"{ns}-beliefs-000001"
    store.client.indices.create(index=index, body={**body, "aliases": {f"{ns}-beliefs": {}}})
    apply_templates(store.client, ns, (BELIEF_LOGS,))
    try:
        plain = BeliefStore(store.client, ns)
        before = run_for(plain, suite_backend, f"ctl-a1-{ns}")
        batch = list(noise_beliefs(f"ctl-b-{ns}", 3000, seed=11))
        assert not plain.put_many(batch, refresh="true").failed
        after = run_for(plain, suite_backend, f"ctl-a2-{ns}")
        assert fingerprint(before) != fingerprint(after)
    finally:
        store.client.indices.delete(index=index, ignore=[404])
        drop_namespace(store.client, ns, (BELIEF_LOGS,))
