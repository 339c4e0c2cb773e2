"""``recall_cost_split``'s blocks: which requests each kind sends (pure functions, no servers)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from benchmarks.recall_bench import Query, Spec, draw_sessions
from benchmarks.recall_cost_split import LONG_WORDS, SHORT_WORDS, Measured, blocks_of, parse_args, requests_of
from service.domain.scopes import normalize_scope

ARGS = ["--opensearch-url", "http://os", "--redis-url", "redis://r", "--variant", "main=."]


def test_each_kind_gets_its_blocks_and_short_and_long_are_told_by_their_words() -> None:
    args = parse_args([*ARGS, "--blocks", "4", "--block", "300"])
    queries = draw_sessions(2_000, 5_000, Spec(tenants=50, users_per_tenant=5), datetime(2026, 11, 30, tzinfo=UTC),
                            seed=3, length=10, active=8)  # fmt: skip
    blocks = blocks_of(queries, args)
    assert set(blocks) == {"healthz", "empty", "short", "long", "new-scopes"}
    for kind, kind_blocks in blocks.items():
        assert [len(b) for b in kind_blocks] == [300] * 4, kind
    assert all(len(q.message.split()) < SHORT_WORDS for b in blocks["short"] for q in b)
    assert all(len(q.message.split()) >= LONG_WORDS for b in blocks["long"] for q in b)
    # fewer long messages than the blocks need: cycled, each one sent again in turn
    long_pool = [q for q in queries if len(q.message.split()) >= LONG_WORDS]
    assert 0 < len(long_pool) < 1_200
    assert blocks["long"][0][: len(long_pool)] == long_pool[:300]


def test_a_row_reports_percentiles_and_cpu_per_request() -> None:
    measured = Measured()
    measured.latencies_ms["short"] = [float(v) for v in range(1, 101)]
    measured.cpu_s["short"] = 0.25
    assert measured.row("short", node=False) == {"n": 100, "p50_ms": 51.0, "p99_ms": 100.0, "api_cpu_ms": 2.5}
    measured.node_cpu_s["short"] = 0.125
    assert measured.row("short", node=True)["node_cpu_ms"] == 1.25


class _Recorder:
    """Stands in for the HTTP caller: records the scope lists and messages it is asked to send."""

    def __init__(self) -> None:
        self.scope_lists = itertools.count()
        self.sent: list[tuple[list[str], str]] = []

    def recall(self, query: Query, message: str) -> None:
        self.sent.append((query.scopes, message))


def test_new_scopes_sends_an_empty_message_in_a_scope_list_never_sent_before() -> None:
    queries = draw_sessions(50, 5_000, Spec(tenants=50, users_per_tenant=5), datetime(2026, 11, 30, tzinfo=UTC),
                            seed=3, length=10, active=8)  # fmt: skip
    caller = _Recorder()
    for _ in range(2):  # two blocks: the second still names new scope lists
        send = requests_of("new-scopes", caller)  # type: ignore[arg-type]
        for query in queries:
            send(query)
    scope_lists = [tuple(scopes) for scopes, _ in caller.sent]
    assert len(set(scope_lists)) == 100 and all(message == "" for _, message in caller.sent)
    assert all(len(s) == 1 and s[0].startswith("domain:code/") for s in scope_lists)
    assert all(normalize_scope(s[0]) == s[0] for s in scope_lists)  # valid labels
