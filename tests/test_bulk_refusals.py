"""Which failed bulk items the receipt drain sets aside for good (service/storage/client.py
``refused_for_good``): only what sending again cannot fix; a store that cannot take them now keeps
them pending."""

from __future__ import annotations

import pytest

from service.storage.client import refused_for_good


@pytest.mark.parametrize("status", [400, 413])
def test_a_record_the_store_refuses_for_what_it_is_is_set_aside(status: int) -> None:
    assert refused_for_good({"status": status, "error": {"type": "mapper_parsing_exception"}})


@pytest.mark.parametrize(
    ("status", "why"),
    [
        (403, "cluster_block_exception: a write block or the flood-stage disk watermark"),
        (404, "index_not_found_exception while an alias moves"),
        (409, "version_conflict: already recorded"),
        (429, "es_rejected_execution_exception"),
        (500, "a shard failure"),
        (503, "unavailable_shards_exception"),
    ],
)
def test_a_store_that_cannot_take_it_now_keeps_it_pending(status: int, why: str) -> None:
    assert not refused_for_good({"status": status, "error": {"reason": why}})
