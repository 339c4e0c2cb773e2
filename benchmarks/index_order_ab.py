"""Recall's searches on two copies of the beliefs index that differ only in document order.

Issue 16: the beliefs index is sorted by ``tenant_id`` (template v6, ``index.sort``). Every recall
is filtered to one tenant; in a sorted index a tenant's beliefs are one run of documents in each
segment, so the term postings of a recall's clauses (which hold every tenant's documents on the
shard) are skipped over in blocks. This measures what that is worth on a loaded corpus, with
nothing but OpenSearch in the measurement:

1. The real API runs in this process (``recall_floor.record``: every cache as deployed) over the
   corpus behind the namespace's alias, answers ``--warmup`` recalls, then records the OpenSearch
   requests of ``--queries`` more as sent.
2. Their searches (``_msearch``, ``_search``) are replayed raw (``http.client``, one keep-alive
   connection) against ``--index-a`` and ``--index-b`` in turn, alternating the order for
   ``--rounds`` rounds so drift of the machine falls on both; with ``--opensearch-pid`` the node's
   CPU per search too (``/proc``).
3. The ids of every answer's hits, in order, are compared between the two indices: a sort must
   not change an answer.

``--sorted-copy NAME`` first makes index B: a copy of index A created with A's settings and
mappings plus the current template's ``index.sort``, filled with ``_reindex`` (routing kept) and
force-merged to one segment per shard like A after a load. The copy has no vocabulary units
(``_reindex`` cannot copy them and the replayed searches do not read them): it is for this
measurement only, not an index to serve from (``tenure reindex beliefs`` makes that one).

    .venv/bin/python -m benchmarks.index_order_ab --opensearch-url $OS --redis-url $REDIS \\
        --opensearch-pid $OS_PID --traffic random --sorted-copy order-ab-sorted

This is a benchmark, not a test: it prints figures (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import urllib.parse
from typing import Any

from opensearchpy import OpenSearch

from benchmarks import fastpath_bench as fb
from benchmarks import recall_floor
from benchmarks.recall_bench import Spec
from benchmarks.recall_floor import Sent
from loadtest.stats import latency_block
from service.storage.templates import BELIEFS, index_sort

SEARCHES = ("_msearch", "_search")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    recall_floor.add_recording_arguments(parser)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--index-a", default=None, help="default: the index behind the namespace's alias")
    parser.add_argument("--index-b", default=None, help="an existing copy to compare with")
    parser.add_argument("--sorted-copy", default=None, help="make index B under this name (deleted first)")
    parser.add_argument("--opensearch-pid", type=int, default=None, help="for its CPU per search")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def create_like(client: OpenSearch, source: str, name: str, **index_settings: Any) -> None:
    """Index ``name`` (deleted first) with ``source``'s settings and mappings, ``index_settings``
    on top, and refreshes off for a bulk copy."""
    described = client.indices.get(index=source)[source]
    settings = described["settings"]["index"]
    for key in ("creation_date", "uuid", "version", "provided_name", "replication", "routing"):
        settings.pop(key, None)
    settings.update(index_settings)
    settings["refresh_interval"] = "-1"  # a bulk copy: one refresh at the end
    client.indices.delete(index=name, ignore=[404])
    client.indices.create(index=name, body={"settings": {"index": settings}, "mappings": described["mappings"]})


def merge_copy(client: OpenSearch, name: str) -> float:
    """Refresh on again and one segment per shard, like the loaded index; returns the seconds."""
    started = time.monotonic()
    client.indices.put_settings(index=name, body={"index": {"refresh_interval": "1s"}})
    client.indices.forcemerge(index=name, max_num_segments=1, request_timeout=3600)
    return round(time.monotonic() - started, 1)


def make_sorted_copy(client: OpenSearch, source: str, name: str) -> dict[str, Any]:
    """Index ``name``: ``source``'s settings and mappings with the template's sort, its documents
    copied and merged to one segment per shard. Returns how long each step took."""
    create_like(client, source, name, sort={"field": index_sort(BELIEFS), "order": ["asc"] * len(index_sort(BELIEFS))})
    started = time.monotonic()
    client.reindex(
        body={"source": {"index": source, "size": 2000}, "dest": {"index": name}},
        slices=2,
        refresh=True,
        request_timeout=3600,
    )
    return {"copy_s": round(time.monotonic() - started, 1), "merge_s": merge_copy(client, name)}


def process_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _on_index(sent: Sent, index: str) -> Sent:
    """The same search against ``index``: the ``_msearch`` header lines, or the path's index."""
    if sent.kind == "_msearch":
        lines = (sent.body or b"").decode().strip().split("\n")
        headers = [json.loads(line) for line in lines[0::2]]
        body = "".join(f"{json.dumps({**h, 'index': index})}\n{q}\n" for h, q in zip(headers, lines[1::2], strict=True))
        return Sent(sent.method, sent.path, body.encode())
    _old_index, _, query = sent.path.lstrip("/").partition("/")
    return Sent(sent.method, f"/{index}/{query}", sent.body)


def _ids(answer: bytes) -> list[list[str]]:
    decoded = json.loads(answer)
    items = decoded.get("responses", [decoded])
    # a hit without ``_id`` (a tenant's vocabulary read asks only for each document's units, from
    # doc values) is compared whole
    return [
        [hit.get("_id") or json.dumps(hit, sort_keys=True) for hit in item.get("hits", {}).get("hits", [])]
        for item in items
    ]


def replay(args: argparse.Namespace, searches: list[Sent], indices: list[str]) -> dict[str, Any]:
    return replay_variants(args, {index: [_on_index(s, index) for s in searches] for index in indices})


def replay_variants(args: argparse.Namespace, sent: dict[str, list[Sent]]) -> dict[str, Any]:
    """Each variant's searches (the same searches, changed one way per variant) replayed raw in
    alternating order for ``--rounds`` rounds: latency per kind, the node's CPU per search, and
    how many answers have the first variant's hits."""
    parsed = urllib.parse.urlparse(args.opensearch_url.split(",")[0])
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 9200)
    indices = list(sent)
    searches = sent[indices[0]]
    times: dict[str, dict[str, list[float]]] = {index: {kind: [] for kind in SEARCHES} for index in indices}
    cpu = dict.fromkeys(indices, 0.0)
    answers: dict[str, list[list[list[str]]]] = {index: [] for index in indices}
    for round_no in range(args.rounds):
        for index in indices if round_no % 2 == 0 else indices[::-1]:
            before = process_cpu_s(args.opensearch_pid)
            for request in sent[index]:
                started = time.perf_counter()
                connection.request(request.method, request.path, body=request.body, headers=request_headers(request))
                response = connection.getresponse()
                answer = response.read()
                times[index][request.kind].append((time.perf_counter() - started) * 1000)
                if response.status >= 300:
                    raise RuntimeError(f"{request.path} answered {response.status}: {answer[:300]!r}")
                if round_no == 0:
                    answers[index].append(_ids(answer))
            cpu[index] += process_cpu_s(args.opensearch_pid) - before
    report: dict[str, Any] = {}
    for index in indices:
        report[index] = {kind: latency_block(values) for kind, values in times[index].items() if values}
        if args.opensearch_pid:
            report[index]["opensearch_cpu_ms_per_search"] = round(cpu[index] * 1000 / (len(searches) * args.rounds), 3)
    first, *others = indices
    report["same_hits"] = {
        other: sum(a == b for a, b in zip(answers[first], answers[other], strict=True)) for other in others
    }
    report["searches"] = len(searches)
    return report


def request_headers(sent: Sent) -> dict[str, str]:
    return {"Content-Type": "application/x-ndjson" if sent.kind == "_msearch" else "application/json"}


def recorded_requests(args: argparse.Namespace) -> list[Sent]:
    """Every OpenSearch request of ``--queries`` recalls through the real API, after ``--warmup``
    more (``_mtermvectors``, ``_msearch``, ``_search``), as sent."""
    floor_args = recall_floor.parse_args(
        ["--opensearch-url", args.opensearch_url, "--redis-url", args.redis_url, "--size", str(args.size)]
        + ["--traffic", args.traffic, "--warmup", str(args.warmup), "--queries", str(args.queries)]
    )
    calls = fb.parse_args(["--queries", str(args.queries), "--warmup", str(args.warmup), "--seed", str(args.seed)])
    spec = Spec(tenants=calls.tenants, users_per_tenant=calls.users_per_tenant)
    queries = fb.traffic(calls, args.traffic, args.size, spec)[: args.warmup + args.queries]
    return [sent for recall in recall_floor.record(floor_args, queries) for sent in recall.opensearch]


def recorded_searches(args: argparse.Namespace) -> list[Sent]:
    """The searches of ``--queries`` recalls through the real API, after ``--warmup`` more."""
    return [sent for sent in recorded_requests(args) if sent.kind in SEARCHES]


def index_behind_alias(client: OpenSearch, size: int) -> str:
    """The index the loaded corpus of ``size`` beliefs is served from."""
    return str(next(iter(client.indices.get_alias(name=BELIEFS.alias(fb.namespace_of(size))))))


def write_report(args: argparse.Namespace, argv: list[str] | None, report: dict[str, Any]) -> None:
    """Print the report (with the command and the machine's load) and keep it in ``--out``."""
    report = {
        **report,
        "command": f"python -m benchmarks.{report['what']} " + " ".join(sys.argv[1:] if argv is None else argv),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg": os.getloadavg(),
        "traffic": args.traffic,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenSearch(args.opensearch_url.split(","), timeout=120)
    index_a = args.index_a or index_behind_alias(client, args.size)
    copy = make_sorted_copy(client, index_a, args.sorted_copy) if args.sorted_copy else None
    index_b = args.sorted_copy or args.index_b
    if index_b is None:
        raise SystemExit("name index B: --index-b or --sorted-copy")
    searches = recorded_searches(args)
    report = {
        "what": "index_order_ab",
        "index_a": index_a,
        "index_b": index_b,
        "sort_b": index_sort(BELIEFS),
        "sorted_copy": copy,
        **replay(args, searches, [index_a, index_b]),
    }
    write_report(args, argv, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
