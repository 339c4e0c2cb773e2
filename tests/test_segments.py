"""Segment merging after bulk writes (issue 16): recall's query CPU grows with the segment count."""

from __future__ import annotations

import uuid

from opensearchpy import OpenSearch

from service.config import CelerySettings, Settings
from service.extraction.queue import TASK_MERGE_SEGMENTS
from service.storage.operations import merge_if_fragmented, segments_per_shard
from workers.celery_app import create_celery


def test_a_fragmented_index_is_merged_and_a_merged_one_left_alone(os_client: OpenSearch) -> None:
    index = f"segments-{uuid.uuid4().hex[:8]}"
    os_client.indices.create(index=index, body={"settings": {"number_of_shards": 2, "number_of_replicas": 0}})
    try:
        for i in range(8):  # one refresh per write: one segment per write and shard it lands on
            os_client.index(index=index, id=str(i), body={"n": i}, routing=str(i % 2), refresh=True)
        assert segments_per_shard(os_client, index) >= 3
        merged = merge_if_fragmented(os_client, index, above=2)
        assert merged is not None and merged["segments_per_shard_after"] == 1
        assert os_client.count(index=index)["count"] == 8
        assert merge_if_fragmented(os_client, index, above=2) is None
    finally:
        os_client.indices.delete(index=index)


def test_beat_checks_the_segments_unless_turned_off(settings: Settings) -> None:
    scheduled = create_celery(settings).conf.beat_schedule
    assert scheduled["beliefs-merge-segments"]["task"] == TASK_MERGE_SEGMENTS
    off = settings.model_copy(update={"celery": CelerySettings(merge_check_interval_s=0)})
    assert "beliefs-merge-segments" not in create_celery(off).conf.beat_schedule
