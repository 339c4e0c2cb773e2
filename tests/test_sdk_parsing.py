"""The SDK reads answers straight from their bytes (``tenure_client._calls.Parser``): the same models
and the same JSON as decoding first and validating after, the same errors for a broken answer.

The answers of the real service are in tests/api/test_sdk.py; here httpx's own ``MockTransport``
answers with chosen bytes, including ones the service never sends (broken JSON, a wrong shape)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from tenure_client import AsyncTenure, Tenure, UnexpectedAnswer, models
from tenure_client import _calls as calls

STABLE = "## Memory\nstable part ✓\n"  # offsets count code points: the emoji and ✓ are one each
DYNAMIC = "## Now\ndynamic part 🚀"


def _item(i: int, tier: str) -> dict[str, Any]:
    return {
        "id": f"b-{tier}-{i}",
        "canonical_name": f"use_postgres_{i}",
        "type": "decision",
        "scope": ["user:universal", "project:ünïcode-数据"],
        "content": f'Use Postgres 16 for service {i} — not MySQL. "quoted" \\ back\\slash \n newline 🚀',
        "why_it_matters": "Write SQL for Postgres; 日本語のテキスト",
        "epistemic_status": "active",
        "confidence": 0.9 if i % 2 else 1,
        "score": 12.5 + i if tier == "relevant" else None,
        "clauses": [{"clause": "alias", "term": "postgres", "score": 14.0}] if tier == "relevant" else [],
        "via_relation": None,
        "relation_type": None,
        "an_extra_field": {"nested": [1, 2.5e-7, None, True]},
    }


def _recall_answer() -> dict[str, Any]:
    text = STABLE + DYNAMIC
    return {
        "scopes": ["user:universal", "domain:code"],
        "query": "which database? 数据库",
        "persona": "A careful engineer",
        "tiers": {tier: [_item(i, tier) for i in range(12)] for tier in ("pinned", "relevant", "questions")},
        "injected_ids": [f"b-relevant-{i}" for i in range(12)],
        "truncated": False,
        "injection": {
            "text": text,
            "beliefs_end": len(STABLE),
            "dynamic_start": len(STABLE),
            "beliefs": None,
            "dynamic": None,
        },
        "receipt_id": "evt-1",
        "quarantined": 0,
        "explain": None,
    }


def _answering(body: bytes, status: int = 200) -> httpx.MockTransport:
    return httpx.MockTransport(lambda _request: httpx.Response(status, content=body))


def test_every_parser_reads_bytes_as_it_reads_decoded_json() -> None:
    content = json.dumps(_recall_answer(), ensure_ascii=False).encode()
    data = json.loads(content)
    from_bytes = calls.recall_out.from_bytes(content)
    assert from_bytes == calls.recall_out(data)
    assert from_bytes.injection.beliefs == STABLE  # cut from the text, as before
    assert from_bytes.injection.dynamic == DYNAMIC
    assert calls.raw.from_bytes(content) == data
    item = json.dumps(_item(3, "relevant")).encode()
    parser = calls.model(models.TierItem)
    assert parser.from_bytes(item) == parser(json.loads(item))
    listed = calls.model_list(models.TierItem)
    assert listed.from_bytes(b"[" + item + b"," + item + b"]") == listed([json.loads(item)] * 2)


def test_a_broken_answer_fails_in_both_readings() -> None:
    for broken in (b"{not json", b'{"scopes": []'):
        with pytest.raises(ValueError, match="EOF|expected|key must be a string"):
            calls.raw.from_bytes(broken)
        with pytest.raises(ValidationError, match="Invalid JSON"):
            calls.recall_out.from_bytes(broken)
    wrong = {**_recall_answer(), "truncated": "perhaps"}
    with pytest.raises(ValidationError):
        calls.recall_out.from_bytes(json.dumps(wrong).encode())
    with pytest.raises(ValidationError):
        calls.recall_out(wrong)


def test_the_clients_read_answers_from_bytes() -> None:
    answer = _recall_answer()
    content = json.dumps(answer).encode()
    with Tenure("http://tenure.test", "key", transport=_answering(content)) as client:
        out = client.recall("which database?")
        assert out == calls.recall_out(json.loads(content))
        assert out.tiers.relevant[3].score == 15.5
        assert out.injection.dynamic == DYNAMIC
        assert client.recall_json("which database?") == answer
        # any other parser still gets the decoded JSON
        assert client.send(calls.Call("GET", "/v1/anything", lambda data: sorted(data))) == sorted(answer)

    async def run() -> Any:
        async with AsyncTenure("http://tenure.test", "key", transport=_answering(content)) as client:
            return await client.recall("which database?"), await client.recall_json("which database?")

    typed, raw = asyncio.run(run())
    assert typed == out
    assert raw == answer


def test_an_empty_answer_is_none_and_a_broken_one_raises() -> None:
    with Tenure("http://tenure.test", "key", transport=_answering(b"", 204)) as client:
        assert client.send(calls.Call("GET", "/readyz", calls.raw)) is None
    with (
        Tenure("http://tenure.test", "key", transport=_answering(b"{broken")) as client,
        pytest.raises(UnexpectedAnswer, match="not the Tenure API's") as broken,
    ):
        client.recall("x")
    assert isinstance(broken.value.__cause__, ValidationError) and "Invalid JSON" in str(broken.value.__cause__)
