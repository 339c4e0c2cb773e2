"""benchmarks/sdk_transport_ab.py: the six clients it compares and the one API it calls; and
fastpath_bench's load client (the SDK's lean transport by default)."""

from __future__ import annotations

import pytest

from benchmarks.sdk_transport_ab import CLIENTS, parse_args


def test_one_variant_is_the_api_the_clients_call() -> None:
    node = ["--opensearch-url", "http://os", "--redis-url", "redis://r/0"]
    args = parse_args([*node, "--variant", "main=."])
    assert args.variant == ["main=."] and args.api_workers == 1
    with pytest.raises(SystemExit):
        parse_args([*node, "--variant", "a=.", "--variant", "b=."])


def test_the_six_clients() -> None:
    assert CLIENTS == ("sync", "sync-keepalive", "sync-direct", "async-httpx", "async-keepalive", "async-direct")


def test_fastpath_bench_loads_over_the_lean_transport_unless_told_otherwise() -> None:
    from benchmarks import fastpath_bench as fb

    assert fb.parse_args([]).load_client == "keepalive"
    assert fb.parse_args(["--load-client", "lanes"]).load_client == "lanes"
    assert {"lanes": fb.lanes_to, "keepalive": fb.keepalive_to} == fb.CONNECTS


def test_the_sequential_pass_is_the_sync_sdk_unless_told_otherwise() -> None:
    from benchmarks import fastpath_bench as fb

    assert fb.parse_args([]).seq_client == "sync"
    assert fb.sequential_by("sync") is fb.sequential
    assert fb.sequential_by("keepalive") is not fb.sequential
    assert fb.sequential_by("sync-keepalive") is not fb.sequential
    assert fb.parse_args(["--seq-client", "sync-keepalive"]).seq_client == "sync-keepalive"


def test_a_sequential_pass_times_only_answered_recalls_past_the_warmup() -> None:
    import time

    from benchmarks.fastpath_bench import _Sequence

    run = _Sequence(warmup=2, max_s=None)
    for i, failed in enumerate([False, False, True, False, False]):
        run.done(i, time.perf_counter(), failed)
    figures, sent = run.figures(total=6)
    assert sent == 5 and figures["errors"] == 1 and figures["n"] == 2 and figures["stopped_at_max_s"] is True
    assert not run.over()  # no max_s: never over
    late = _Sequence(0, 0.001)
    time.sleep(0.01)
    assert late.over()


def test_answers_are_json_unless_typed_is_asked() -> None:
    node = ["--opensearch-url", "http://os", "--redis-url", "redis://r/0", "--variant", "main=."]
    assert parse_args(node).answers == "json"
    assert parse_args([*node, "--answers", "typed"]).answers == "typed"


def test_the_decoding_comparison_checks_every_reading_gives_the_same() -> None:
    import json

    from pydantic import ValidationError

    from benchmarks.sdk_transport_ab import decode_costs
    from tests.test_sdk_parsing import _recall_answer

    answer = json.dumps(_recall_answer()).encode()
    figures = decode_costs([answer, answer], rounds=2)
    assert figures["answers"] == 2 and figures["bytes_max"] == len(answer)
    assert set(figures["us_per_answer"]) == {
        "json: stdlib json.loads",
        "json: Parser (pydantic_core.from_json)",
        "typed: stdlib json.loads + model_validate",
        "typed: Parser (model_validate_json)",
    }
    with pytest.raises(ValidationError, match="scopes"):  # what is not a recall's answer fails, not timed
        decode_costs([b'{"scopes": "not a list"}'], rounds=1)
