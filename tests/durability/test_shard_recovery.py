"""A recall while the beliefs index has no active primary: what a restarted OpenSearch node
serves until it has recovered its shards from disk.

Found by the OpenSearch fault drill (docs/fault-drills.md): for a few seconds after the killed
node answered again, ``_msearch`` failed each recall query with "all shards failed" (503 inside
a 200 response) and the API turned that into 422 ``validation_error``, telling clients their
request was wrong and not to retry. The state is reproduced here without timing luck: the
beliefs alias is pointed at an index whose primaries no node may hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opensearchpy import OpenSearch

from deploy.devstack import Service
from tests.api.conftest import belief_body, ok
from tests.durability.conftest import make_settings, stack

UNMATCHABLE = {"index.routing.allocation.require._name": "no-such-node"}


@contextlib.contextmanager
def beliefs_without_primaries(client: OpenSearch, namespace: str) -> Iterator[None]:
    """While inside, the beliefs alias points at an index whose primaries no node may hold: every
    search fails with "all shards failed" (503), as each shard of a restarted node does until it
    is recovered. (Closing and reopening the real index with that filter does not hold: the node
    force-allocates a primary it has data for within seconds.) Afterwards the alias is back on
    the real index, with everything written before."""
    alias = f"{namespace}-beliefs"
    [index] = client.indices.get_alias(name=alias)
    red = f"{alias}-unassigned"
    client.indices.create(index=red, body={"settings": UNMATCHABLE}, wait_for_active_shards=0)
    _move_alias(client, alias, index, red)
    try:
        yield
    finally:
        _move_alias(client, alias, red, index)
        client.indices.delete(index=red)


def _move_alias(client: OpenSearch, alias: str, src: str, dst: str) -> None:
    actions = [
        {"remove": {"index": src, "alias": alias}},
        {"add": {"index": dst, "alias": alias, "is_write_index": True}},
    ]
    client.indices.update_aliases(body={"actions": actions})


def test_recall_during_shard_recovery_is_a_retryable_503(module_node: Service, own_redis: Service) -> None:
    settings = make_settings(module_node.url, own_redis.url)
    with stack(settings) as st:
        alice = st.team.h("alice")
        ok(st.api.post("/v1/beliefs", json=belief_body("shard_fact"), headers=alice), 201)
        ok(st.api.post("/v1/beliefs", json=belief_body("other_fact"), headers=alice), 201)
        query = {"scopes": ["domain:code"], "query": "shard fact"}
        injected = ok(st.api.post("/v1/recall", json=query, headers=alice))["injected_ids"]
        assert injected

        with beliefs_without_primaries(st.client, settings.opensearch_namespace):
            # a repeat of a message is answered from the recall caches (valid at this tenant write
            # version: identical by construction) without asking OpenSearch ...
            repeat = ok(st.api.post("/v1/recall", json=query, headers=alice))
            assert repeat["injected_ids"] == injected
            # ... a message that needs the shards (other units than the cached search's) is
            # refused, retryably
            fresh = {**query, "query": "other fact"}
            refused = st.api.post("/v1/recall", json=fresh, headers=alice)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store_unavailable"
            assert refused.headers["Retry-After"] == str(settings.api.retry_after_s)

        # the shards are back: the same API process serves again, the belief written before included
        assert ok(st.api.post("/v1/recall", json=query, headers=alice))["injected_ids"]
