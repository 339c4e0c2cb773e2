"""Audit event ids: UUIDv7 (time-ordered), in the ``ev-<32 hex>`` shape events always had."""

from __future__ import annotations

import re
import time
import uuid

from service.storage.audit import AuditEvent, time_ordered_id


def test_an_id_is_a_uuid7_whose_first_48_bits_are_now_in_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    value = time_ordered_id()
    after = time.time_ns() // 1_000_000
    assert re.fullmatch(r"[0-9a-f]{32}", value)
    parsed = uuid.UUID(value)
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert before <= parsed.int >> 80 <= after


def test_ids_sort_in_creation_order_across_milliseconds() -> None:
    earlier = time_ordered_id()
    time.sleep(0.002)
    assert time_ordered_id() > earlier


def test_ids_within_one_millisecond_are_still_unique() -> None:
    ids = {time_ordered_id() for _ in range(20_000)}
    assert len(ids) == 20_000


def test_events_keep_their_shape() -> None:
    event = AuditEvent(tenant_id="t", action="recall", actor_id="u", actor_kind="api_key")
    assert re.fullmatch(r"ev-[0-9a-f]{32}", event.event_id)
    assert uuid.UUID(event.event_id[3:]).version == 7
