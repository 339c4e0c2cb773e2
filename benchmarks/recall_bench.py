"""Recall latency benchmark: p50/p95/p99 of ``ContextBuilder.build`` at 10k, 100k and 1M beliefs.

Synthetic corpora spread over 1,000 tenants (several users each) are generated from one shared
vocabulary, bulk-loaded into a fresh namespace on a real OpenSearch node, and queried through the
real recall path (one ``_msearch`` of the four tiers, plus the relation-expansion round trip when a
relation hits). Queries are drawn like real messages: alias hits, misses, and long rambling
messages with code and URLs. Sizes are loaded incrementally (10k, then +90k, then +900k), so the
same documents are present at every stage.

    .venv/bin/python -m benchmarks.recall_bench --start-node --heap 4g          # own node
    .venv/bin/python -m benchmarks.recall_bench --opensearch-url http://127.0.0.1:9200

See benchmarks/README.md. This is a benchmark, not a test: it prints figures and writes a JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch, helpers

from deploy.devstack import Service, start_opensearch, start_redis
from loadtest.stats import percentile
from service.config import RecallDefaults, Settings
from service.domain.belief import Belief, BeliefType, EpistemicStatus
from service.domain.principal import Principal
from service.recall.context import ContextBuilder
from service.recall.query import clean_query
from service.storage import access
from service.storage import queries as queries_mod
from service.storage.access import ScopeView
from service.storage.beliefs import BeliefStore, doc_id
from service.storage.client import FastJSONSerializer, build_client
from service.storage.templates import BELIEFS, apply_templates, drop_namespace
from service.storage.vocabulary import UNITS_FIELD, VocabularyStore

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------ vocabulary
# One shared vocabulary for every tenant: names and aliases collide across tenants (and inside a
# tenant) the way real teams' vocabularies do.
TECH = """
redis postgres mongodb mysql sqlite kafka rabbitmq nats celery airflow dagster spark flink
kubernetes docker helm terraform ansible pulumi nomad consul vault envoy nginx traefik caddy
react vue svelte angular nextjs remix astro vite webpack esbuild rollup babel typescript
javascript python golang rust java kotlin scala elixir erlang haskell ocaml swift ruby php
fastapi django flask fastify express nestjs spring rails laravel phoenix gin actix axum
graphql grpc rest websocket webhook oauth jwt saml oidc ldap session cookie csrf cors
pytest jest vitest mocha cypress playwright selenium hypothesis tox nox poetry pipenv uv
eslint biome prettier ruff mypy pyright black isort flake8 pylint clippy rustfmt gofmt
github gitlab bitbucket jenkins circleci buildkite argo flux spinnaker tekton drone
prometheus grafana loki tempo jaeger zipkin datadog sentry honeycomb opentelemetry pagerduty
s3 gcs azure lambda cloudflare fastly vercel netlify heroku fly render railway supabase
elasticsearch opensearch solr meilisearch typesense pinecone weaviate qdrant milvus chroma
pandas numpy polars duckdb arrow parquet iceberg delta hudi dbt snowflake bigquery redshift
tailwind bootstrap sass css html dom jsx tsx wasm webgl canvas svg pwa ssr csr hydration
cache queue worker scheduler cron batch stream pipeline etl elt migration schema index shard
replica failover backup restore snapshot rollback canary bluegreen feature flag rollout
monorepo polyrepo microservice monolith gateway proxy loadbalancer cdn dns tls mtls ssh vpn
logging tracing metrics alerting oncall runbook postmortem incident sla slo sli budget
retry backoff timeout circuitbreaker ratelimit throttle debounce idempotency dedupe outbox
orm repository service controller handler middleware decorator factory singleton adapter
inheritance composition interface protocol trait generic enum union tuple dataclass pydantic
async await promise future coroutine thread process mutex semaphore channel actor eventloop
"""
WRITING = """
protagonist antagonist narrator chapter scene prologue epilogue outline draft manuscript
voice tone pacing tension subplot backstory flashback foreshadowing dialogue monologue
viewpoint perspective tense firstperson thirdperson omniscient lisbon porto paris berlin
mara redis jonah ilse tomas vera pianist detective archivist cartographer smuggler
timeline structure arc climax resolution theme motif symbol imagery metaphor rhythm
editor agent publisher query synopsis blurb cover copyedit proofread revision beta
"""
MODIFIERS = [
    "strict",
    "explicit",
    "raw",
    "typed",
    "async",
    "sync",
    "shared",
    "local",
    "remote",
    "primary",
    "legacy",
    "new",
    "old",
    "default",
    "custom",
    "minimal",
    "fast",
    "safe",
    "read",
    "write",
    "hot",
    "cold",
    "internal",
    "external",
    "public",
    "private",
    "nightly",
]
GENERIC = [
    "the",
    "weather",
    "lunch",
    "tomorrow",
    "meeting",
    "plan",
    "thoughts",
    "quick",
    "question",
    "idea",
    "honestly",
    "maybe",
    "something",
    "anything",
    "probably",
    "today",
    "yesterday",
    "week",
    "team",
    "people",
    "review",
    "call",
    "notes",
    "later",
    "great",
    "thanks",
    "sounds",
    "good",
    "okay",
    "sure",
    "help",
    "please",
    "could",
    "would",
    "should",
    "think",
    "know",
    "feel",
]
TECH_WORDS = TECH.split()
WRITING_WORDS = WRITING.split()
TEMPLATES = [
    "how should we handle {a} in the new service?",
    "what's our {a} story these days",
    "{a}?",
    "quick one: is {a} still the plan for {b}?",
    "can you remind me why we picked {a} over {b}",
    "I'm debugging a {a} issue again, what did we decide",
    "write a short example using {a} with {b}",
]
CODE_BLOCK = "```python\nimport os\nfor i in range(10):\n    print(os.environ.get('HOME'), i)\n```"


@dataclass(frozen=True)
class Spec:
    tenants: int = 1000
    users_per_tenant: int = 5
    projects_per_tenant: int = 5
    seed: int = 7


def _zipf_pick(rng: random.Random, words: list[str]) -> str:
    # a few words are everywhere, most are rare (as in real vocabularies)
    idx = min(int(rng.paretovariate(1.1)) - 1, len(words) - 1)
    return words[(idx * 7919 + rng.randrange(3)) % len(words)]


def _unit(rng: random.Random, words: list[str], max_words: int) -> list[str]:
    n = rng.choices(range(1, max_words + 1), weights=[5, 4, 1][:max_words])[0]
    out = [_zipf_pick(rng, words) if rng.random() < 0.5 else rng.choice(words) for _ in range(n)]
    if n > 1 and rng.random() < 0.3:
        out[0] = rng.choice(MODIFIERS)
    return out


def tenant_of(i: int, spec: Spec) -> str:
    return f"t{i % spec.tenants:04d}"


def user_of(i: int, spec: Spec) -> str:
    return f"u{(i // spec.tenants) % spec.users_per_tenant}"


def belief_at(i: int, spec: Spec, now: datetime) -> Belief:
    """Belief number ``i``: a pure function of (i, spec), so queries can re-derive its names."""
    rng = random.Random(spec.seed * 1_000_003 + i)
    tenant, owner = tenant_of(i, spec), user_of(i, spec)
    roll = rng.random()
    scope: list[str]
    if roll < 0.55:
        scope, words = ["domain:code"], TECH_WORDS
    elif roll < 0.67:
        scope, words = ["domain:code/python"], TECH_WORDS
    elif roll < 0.80:
        scope, words = ["domain:writing"], WRITING_WORDS
    elif roll < 0.95:
        scope, words = [f"project:p{rng.randrange(spec.projects_per_tenant)}"], TECH_WORDS
    else:
        scope, words = ["user:universal"], TECH_WORDS
    t = rng.random()
    btype = (
        BeliefType.PREFERENCE
        if t < 0.40 or scope == ["user:universal"]
        else BeliefType.ENTITY
        if t < 0.70
        else BeliefType.DECISION
        if t < 0.88
        else BeliefType.OPEN_QUESTION
        if t < 0.95
        else BeliefType.RELATION
    )
    participants: list[str] = []
    if btype is BeliefType.RELATION:
        earlier = [i - k * spec.tenants for k in (1, 2) if i - k * spec.tenants >= 0]
        if len(earlier) < 2:
            btype = BeliefType.ENTITY
        else:
            participants = [f"b{j}" for j in earlier]
    name_words = _unit(rng, words, 3)
    aliases = [" ".join(_unit(rng, words, 2)) for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.3:
        aliases.append("".join(w[0] for w in name_words) + rng.choice(["", "x", "2"]))
    superseded = rng.random() < 0.04 and btype is not BeliefType.RELATION
    resolved = btype is BeliefType.OPEN_QUESTION and rng.random() < 0.3
    content_words = [rng.choice(words) for _ in range(rng.randint(6, 18))]
    return Belief(
        id=f"b{i}",
        tenant_id=tenant,
        owner_id=owner,
        type=btype,
        canonical_name="_".join(name_words) + f"_{i % 97}",
        aliases=aliases,
        content="Uses " + " ".join(content_words) + ".",
        why_it_matters="Shapes answers about " + " ".join(name_words) + ".",
        scope=scope,
        epistemic_status=EpistemicStatus.SUPERSEDED
        if superseded
        else (EpistemicStatus.EXPLORATORY if btype is BeliefType.OPEN_QUESTION else EpistemicStatus.ACTIVE),
        superseded_by=f"b{i + spec.tenants}" if superseded else None,
        resolved_at=now - timedelta(days=1) if resolved else None,
        confidence=round(0.5 + rng.random() / 2, 2),
        pinned=rng.random() < (0.5 if btype is BeliefType.OPEN_QUESTION else 0.05),
        user_edited=rng.random() < 0.01,
        reinforcement_count=rng.randrange(6),
        last_reinforced_at=now - timedelta(minutes=rng.randrange(500_000)),
        participants=participants,
        created_at=now,
        updated_at=now,
    )


# ---------------------------------------------------------------------------------- loading


_ANALYSIS_BATCH = 500


def _actions(
    client: OpenSearch, alias: str, start: int, stop: int, spec: Spec, now: datetime
) -> Iterator[dict[str, Any]]:
    """The documents as the storage layer writes them: with their analysed units when the index
    stores them (one analysis round trip per batch, as ``BeliefStore.put_many`` does)."""
    names = VocabularyStore(client, alias)
    for batch in range(start, stop, _ANALYSIS_BATCH):
        beliefs = [belief_at(i, spec, now) for i in range(batch, min(stop, batch + _ANALYSIS_BATCH))]
        units = names.units_of([(b.tenant_id, b.canonical_name, b.aliases) for b in beliefs])
        for n, b in enumerate(beliefs):
            source = b.to_document()
            if units is not None:
                source[UNITS_FIELD] = units[n]
            yield {"_index": alias, "_id": doc_id(b.tenant_id, b.id), "_routing": b.tenant_id, "_source": source}


def load_range(client: OpenSearch, alias: str, start: int, stop: int, spec: Spec, now: datetime, chunk: int) -> float:
    """Bulk-load beliefs [start, stop) with refresh off; refresh and force-merge afterwards."""
    t0 = time.perf_counter()
    client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "-1"}})
    failed = 0
    done = start
    for ok, _ in helpers.parallel_bulk(
        client,
        _actions(client, alias, start, stop, spec, now),
        thread_count=2,
        chunk_size=chunk,
        queue_size=4,
        raise_on_error=False,
        request_timeout=120,
    ):
        failed += not ok
        done += 1
        if done % 100_000 == 0:
            print(f"  loaded {done:,} ({time.perf_counter() - t0:.0f}s)", flush=True)
    if failed:
        raise RuntimeError(f"{failed} documents failed to load")
    client.indices.put_settings(index=alias, body={"index": {"refresh_interval": "1s"}})
    client.indices.refresh(index=alias, request_timeout=600)
    client.indices.forcemerge(index=alias, max_num_segments=1, request_timeout=3600)
    client.indices.refresh(index=alias, request_timeout=600)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class Query:
    kind: str
    principal: Principal
    scopes: list[str]
    message: str


@dataclass(frozen=True)
class _Session:
    """Who recalls, with which scopes, and the ids of the beliefs their messages may name."""

    principal: Principal
    scopes: list[str]
    own: list[int]


def _draw_session(rng: random.Random, per_tenant: int, spec: Spec) -> _Session:
    t = rng.randrange(spec.tenants)
    u = rng.randrange(spec.users_per_tenant)
    projects = frozenset(f"p{p}" for p in rng.sample(range(spec.projects_per_tenant), 2))
    principal = Principal(tenant_id=f"t{t:04d}", user_id=f"u{u}", projects=projects)
    scopes = rng.choice(
        [
            ["domain:code"],
            ["domain:code/python"],
            ["domain:writing"],
            ["domain:code", f"project:{sorted(projects)[0]}"],
        ]
    )
    own = [t + spec.tenants * k for k in range(per_tenant) if k % spec.users_per_tenant == u]
    return _Session(principal, scopes, own)


def _draw_message(rng: random.Random, session: _Session, spec: Spec, now: datetime) -> Query:
    handles: list[str] = []
    for i in rng.sample(session.own, min(2, len(session.own))):
        b = belief_at(i, spec, now)
        handles.append(rng.choice([*b.aliases, b.canonical_name.replace("_", " ")]))
    r = rng.random()
    if r < 0.5 and handles:
        kind = "alias-hit"
        msg = rng.choice(TEMPLATES).format(a=handles[0], b=handles[-1])
    elif r < 0.8:
        kind = "miss"
        msg = " ".join(rng.choice(GENERIC) for _ in range(rng.randint(4, 14))) + "?"
    else:
        kind = "long"
        filler = " ".join(rng.choice(GENERIC + TECH_WORDS[:40]) for _ in range(rng.randint(80, 140)))
        msg = (
            f"ok so {filler[: len(filler) // 2]} and the {handles[0] if handles else 'thing'} "
            f"part keeps failing see https://example.com/issues/{rng.randrange(9999)} and "
            f"/srv/app/config.yaml\n{CODE_BLOCK}\n"
            f"{filler[len(filler) // 2 :]} what about {handles[-1] if handles else 'it'}?"
        )
    return Query(kind, session.principal, session.scopes, msg)


def draw_queries(n: int, loaded: int, spec: Spec, now: datetime, seed: int) -> list[Query]:
    """Messages like real ones: 50% alias hits, 30% misses, 20% long messages (code, URLs); each
    from a random user of a random tenant, with a random scope list (no two calls alike: every
    per-user cache misses as often as it can)."""
    rng = random.Random(seed)
    per_tenant = loaded // spec.tenants
    return [_draw_message(rng, _draw_session(rng, per_tenant, spec), spec, now) for _ in range(n)]


def draw_sessions(
    n: int, loaded: int, spec: Spec, now: datetime, seed: int, *, length: int = 10, active: int = 64
) -> list[Query]:
    """The same messages as :func:`draw_queries`, shaped like working sessions: a session is one
    user with one scope list sending ``length`` messages; ``active`` sessions of random users of
    random tenants run at once, each call coming from a random one of them, and a finished session
    is replaced by a new one. What a team's traffic looks like to the per-user caches (credential,
    filter tiers), while the tenant vocabularies still span every tenant."""
    rng = random.Random(seed)
    per_tenant = loaded // spec.tenants
    sessions = [_draw_session(rng, per_tenant, spec) for _ in range(active)]
    left = [length] * active
    out: list[Query] = []
    for _ in range(n):
        k = rng.randrange(active)
        out.append(_draw_message(rng, sessions[k], spec, now))
        left[k] -= 1
        if left[k] == 0:
            sessions[k], left[k] = _draw_session(rng, per_tenant, spec), length
    return out


class TimedClient(OpenSearch):
    """The real client, also keeping the server-side ``took`` of each recall ``_msearch``."""

    took: list[int]

    def msearch(self, *args: Any, **kwargs: Any) -> Any:
        response = super().msearch(*args, **kwargs)
        self.took.append(max((r.get("took", 0) for r in response.get("responses", [])), default=0))
        return response


@dataclass
class Stage:
    beliefs: int
    load_s: float
    queries: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    throughput_qps: float
    server_took_p50_ms: float
    server_took_p99_ms: float
    by_kind_p50_ms: dict[str, float] = field(default_factory=dict)
    by_kind_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    mean_relevant_hits: float = 0.0
    concurrent_qps: float | None = None
    index_size_mb: float = 0.0
    server_took_by_tier_ms: dict[str, dict[str, float]] = field(default_factory=dict)


def measure(
    builder: ContextBuilder, client: TimedClient, queries: list[Query], warmup: int, threads: int
) -> dict[str, Any]:
    for q in queries[:warmup]:
        builder.build(q.principal, q.scopes, q.message)
    client.took = []
    timings: list[float] = []
    kinds: dict[str, list[float]] = {}
    hits = 0
    measured = queries[warmup:]
    wall0 = time.perf_counter()
    for q in measured:
        t0 = time.perf_counter()
        result = builder.build(q.principal, q.scopes, q.message)
        ms = (time.perf_counter() - t0) * 1000
        timings.append(ms)
        kinds.setdefault(q.kind, []).append(ms)
        hits += len(result.relevant)
    wall = time.perf_counter() - wall0
    took = [float(t) for t in client.took]
    concurrent_qps = None
    if threads > 1:
        chunks = [measured[k::threads] for k in range(threads)]

        def run(chunk: list[Query]) -> None:
            for q in chunk:
                builder.build(q.principal, q.scopes, q.message)

        workers = [threading.Thread(target=run, args=(c,)) for c in chunks]
        c0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        concurrent_qps = len(measured) / (time.perf_counter() - c0)
    return {
        "queries": len(measured),
        "p50_ms": percentile(timings, 50),
        "p95_ms": percentile(timings, 95),
        "p99_ms": percentile(timings, 99),
        "mean_ms": statistics.fmean(timings),
        "max_ms": max(timings),
        "throughput_qps": len(measured) / wall,
        "server_took_p50_ms": percentile(took, 50) if took else 0.0,
        "server_took_p99_ms": percentile(took, 99) if took else 0.0,
        "by_kind_p50_ms": {k: round(percentile(v, 50), 2) for k, v in sorted(kinds.items())},
        "by_kind_ms": {
            k: {"n": len(v), **{f"p{q}": round(percentile(v, q), 2) for q in (50, 95, 99)}}
            for k, v in sorted(kinds.items())
        },
        "mean_relevant_hits": hits / len(measured),
        "concurrent_qps": concurrent_qps,
    }


def tier_breakdown(
    client: OpenSearch, alias: str, queries: list[Query], max_queries: int
) -> dict[str, dict[str, float]]:
    """Server-side ``took`` of each tier's query on its own (diagnostic: where the time goes),
    including the relevant tier without fuzziness, which is not what the service runs."""
    took: dict[str, list[float]] = {}
    for q in queries[:max_queries]:
        view = ScopeView.session(q.scopes)
        filters = access.for_principal(q.principal, view)
        text = clean_query(q.message).text
        bodies = {
            "persona": queries_mod.persona_body(access.for_principal(q.principal, ScopeView(("user:universal",)))),
            "pinned": queries_mod.pinned_body(access.for_pinned(q.principal, view), size=10),
            "questions": queries_mod.open_questions_body(filters, size=15),
        }
        if text:
            bodies[f"relevant/{q.kind}"] = queries_mod.relevant_body(filters, text, size=20, min_score=3.0)
            bodies[f"relevant-nofuzzy/{q.kind}"] = queries_mod.relevant_body(
                filters,
                text,
                size=20,
                min_score=3.0,
                clauses=queries_mod.relevance_clauses(text, fuzzy=False),
            )
        for name, body in bodies.items():
            response = client.search(index=alias, body=body, routing=filters.routing)
            took.setdefault(name, []).append(float(response["took"]))
    return {
        k: {"p50": percentile(v, 50), "p95": percentile(v, 95), "p99": percentile(v, 99)}
        for k, v in sorted(took.items())
    }


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def recall_clients(url: str, namespace: str, *, pool_maxsize: int) -> tuple[OpenSearch, TimedClient]:
    """A recall benchmark's two clients on ``namespace``: the service's own (templates, bulk loads)
    and the timed one recalls go through (configured as ``build_client`` configures the service's,
    keeping each ``_msearch``'s server-side ``took``)."""
    base = build_client(Settings(opensearch_url=url, opensearch_namespace=namespace, opensearch_timeout_s=60))
    client = TimedClient(
        hosts=[url],
        timeout=60,
        max_retries=1,
        retry_on_timeout=False,
        pool_maxsize=pool_maxsize,
        serializer=FastJSONSerializer(),
    )
    client.took = []
    return base, client


def report_head(module: str, benchmark: str, argv: list[str] | None, started: datetime) -> dict[str, Any]:
    """What every benchmark report starts with: what it measures, the command that made it, when,
    and the load average before."""
    return {
        "benchmark": benchmark,
        "command": f"python -m benchmarks.{module} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_at": started.isoformat(),
        "loadavg_before": loadavg(),
    }


def result_path(out: Path | None, prefix: str, started: datetime) -> Path:
    """``--out``, or ``benchmarks/results/<prefix>-<start time>.json``."""
    return out or REPO / "benchmarks" / "results" / f"{prefix}-{started:%Y%m%dT%H%MZ}.json"


@dataclass(frozen=True)
class Servers:
    """An A/B run's OpenSearch and Redis: throw-away ones started under ``tmp`` (``node``,
    ``redis``; :func:`wind_down` stops them), or running ones given by URL."""

    tmp: Path
    node: Service | None
    redis: Service | None
    opensearch_url: str
    redis_url: str


def add_server_arguments(parser: argparse.ArgumentParser, *, heap: str, redis_url: bool) -> None:
    """The options every A/B run has: its own node or a running one, the result file; and with
    ``redis_url`` a running Redis instead of a throw-away one."""
    parser.add_argument("--start-node", action="store_true")
    parser.add_argument("--heap", default=heap)
    parser.add_argument("--opensearch-url", default=None)
    if redis_url:
        parser.add_argument("--redis-url", default=None, help="default: start a throw-away redis-server")
    parser.add_argument("--out", type=Path, default=None)


def start_servers(prefix: str, args: argparse.Namespace) -> Servers:
    """A throw-away node with ``--start-node`` (else ``--opensearch-url`` or the settings' URL) and
    a throw-away Redis unless ``--redis-url`` names one."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    node = start_opensearch(tmp / "os", heap=args.heap) if args.start_node else None
    given_redis = getattr(args, "redis_url", None)
    rds = None if given_redis else start_redis(tmp / "redis")
    url = node.url if node else (args.opensearch_url or Settings().opensearch_url)
    return Servers(tmp, node, rds, url, given_redis or (rds.url if rds else ""))


def wind_down(report: dict[str, Any], out: Path, servers: Servers) -> None:
    """The end of an A/B run, whatever happened: stop its throw-away servers, remove their
    directory, write the report (``loadavg_after`` added) and say where."""
    report["loadavg_after"] = loadavg()
    for server in (servers.node, servers.redis):
        if server is not None:
            server.stop()
    shutil.rmtree(servers.tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated corpus sizes (ascending)")
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--users-per-tenant", type=int, default=5)
    parser.add_argument("--queries", type=int, default=2000, help="measured queries per size")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="client threads for the concurrent throughput figure (1 = skip)",
    )
    parser.add_argument("--breakdown", type=int, default=300, help="queries for the per-tier server-side breakdown")
    parser.add_argument("--chunk", type=int, default=2000, help="bulk chunk size (documents)")
    parser.add_argument("--opensearch-url", default=None, help="default: TENURE_OPENSEARCH_URL / settings")
    parser.add_argument("--start-node", action="store_true", help="start a throw-away OpenSearch node for the run")
    parser.add_argument("--heap", default="4g", help="heap of the node started by --start-node")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON result path (default benchmarks/results/recall-<ts>.json)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the namespace afterwards")
    args = parser.parse_args(argv)

    sizes = sorted(int(s) for s in args.sizes.split(","))
    spec = Spec(tenants=args.tenants, users_per_tenant=args.users_per_tenant)
    now = datetime.now(UTC).replace(microsecond=0)
    started = datetime.now(UTC)
    node: Service | None = None
    home = Path(tempfile.mkdtemp(prefix="bench-os-")) if args.start_node else None
    if args.start_node and home is not None:
        print(f"starting OpenSearch (heap {args.heap}) in {home} ...", flush=True)
        node = start_opensearch(home, heap=args.heap)
    url = node.url if node else (args.opensearch_url or Settings().opensearch_url)
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    base, client = recall_clients(url, namespace, pool_maxsize=32)
    what = "recall latency (ContextBuilder.build: one _msearch of 4 tiers + relation hop)"
    report: dict[str, Any] = {
        **report_head("recall_bench", what, argv, started),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "opensearch": {"url": url, "own_node": bool(node), "heap": args.heap if node else None},
        "spec": asdict(spec),
        "stages": [],
    }
    try:
        apply_templates(base, namespace)
        alias = BELIEFS.alias(namespace)
        store = BeliefStore(client, namespace)
        builder = ContextBuilder(store, RecallDefaults())
        loaded = 0
        for size in sizes:
            print(f"loading beliefs {loaded:,}..{size:,} into {alias} ...", flush=True)
            load_s = load_range(base, alias, loaded, size, spec, now, args.chunk)
            loaded = size
            count = base.count(index=alias)["count"]
            stats = base.indices.stats(index=alias, metric="store")
            size_mb = stats["_all"]["primaries"]["store"]["size_in_bytes"] / 1e6
            print(
                f"  {count:,} documents, {size_mb:.0f} MB, loaded in {load_s:.1f}s; measuring ...",
                flush=True,
            )
            queries = draw_queries(args.warmup + args.queries, loaded, spec, now, seed=size)
            m = measure(builder, client, queries, args.warmup, args.threads)
            tiers = tier_breakdown(base, alias, queries[args.warmup :], args.breakdown)
            stage = Stage(
                beliefs=count,
                load_s=round(load_s, 1),
                index_size_mb=round(size_mb, 1),
                server_took_by_tier_ms=tiers,
                **m,
            )
            report["stages"].append(asdict(stage))
            print(
                f"  {count:>9,} beliefs: p50 {stage.p50_ms:.2f} ms  p95 {stage.p95_ms:.2f} ms  "
                f"p99 {stage.p99_ms:.2f} ms  mean {stage.mean_ms:.2f} ms  "
                f"max {stage.max_ms:.1f} ms  "
                f"{stage.throughput_qps:.0f} q/s sequential"
                + (f", {stage.concurrent_qps:.0f} q/s with {args.threads} threads" if stage.concurrent_qps else "")
                + f"  (server took p50 {stage.server_took_p50_ms:.0f} ms, "
                f"p99 {stage.server_took_p99_ms:.0f} ms;"
                f" by kind p50 {stage.by_kind_p50_ms})",
                flush=True,
            )
            print(
                "  client latency by message kind (p50/p95/p99 ms): "
                + ", ".join(
                    f"{k} (n={v['n']:.0f}) {v['p50']:.1f}/{v['p95']:.1f}/{v['p99']:.1f}"
                    for k, v in stage.by_kind_ms.items()
                ),
                flush=True,
            )
            print(
                "  server-side took by tier (p50/p95/p99 ms): "
                + ", ".join(f"{k} {v['p50']:.0f}/{v['p95']:.0f}/{v['p99']:.0f}" for k, v in tiers.items()),
                flush=True,
            )
    finally:
        report["loadavg_after"] = loadavg()
        report["finished_at"] = datetime.now(UTC).isoformat()
        if not args.keep:
            drop_namespace(base, namespace)
        base.close()
        client.close()
        if node:
            node.stop()
            if home is not None:
                shutil.rmtree(home, ignore_errors=True)
        out = result_path(args.out, "recall", started)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}; wrote {out}")
    target = next((s for s in report["stages"] if s["beliefs"] >= 1_000_000), None)
    if target:
        verdict = "met" if target["p50_ms"] <= 5 and target["p99_ms"] <= 20 else "MISSED"
        print(f"target at 1M (p50 <= 5 ms, p99 <= 20 ms): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
