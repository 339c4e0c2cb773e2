"""benchmarks/sdk_transport_ab.py: the three clients it compares and the one API it calls."""

from __future__ import annotations

import pytest

from benchmarks.sdk_transport_ab import CLIENTS, parse_args


def test_one_variant_is_the_api_the_clients_call() -> None:
    node = ["--opensearch-url", "http://os", "--redis-url", "redis://r/0"]
    args = parse_args([*node, "--variant", "main=."])
    assert args.variant == ["main=."] and args.api_workers == 1
    with pytest.raises(SystemExit):
        parse_args([*node, "--variant", "a=.", "--variant", "b=."])


def test_the_three_clients() -> None:
    assert CLIENTS == ("sync", "async-httpx", "async-keepalive")
