"""A recall while the beliefs index has no active primary: what a restarted OpenSearch node
serves until it has recovered its shards from disk.

Found by the OpenSearch fault drill (docs/fault-drills.md): for a few seconds after the killed
node answered again, ``_msearch`` failed each recall query with "all shards failed" (503 inside
a 200 response) and the API turned that into 422 ``validation_error``, telling clients their
request was wrong and not to retry. The state is reproduced here without timing luck: the index
is reopened with an allocation filter no node matches, so its primaries stay unassigned exactly
as during shard recovery; lifting the filter lets the node recover them.
"""

from __future__ import annotations

from deploy.devstack import Service
from tests.api.conftest import belief_body, ok
from tests.durability.conftest import make_settings, stack, wait_until

UNMATCHABLE = {"index.routing.allocation.require._name": "no-such-node"}


def test_recall_during_shard_recovery_is_a_retryable_503(module_node: Service, own_redis: Service) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    with stack(settings) as st:
        alice = st.team.h("alice")
        ok(st.api.post("/v1/beliefs", json=belief_body("shard_fact"), headers=alice), 201)
        query = {"scopes": ["domain:code"], "query": "shard fact"}
        assert ok(st.api.post("/v1/recall", json=query, headers=alice))["injected_ids"]

        [index] = st.client.indices.get_alias(name=f"{settings.opensearch_namespace}-beliefs")
        st.client.indices.close(index=index)
        st.client.indices.put_settings(index=index, body=UNMATCHABLE)
        st.client.indices.open(index=index, wait_for_active_shards=0)
        try:
            refused = st.api.post("/v1/recall", json=query, headers=alice)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_unavailable"
            assert refused.headers["Retry-After"] == str(settings.api.retry_after_s)
        finally:
            st.client.indices.put_settings(index=index, body={"index.routing.allocation.require._name": None})

        # the node recovers the shards by itself; the same API process serves again
        def served() -> bool:
            return st.api.post("/v1/recall", json=query, headers=alice).status_code == 200

        wait_until(served, 60, "recall after shard recovery")
        assert ok(st.api.post("/v1/recall", json=query, headers=alice))["injected_ids"]
