"""The load generator's pure parts: percentiles, the mix, the words it names beliefs with."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Awaitable, Callable

import pytest
from pydantic import BaseModel
from tenure_client import AsyncTenure, RateLimited, ServiceUnavailable, TenureError

from loadtest import names
from loadtest import verification as verification_module
from loadtest.drills import Probe
from loadtest.generator import Fleet, FleetUser, LoadConfig, _Run, parse_mix
from loadtest.http import Outcome, sdk_call
from loadtest.report import LoadReport, OpStats, Sample, TransportError, TurnRecord, WriteRecord
from loadtest.stats import LatencySummary, percentile
from loadtest.verification import RETRIES, Verification, _Checker


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) == 0.0
    # unsorted input, and a value that was observed (no interpolation between 10 and 20)
    assert percentile([20.0, 10.0], 50) == 10.0
    assert percentile([20.0, 10.0], 51) == 20.0


def test_percentile_rejects_out_of_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_latency_summary() -> None:
    summary = LatencySummary.of([4.0, 1.0, 3.0, 2.0])
    assert summary == LatencySummary(n=4, p50=2.0, p95=4.0, p99=4.0, max=4.0, mean=2.5)
    assert LatencySummary.of([]).n == 0


def test_parse_mix() -> None:
    assert parse_mix("recall=80,write=15,turn=5") == {"recall": 80, "write": 15, "turn": 5}
    assert parse_mix(" recall = 1 , turn=0 ") == {"recall": 1, "turn": 0}


@pytest.mark.parametrize(
    "text", ["recall", "recall=x", "read=5", "recall=-1", "recall=0,write=0", "", "recall=5,bogus=1"]
)
def test_parse_mix_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="mix|weight|entry"):
        parse_mix(text)


def _one_edit_apart(a: str, b: str) -> bool:
    """Same length: one substitution or one adjacent transposition (what fuzziness 1 reaches)."""
    diff = [i for i in range(len(a)) if a[i] != b[i]]
    if len(diff) == 1:
        return True
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def test_codewords_are_letters_and_never_one_edit_apart() -> None:
    words = [names.codeword(n) for n in range(600)]
    assert len(set(words)) == len(words)
    assert all(w.isalpha() and w.islower() and len(w) == 6 for w in words)
    assert not [(a, b) for a, b in itertools.combinations(words, 2) if _one_edit_apart(a, b)]
    with pytest.raises(ValueError, match="out of range"):
        names.codeword(names.CAPACITY)


def test_turn_tokens_fit_the_scripted_marker() -> None:
    from loadtest.scripted_llm import TURN_MARKER

    token = names.turn_token(names.run_tag(), 12345)
    found = TURN_MARKER.search(f"x [[turn:{token} scope:project:shared]]")
    assert found is not None and found.group(1) == token


def test_op_stats_split_successes_and_failures() -> None:
    samples = [
        Sample(0.0, "recall", "200", 10.0, True),
        Sample(0.1, "recall", "200", 30.0, True),
        Sample(0.2, "recall", "503", 2.0, False),
        Sample(0.3, "recall", "timeout", 1000.0, False),
        Sample(0.4, "write", "201", 50.0, True),
    ]
    stats = OpStats.of("recall", samples, elapsed_s=2.0)
    assert (stats.count, stats.successes, stats.failures) == (4, 2, 2)
    assert stats.throughput_ok_s == 1.0
    assert stats.latency_ok_ms.max == 30.0 and stats.latency_failed_ms.max == 1000.0
    assert stats.errors == {"503": 1, "timeout": 1}


def test_verification_fails_on_any_loss_or_leak() -> None:
    assert Verification().ok
    for field in (
        "lost_writes",
        "unrecallable_writes",
        "lost_extractions",
        "duplicate_extractions",
        "reapplied_extractions",
        "isolation_leaks",
    ):
        result = Verification()
        getattr(result, field).append({"belief_id": "x"})
        assert not result.ok, field


def test_report_json_is_compact_and_complete() -> None:
    samples = [Sample(0.5, "write", "201", 12.5, True)]
    report = LoadReport(
        config={},
        started_at="2026-11-30T00:00:00+00:00",
        elapsed_s=1.0,
        ops={op: OpStats.of(op, samples, 1.0) for op in ("recall", "write", "turn")},
        timeline=samples,
        acknowledged_writes=[],
        acknowledged_turns=[],
        unacknowledged_writes=[],
        unacknowledged_turns=[],
        isolation_leaks=[],
        recall_expected_hits=0,
        recall_missed_hits=[],
        load_average_before=(0.0, 0.0, 0.0),
        load_average_after=(0.0, 0.0, 0.0),
    )
    data = report.to_json()
    assert data["timeline"] == [[0.5, "write", "201", 12.5, 1]]
    assert data["ops"]["write"]["throughput_ok_s"] == 1.0
    assert data["total_requests"] == 1 and data["total_errors"] == 0
    assert "write" in report.format_summary()


def _two_tenant_fleet() -> tuple[LoadConfig, Fleet]:
    users = [
        FleetUser(0, "load-t-0", "tawordaa", "u0", "key0"),
        FleetUser(1, "load-t-1", "tawordbb", "u0", "key1"),
    ]
    seeds = [
        WriteRecord("load-x-seed-a", "load-t-0", 0, "project:shared", "tawordaa saaaaaa", "load_seed_a"),
        WriteRecord("load-x-seed-b", "load-t-1", 1, "project:shared", "tawordbb saaaaab", "load_seed_b"),
    ]
    fleet = Fleet("tag", ["load-t-0", "load-t-1"], users, seeds)
    for seed in seeds:
        fleet.own(seed.canonical_name, seed.tenant)  # as provision() does
    return LoadConfig(url="http://unused", operator_key="op"), fleet


def test_a_recall_answer_with_another_tenants_belief_is_a_leak() -> None:
    config, fleet = _two_tenant_fleet()
    run = _Run(config, fleet, client=None, started=0.0)  # type: ignore[arg-type]
    reader = fleet.user(0)
    assert not run._leaks(reader, [{"id": "load-x-seed-a", "canonical_name": "load_seed_a"}], "q")
    assert not run._leaks(reader, [{"id": "other", "canonical_name": "unknown_name"}], "q")
    assert run._leaks(reader, [{"id": "load-x-seed-b", "canonical_name": "load_seed_b"}], "q")
    assert [leak["owner_tenant"] for leak in run.leaks] == ["load-t-1"]


def test_the_verifier_counts_leaks_in_its_own_reads() -> None:
    config, fleet = _two_tenant_fleet()
    report = LoadReport(
        config={}, started_at="", elapsed_s=0.0, ops={}, timeline=[], acknowledged_writes=[],
        acknowledged_turns=[TurnRecord("tokenabc", "user:universal", "load-t-1", 1, "s")],
        unacknowledged_writes=[], unacknowledged_turns=[], isolation_leaks=[], recall_expected_hits=0,
        recall_missed_hits=[], load_average_before=(0, 0, 0), load_average_after=(0, 0, 0),
    )  # fmt: skip
    checker = _Checker(config, fleet, report, client=None)  # type: ignore[arg-type]
    checker.note_leaks(fleet.user(0), [{"id": "b", "canonical_name": "load_turn_tokenabc"}], "list")
    checker.note_leaks(fleet.user(1), [{"id": "b", "canonical_name": "load_turn_tokenabc"}], "list")
    assert [leak["reader_tenant"] for leak in checker.result.isolation_leaks] == ["load-t-0"]
    assert not checker.result.ok


def test_an_sdk_call_to_a_dead_server_is_a_connect_failure() -> None:
    """Through the SDK a refused connection is still told apart from a hung server (the drills'
    criteria depend on it), and nothing is retried: one attempt, one outcome."""
    with socket.socket() as sock:  # a port nothing listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def outcome() -> Outcome:
        async with AsyncTenure(f"http://127.0.0.1:{port}", "tnr_x_y", timeout=5, max_retries=0) as sdk:
            return await sdk_call(sdk.recall("anything"), 200)

    got = asyncio.run(outcome())
    assert (got.status, got.kind, got.body) == (None, "connect", None)


def test_a_server_that_closes_without_answering_is_other_with_httpx_reason() -> None:
    """A connection closed with no answer is "other", and the report keeps httpx's reason: a
    compose run once failed on one such recall and its report could not say why."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up_once() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)  # the request has begun to arrive
        conn.shutdown(socket.SHUT_WR)  # the server hangs up without a byte of answer
        # and reads the rest until the client leaves: closing with unread bytes would reset the
        # connection (a ReadError, not the disconnect this is about)
        while conn.recv(65536):
            pass
        conn.close()

    server = threading.Thread(target=hang_up_once, daemon=True)
    server.start()

    async def outcome() -> Outcome:
        async with AsyncTenure(f"http://127.0.0.1:{port}", "tnr_x_y", timeout=5, max_retries=0) as sdk:
            return await sdk_call(sdk.recall("anything"), 200)

    got = asyncio.run(outcome())
    server.join(5)
    listener.close()
    assert (got.status, got.kind) == (None, "other")
    assert got.error is not None and got.error.startswith("RemoteProtocolError: ")

    config, fleet = _two_tenant_fleet()
    run = _Run(config, fleet, client=None, started=0.0)  # type: ignore[arg-type]
    run.record("recall", 1.5, got.kind, got.latency_ms, False, got.error)
    run.record("recall", 2.0, "200", 3.0, True)
    report = run.report("2026-12-05T00:00:00+00:00", 3.0, (0.0, 0.0, 0.0))
    assert [(e.t_s, e.op, e.outcome) for e in report.transport_errors] == [(1.5, "recall", "other")]
    assert report.to_json()["transport_errors"][0]["error"] == got.error
    assert f"no answer at 1.50 s (recall, {got.latency_ms:.0f} ms): RemoteProtocolError" in report.format_summary()


def test_transport_errors_kept_are_bounded() -> None:
    config, fleet = _two_tenant_fleet()
    run = _Run(config, fleet, client=None, started=0.0)  # type: ignore[arg-type]
    for i in range(200):
        run.record("write", float(i), "connect", 1.0, False, "ConnectError: refused")
    assert len(run.transport_errors) == 50
    assert run.transport_errors[0] == TransportError(0.0, "write", "connect", 1.0, "ConnectError: refused")


def _empty_report() -> LoadReport:
    return LoadReport(
        config={}, started_at="", elapsed_s=0.0, ops={}, timeline=[], acknowledged_writes=[],
        acknowledged_turns=[], unacknowledged_writes=[], unacknowledged_turns=[], isolation_leaks=[],
        recall_expected_hits=0, recall_missed_hits=[], load_average_before=(0, 0, 0),
        load_average_after=(0, 0, 0),
    )  # fmt: skip


class _Answer(BaseModel):
    ok: bool = True


def _scripted_send(answers: list[TenureError | None]) -> tuple[list[int], Callable[[AsyncTenure], Awaitable[_Answer]]]:
    """A request that fails with each scripted error in turn, then succeeds; counts its attempts."""
    attempts: list[int] = []

    async def send(_sdk: AsyncTenure) -> _Answer:
        attempts.append(1)
        error = answers[len(attempts) - 1] if len(attempts) <= len(answers) else None
        if error is not None:
            raise error
        return _Answer()

    return attempts, send


def test_the_verifier_waits_out_rate_limits_instead_of_judging_a_write_lost() -> None:
    """The compose check once failed on its verifier's own burst: 429s on the reads were reported as
    lost writes. A 429 is waited out (as long as Retry-After says), however many come in a row."""
    config, fleet = _two_tenant_fleet()
    checker = _Checker(config, fleet, _empty_report(), client=None)  # type: ignore[arg-type]
    limited = [RateLimited("slow down", code="rate_limited", status=429, retry_after_s=0.01) for _ in range(6)]
    attempts, send = _scripted_send(list(limited))
    got = asyncio.run(checker.request(fleet.user(0), send))
    assert (got.status, len(attempts)) == (200, 7)


def test_a_check_queued_behind_its_credentials_others_keeps_its_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patience for 429s runs from a check's first 429, and a check waiting one out keeps its
    credential's slot. A 600 s compose run judged 11 writes lost ("GET 429"): their checks had
    queued behind 4,000 others for longer than the patience before their first request."""
    monkeypatch.setattr(verification_module, "RATE_LIMITED_PATIENCE_S", 0.6)
    monkeypatch.setattr(verification_module, "_retry_after_s", lambda _outcome: 0.01)
    config, fleet = _two_tenant_fleet()
    checker = _Checker(config, fleet, _empty_report(), client=None)  # type: ignore[arg-type]

    async def check() -> Outcome:
        sent: list[int] = []

        async def send(_sdk: AsyncTenure) -> _Answer:
            sent.append(1)
            await asyncio.sleep(0.02)
            if len(sent) == 1:  # the server paces the credential once per check
                raise RateLimited("slow down", code="rate_limited", status=429, retry_after_s=0.01)
            return _Answer()

        return await checker.request(fleet.user(0), send)

    async def all_checks() -> list[Outcome]:
        return await asyncio.gather(*(check() for _ in range(120)))  # ~1.5 s behind 4 slots

    assert [outcome.status for outcome in asyncio.run(all_checks())] == [200] * 120


def test_the_verifier_gives_up_on_a_persistent_fault() -> None:
    config, fleet = _two_tenant_fleet()
    checker = _Checker(config, fleet, _empty_report(), client=None)  # type: ignore[arg-type]
    down = [ServiceUnavailable("down", code="unavailable", status=503) for _ in range(10)]
    attempts, send = _scripted_send(list(down))
    got = asyncio.run(checker.request(fleet.user(0), send))
    assert (got.status, len(attempts)) == (503, RETRIES)


def test_a_rate_limited_request_is_reported_but_is_not_an_error() -> None:
    """A 429 is the rate limit doing its job: the report counts it apart, and the load test's
    exit status (``total_errors``) and the compose check do not fail on it."""
    samples = [
        Sample(0.1, "recall", "200", 5.0, True),
        Sample(0.2, "recall", "429", 1.0, False),
        Sample(0.3, "write", "429", 1.0, False),
        Sample(0.4, "write", "503", 2.0, False),
    ]
    ops = {op: OpStats.of(op, samples, 1.0) for op in ("recall", "write", "turn")}
    report = _empty_report()
    report.ops = ops
    assert (ops["recall"].failures, ops["recall"].rate_limited) == (1, 1)
    assert (report.total_errors, report.total_rate_limited) == (1, 2)
    assert report.to_json()["total_rate_limited"] == 2
    assert ops["write"].to_json()["errors"] == {"429": 1, "503": 1}  # still listed among the outcomes
    assert "2 rate limited" in report.format_summary()


class _ScriptedBeliefs:
    def __init__(self, answers: list[TenureError | None]):
        self.attempts, self._send = _scripted_send(answers)

    async def get(self, _belief_id: str) -> _Answer:
        return await self._send(None)  # type: ignore[arg-type]


class _ScriptedSdk:
    def __init__(self, beliefs: _ScriptedBeliefs):
        self.beliefs = beliefs

    async def __aenter__(self) -> _ScriptedSdk:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_the_drill_probe_reads_its_writes_back_as_the_verifier_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault drills' probe has its own client; a 429 on its read-back is waited out, not a
    lost write (it used to stop at the first answer below 500), and a persistent 503 is still one."""
    probe = Probe("http://127.0.0.1:9", "key")
    probe.acknowledged = ["probe-a"]
    limited = [RateLimited("slow down", code="rate_limited", status=429, retry_after_s=0.01) for _ in range(5)]
    beliefs = _ScriptedBeliefs(list(limited))
    monkeypatch.setattr(probe, "_sdk", lambda: _ScriptedSdk(beliefs))
    assert asyncio.run(probe.lost_writes()) == []
    assert len(beliefs.attempts) == 6
    down = _ScriptedBeliefs([ServiceUnavailable("down", code="unavailable", status=503) for _ in range(10)])
    monkeypatch.setattr(probe, "_sdk", lambda: _ScriptedSdk(down))
    assert asyncio.run(probe.lost_writes()) == ["probe-a"]
    assert len(down.attempts) == RETRIES
