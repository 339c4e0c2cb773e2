"""Recall's OpenSearch requests through aiohttp and through the keep-alive connection.

The event loop's OpenSearch client (recall in the API and the proxy) sent its requests through
opensearch-py's ``AIOHttpConnection``; it now sends them through
``service.storage.keepalive.KeepAliveConnection`` (a request written to a kept-alive socket, the
answer parsed by httptools). Everything above the connection is opensearch-py's in both. This
measures the difference with nothing else in the measurement:

1. The real API runs in this process (``recall_floor.record``, every cache as deployed), answers
   ``--warmup`` recalls, then records every OpenSearch request of ``--queries`` more, as sent
   (``_mtermvectors``, ``_msearch``, ``_search``).
2. Each is sent again through an ``AsyncOpenSearch`` built as the API builds it, once with each
   connection class (both with the service's per-node metrics), one request at a time on uvloop,
   alternating the order for ``--rounds`` rounds: this process's CPU per request from
   ``getrusage``, the latency by kind, and the node's CPU per request (``--opensearch-pid``).
3. Every answer must decode to the same JSON through both ("took" aside).

    .venv/bin/python -m benchmarks.keepalive_ab --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --traffic sessions

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

import uvloop
from opensearchpy import AIOHttpConnection

from benchmarks import index_order_ab, recall_floor
from benchmarks.recall_floor import Sent
from loadtest.stats import latency_block
from service.config import Settings
from service.storage.client import ObservedAsyncConnection, _CountsNodeFailures, build_async_client


class AiohttpConnection(_CountsNodeFailures, AIOHttpConnection):
    """The connection before (opensearch-py's aiohttp one, with the same per-node metrics)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.pop("connect_timeout", None)  # aiohttp's connect is bounded by the request timeout
        super().__init__(*args, **kwargs)


CONNECTIONS: dict[str, type[Any]] = {"aiohttp": AiohttpConnection, "keepalive": ObservedAsyncConnection}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    recall_floor.add_recording_arguments(parser)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--opensearch-pid", type=int, default=None, help="for its CPU per request")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _comparable(answer: Any) -> Any:
    if isinstance(answer, dict):
        return {k: _comparable(v) for k, v in answer.items() if k != "took"}
    if isinstance(answer, list):
        return [_comparable(v) for v in answer]
    return answer


async def replay(args: argparse.Namespace, requests: list[Sent]) -> dict[str, Any]:
    settings = Settings(opensearch_url=args.opensearch_url)
    # the API's own options (pool size, timeouts, serializer, retries), one connection class each
    clients = {name: build_async_client(settings, cls) for name, cls in CONNECTIONS.items()}
    names = list(clients)
    times: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    own = dict.fromkeys(names, 0.0)
    node = dict.fromkeys(names, 0.0)
    answers: dict[str, list[Any]] = {n: [] for n in names}
    for round_no in range(args.rounds):
        for name in names if round_no % 2 == 0 else names[::-1]:
            transport = clients[name].transport
            own_before, node_before = _own_cpu_s(), index_order_ab.process_cpu_s(args.opensearch_pid)
            for sent in requests:
                started = time.perf_counter()
                body = sent.body.decode() if sent.body else None  # as the client methods pass it
                answer = await transport.perform_request(
                    sent.method, sent.path, body=body, headers=index_order_ab.request_headers(sent)
                )
                times[name].setdefault(sent.kind, []).append((time.perf_counter() - started) * 1000)
                if round_no < 2:
                    answers[name].append(_comparable(answer))
            own[name] += _own_cpu_s() - own_before
            node[name] += index_order_ab.process_cpu_s(args.opensearch_pid) - node_before
    for client in clients.values():
        await client.close()
    sent_total = len(requests) * args.rounds
    report: dict[str, Any] = {"requests": len(requests), "rounds": args.rounds}
    for name in names:
        report[name] = {
            "client_cpu_us_per_request": round(own[name] / sent_total * 1e6, 1),
            "opensearch_cpu_ms_per_request": round(node[name] / sent_total * 1000, 3) if args.opensearch_pid else None,
            "latency_ms": {kind: latency_block(values) for kind, values in times[name].items()},
        }
    report["same_answers"] = sum(a == b for a, b in zip(*answers.values(), strict=True))
    report["answers_compared"] = len(answers[names[0]])
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests = index_order_ab.recorded_requests(args)
    report = {"what": "keepalive_ab", **uvloop.run(replay(args, requests))}
    index_order_ab.write_report(args, argv, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
