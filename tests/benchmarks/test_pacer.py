"""The compiled load client (``benchmarks/pacer.py``) against a small local HTTP/1.1 server.

Its figures stand in for the Python clients' in ``fastpath_bench``, so what they count must be
what those count: the SDK's exact request, latency from the due time (a slow answer is late, a
send is never postponed), failures by cause (an answer's status, a refused connection, a request
shed with every lane busy, one unanswered past the grace), a connection the server closed reused
without an error, and the pacer's own CPU."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tenure_client import Tenure

from benchmarks import pacer
from benchmarks.fastpath_bench import MAX_IN_FLIGHT, GoPasses, charged
from benchmarks.recall_bench import Query
from deploy.devstack import free_port
from service.domain.principal import Principal

SLOW_S = 0.05


class Handler(BaseHTTPRequestHandler):
    """Answers by the message: ``slow`` after SLOW_S, ``reject`` 429, ``close`` then closes the
    connection, ``chunked`` in chunks, ``hang`` never; anything else at once. Every request is
    kept in ``server.seen``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *_: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((dict(self.headers), body))  # type: ignore[attr-defined]
        message = json.loads(body)["query"]
        if message == "hang":
            time.sleep(3)
            return
        if message == "slow":
            time.sleep(SLOW_S)
        answer = b'{"injection": {"text": "' + b"x" * 5000 + b'"}}'
        self.send_response(429 if message == "reject" else 200)
        self.send_header("Content-Type", "application/json")
        if message == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (answer[:100], answer[100:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        if message == "close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    httpd.daemon_threads = True
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pacer.build(tmp_path_factory.mktemp("pacer-bin"))


def url_of(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def queries(*messages: str) -> list[Query]:
    principal = Principal(tenant_id="t1", user_id="u1")
    return [Query(kind=f"kind-{m}", principal=principal, scopes=["domain:code"], message=m) for m in messages]


def plan_of(httpd: ThreadingHTTPServer, tmp_path: Path, *messages: str) -> pacer.Plan:
    return pacer.Plan.write(url_of(httpd), queries(*messages), lambda q: "tnr_key_for_" + q.principal.user_id, tmp_path)


@pytest.mark.timeout(120)
def test_sends_the_sdks_request_and_paces_from_due_times(
    server: ThreadingHTTPServer, binary: Path, tmp_path: Path
) -> None:
    plan = plan_of(server, tmp_path, "quick one", "slow")
    out = pacer.run(binary, plan, "paced", rate=100, seconds=1.0, grace_s=2.0, max_in_flight=8)

    pacer_headers, pacer_body = server.seen[0]  # type: ignore[attr-defined]
    with Tenure(url_of(server), "tnr_key_for_u1", max_retries=0) as sdk:
        sdk.recall_json("quick one", scopes=["domain:code"])
    sdk_headers, sdk_body = server.seen[-1]  # type: ignore[attr-defined]
    assert pacer_body == sdk_body
    assert json.loads(pacer_body)["query"] == "quick one"
    sent_by_pacer = {name.lower(): value for name, value in pacer_headers.items()}
    sent_by_sdk = {name.lower(): value for name, value in sdk_headers.items()}
    for name in ("authorization", "content-type", "user-agent"):
        assert sent_by_pacer[name] == sent_by_sdk[name]
    assert sent_by_pacer["authorization"] == "Bearer tnr_key_for_u1"
    assert out.causes == {}
    assert len(out.answered) == 100
    offsets = sorted(at for at, _, _ in out.answered)
    assert offsets[1] - offsets[0] == pytest.approx(0.01, abs=1e-6)  # due times, not send times
    slow = [ms for _, ms, kind in out.answered if kind == "kind-slow"]
    quick = [ms for _, ms, kind in out.answered if kind == "kind-quick one"]
    assert len(slow) == len(quick) == 50
    assert min(slow) >= SLOW_S * 1000
    assert sorted(quick)[len(quick) // 2] < SLOW_S * 1000
    assert out.cpu_s > 0
    assert abs(out.start_unix_s - time.time()) < 60
    assert 1 <= out.connects <= 8  # at most one per lane: the server closed none


@pytest.mark.timeout(120)
def test_counts_answers_refusals_sheds_and_the_unanswered(
    server: ThreadingHTTPServer, binary: Path, tmp_path: Path
) -> None:
    rejected = pacer.run(
        binary, plan_of(server, tmp_path, "reject"), "paced", rate=50, seconds=0.2, grace_s=1.0, max_in_flight=4
    )
    assert rejected.causes == {"HTTP 429": 10}
    assert rejected.answered == []

    # 2 lanes, each answer 50 ms, one due every 10 ms: most requests find every lane busy
    shed = pacer.run(
        binary, plan_of(server, tmp_path, "slow"), "paced", rate=100, seconds=0.5, grace_s=1.0, max_in_flight=2
    )
    assert shed.causes["shed"] > 20
    assert len(shed.answered) + shed.causes["shed"] == 50

    hung = pacer.run(
        binary, plan_of(server, tmp_path, "hang"), "paced", rate=10, seconds=0.2, grace_s=0.3, max_in_flight=4
    )
    assert hung.causes == {"unanswered": 2}

    refused = plan_of(server, tmp_path, "anything")
    nobody = pacer.Plan(f"http://127.0.0.1:{free_port()}/v1/recall", refused.path, refused.kinds)
    assert pacer.run(binary, nobody, "paced", rate=20, seconds=0.1, grace_s=1.0, max_in_flight=2).causes == {
        "ConnectError": 2
    }
    assert pacer.run(binary, nobody, "sequential", max_s=0.5).causes["ConnectError"] >= 1


@pytest.mark.timeout(120)
def test_reads_chunked_and_closing_answers_and_reconnects(
    server: ThreadingHTTPServer, binary: Path, tmp_path: Path
) -> None:
    plan = plan_of(server, tmp_path, "chunked", "close", "plain")
    paced_params = {"rate": 60, "seconds": 0.5, "grace_s": 1.0, "max_in_flight": 4}
    passes = (("sequential", {"max_s": 30.0}), ("paced", paced_params), ("ceiling", {"connections": 3, "seconds": 0.3}))
    for mode, params in passes:
        out = pacer.run(binary, plan, mode, **params)
        assert out.causes == {}, mode
        assert {kind for _, _, kind in out.answered} == {"kind-chunked", "kind-close", "kind-plain"}, mode
    sequential = pacer.run(binary, plan, "sequential")
    assert len(sequential.answered) == 3  # the plan once, in order
    assert [kind for _, _, kind in sequential.answered] == ["kind-chunked", "kind-close", "kind-plain"]
    assert sequential.connects == 2  # the answer that closed its connection made the second


def test_the_pacers_cpu_is_charged_to_the_client() -> None:
    used = {"cpu_s": {"api": 3.0, "loadgen": 0.2}, "other_processes_cpu_s": 0.9}
    assert charged(used, 0.7) == {"cpu_s": {"api": 3.0, "loadgen": 0.9}, "other_processes_cpu_s": 0.2}
    assert charged(used, 0.0)["cpu_s"]["loadgen"] == 0.9


@pytest.mark.timeout(120)
def test_fastpath_figures_from_the_pacer(server: ThreadingHTTPServer, binary: Path, tmp_path: Path) -> None:
    """``GoPasses`` shapes the pacer's passes like the Python clients' figures."""

    class Phases:
        timed = queries("plain", "slow") * 3
        paced = queries("plain", "slow")
        ceiling = queries("plain")

    class Api:
        url = url_of(server)

    calls = {"sequential": Phases.timed, "paced": Phases.paced, "ceiling": Phases.ceiling}
    passes = GoPasses(Api(), calls, tmp_path)  # type: ignore[arg-type]
    try:
        seq, sent, cpu_s = passes.sequential(None)
        assert (seq["n"], seq["errors"], sent, seq["stopped_at_max_s"]) == (6, 0, 6, False)
        assert cpu_s > 0
        paced, _ = passes.paced(rate=40, seconds=0.5, grace_s=1.0)
        assert (paced["sent"], paced["n"], paced["errors"]) == (20, 20, 0)
        assert set(paced["by_kind"]) == {"kind-plain", "kind-slow"}
        assert paced["by_kind"]["kind-slow"]["p50_ms"] >= SLOW_S * 1000
        first_due = datetime.fromisoformat(paced["first_due_utc"])
        assert abs((datetime.now(UTC) - first_due).total_seconds()) < 60
        assert [row[1] for row in paced["timeline"]] == [20]  # one second, all 20 in it
        ceiling, _ = passes.ceiling(clients=2, seconds=0.3)
        assert ceiling["errors"] == 0
        assert ceiling["recalls_per_s"] > 50
        assert ceiling["connects"] == 2  # one per client
        assert 1 <= paced["connects"] <= MAX_IN_FLIGHT
    finally:
        passes.close()
    assert not list(tmp_path.glob("plans/*"))
