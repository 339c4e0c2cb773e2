"""The benchmark's traffic shapes: what ``fastpath_bench --traffic`` sends (pure functions, no servers)."""

from __future__ import annotations

from datetime import UTC, datetime

from benchmarks.recall_bench import Query, Spec, draw_queries, draw_sessions

NOW = datetime(2026, 11, 30, tzinfo=UTC)
SPEC = Spec(tenants=50, users_per_tenant=5)


def _who(q: Query) -> tuple[str, str, tuple[str, ...]]:
    return (q.principal.tenant_id, q.principal.user_id, tuple(q.scopes))


def test_sessions_are_one_user_and_one_scope_list_for_their_length_and_interleave() -> None:
    calls = draw_sessions(2_000, 5_000, SPEC, NOW, seed=3, length=10, active=8)
    counts: dict[tuple[str, str, tuple[str, ...]], int] = {}
    for q in calls:
        counts[_who(q)] = counts.get(_who(q), 0) + 1
    # every session sends exactly `length` calls (a user drawn twice sends 20, ...), except those
    # still running at the end
    unfinished = [n for n in counts.values() if n % 10]
    assert len(unfinished) <= 8
    # interleaved: in any window of 40 calls, several sessions take turns, never more than `active`
    for start in range(0, 2_000 - 40, 40):
        window = {_who(q) for q in calls[start : start + 40]}
        assert 2 <= len(window) <= 16  # 8 running, plus those that replaced a finished one
    # each message still names the session user's own beliefs as often as the random traffic does
    hits = sum(q.kind == "alias-hit" for q in calls) / len(calls)
    assert 0.4 < hits < 0.6


def test_random_traffic_is_what_earlier_figures_were_measured_with() -> None:
    # docs/benchmarks.md's earlier figures came from draw_queries before the sessions shape was
    # split out of it: the same seed must still give the same calls (pinned from that code)
    calls = draw_queries(3, 5_000, SPEC, NOW, seed=16)
    assert [(q.kind, q.principal.tenant_id, q.principal.user_id, q.scopes) for q in calls] == [
        ("long", "t0023", "u3", ["domain:code", "project:p2"]),
        ("alias-hit", "t0027", "u1", ["domain:code/python"]),
        ("miss", "t0023", "u3", ["domain:code/python"]),
    ]
    assert calls[0].message.startswith("ok so would help okay weather feel redis sqlite team javascr")
    assert calls[1].message == "what's our postgres 10 story these days"
    # and each call comes from a random user: few repeats
    assert len({_who(q) for q in draw_queries(200, 5_000, SPEC, NOW, seed=16)}) > 150


def test_no_phase_of_a_run_resends_a_call_of_an_earlier_phase() -> None:
    # the recall caches make a repeated (user, message) nearly free: a phase that reused the
    # warm-up's calls would measure the caches, not recall
    from benchmarks.fastpath_bench import Phases, parse_args, traffic

    args = parse_args(["--warmup", "50", "--queries", "40", "--rate", "3", "--paced-s", "10", "--ceiling-calls", "60"])
    for shape in ("sessions", "random"):
        calls = traffic(args, shape, 5_000, SPEC)
        phases = Phases.split(calls, args)
        slices = [phases.warmup, phases.timed, phases.paced, phases.ceiling]
        assert [len(s) for s in slices] == [50, 40, 31, 60]
        seen: set[tuple[str, str, str]] = set()
        for part in slices:
            keys = {(q.principal.tenant_id, q.principal.user_id, q.message) for q in part}
            assert not keys & seen
            seen |= keys


def test_the_paced_timeline_puts_each_answer_in_the_second_it_was_due() -> None:
    from benchmarks.fastpath_bench import timeline

    # from the first due time: second 0 nine quick answers and one slow; second 2 one (second 1
    # had none answered)
    answered = [(102.5, 7.0)] + [(100.0 + i * 0.1, 5.0) for i in range(9)] + [(100.95, 250.0)]
    rows = timeline(answered)
    assert [row[0] for row in rows] == [0.0, 2.0]
    _, n, p50, p99, worst = rows[0]
    assert (n, p50, worst) == (10, 5.0, 250.0)
    assert p99 == 250.0  # nearest rank: the slow answer is the 10th of 10
    assert rows[1] == [2.0, 1, 7.0, 7.0, 7.0]
    assert timeline([]) == []


def test_the_warm_up_is_repeated_until_every_worker_took_a_share() -> None:
    from benchmarks.fastpath_bench import every_worker_took_part

    # uvicorn's children: two workers and the idle resource tracker
    assert every_worker_took_part([0.0, 5.66, 3.25], workers=2)
    assert not every_worker_took_part([0.0, 0.07, 7.55], workers=2)  # all eight connections on one
    assert every_worker_took_part([7.55], workers=1)
    assert not every_worker_took_part([0.0, 4.0], workers=3)  # fewer children than workers
