"""The asyncio load generator: provision a fleet over the API, run a mix, verify every write.

    fleet = await provision(config)            # tenants, users, keys, seeded beliefs
    report = await run_load(config, fleet)     # recall / write / turn at a rate or a concurrency
    result = await verify(config, fleet, report)

Every name the generator writes is letter-only and unique (``loadtest.names``) so it can be
recalled again by its alias afterwards. Writes carry client-chosen ids, so a write that timed out
can still be looked up later ("unacknowledged but landed"). Proxy turns carry the scripted
upstream's ``[[turn:<token> scope:<label>]]`` marker; its sidecar creates ``load_turn_<token>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from loadtest import names
from loadtest.http import Api, Outcome, call, make_client, sdk_call
from loadtest.report import OPS, LoadReport, OpStats, Sample, TransportError, TurnRecord, WriteRecord
from loadtest.verification import Verification, verify

__all__ = [
    "Fleet",
    "FleetUser",
    "LoadConfig",
    "LoadReport",
    "Verification",
    "parse_mix",
    "provision",
    "run_load",
    "verify",
]

# Every tenant has a project of the same name: isolation must hold although labels coincide.
SHARED_PROJECT = "shared"
PERSONAL_SCOPES = ("user:universal", "domain:code")
TURN_MODEL = "gpt-4o"  # inside the default tier table, so the sidecar is requested and extracted
SIDECAR_MARKER = "<<<SIDECAR_JSON>>>"
PROVISION_PARALLEL = 8
# transport failures kept with their message (the first ones: a dead server fails every request)
MAX_TRANSPORT_ERRORS_KEPT = 50

MISS_QUERIES = (
    "how should we structure the retry policy for outgoing webhooks?",
    "what is a good way to paginate a large admin table in the dashboard",
    "can you review this migration that adds an index on created timestamps",
    "why does the nightly export job take so long on mondays",
    "please suggest names for the new onboarding checklist feature",
    "is it fine to log the full request body when debugging timeouts",
    "draft a short changelog entry for the billing page redesign",
    "which http status should an idempotent replay return",
    "help me write a unit test for the invoice rounding helper",
    "what would a sensible alert threshold for queue latency be",
)


@dataclass
class LoadConfig:
    url: str  # the API's base URL; several API servers: their URLs, comma-separated
    operator_key: str
    tenants: int = 4
    users_per_tenant: int = 2
    concurrency: int = 32  # closed model: N workers each looping request after request
    # open model: target requests/s total (overrides concurrency as the driver; still cap in-flight)
    rate: float | None = None
    duration_s: float = 60.0
    mix: dict[str, int] = field(default_factory=lambda: {"recall": 80, "write": 15, "turn": 5})
    seed_beliefs_per_user: int = 20  # written (and counted as acknowledged writes) during provisioning
    request_timeout_s: float = 10.0
    seed: int = 0

    # requests sent so far: with several API servers (``url`` comma-separated) they take turns,
    # like a round-robin load balancer in front of them
    _sent: int = field(default=0, init=False, repr=False, compare=False)

    def endpoint(self, path: str) -> str:
        urls = self.url.split(",")
        self._sent += 1
        return f"{urls[self._sent % len(urls)].strip().rstrip('/')}{path}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_sent")
        data["operator_key"] = self.operator_key[:20] + "..."  # the key id part only; never the secret
        return data


@dataclass(frozen=True)
class FleetUser:
    index: int
    tenant: str
    tenant_word: str
    user_id: str
    key: str

    @property
    def scopes(self) -> tuple[str, ...]:
        """What this user may read and write: two personal scopes and the tenant's shared project."""
        return (*PERSONAL_SCOPES, f"project:{SHARED_PROJECT}")


@dataclass
class Fleet:
    tag: str
    tenants: list[str]
    users: list[FleetUser]
    seeds: list[WriteRecord] = field(default_factory=list)
    # names are numbered per fleet, not per run: several runs on one fleet never reuse an id
    writes_sent: int = 0
    turns_sent: int = 0
    # canonical name -> tenant of everything ever sent for this fleet (acknowledged or not): an
    # answer that shows a reader another tenant's name is an isolation leak
    owners: dict[str, str] = field(default_factory=dict)

    def user(self, index: int) -> FleetUser:
        return self.users[index]

    def own(self, canonical_name: str, tenant: str) -> None:
        self.owners[canonical_name] = tenant


def parse_mix(text: str) -> dict[str, int]:
    """``recall=80,write=15,turn=5`` → weights; unknown operations and negative weights are errors."""
    mix: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        op, sep, weight = part.partition("=")
        op = op.strip()
        if not sep or op not in OPS:
            raise ValueError(f"bad mix entry {part!r}: expected <op>=<weight> with op in {', '.join(OPS)}")
        try:
            value = int(weight)
        except ValueError as exc:
            raise ValueError(f"bad weight in {part!r}") from exc
        if value < 0:
            raise ValueError(f"negative weight in {part!r}")
        mix[op] = value
    if sum(mix.values()) <= 0:
        raise ValueError("the mix needs at least one positive weight")
    return mix


# ---------------------------------------------------------------------------- provisioning


async def _must(outcome_task: Awaitable[Outcome], expected: int, what: str) -> Outcome:
    outcome = await outcome_task
    if outcome.status != expected:
        raise RuntimeError(f"{what}: expected {expected}, got {outcome.kind}: {outcome.body!r}")
    return outcome


async def _provision_user(api: Api, config: LoadConfig, tenant: str, user_id: str) -> str:
    await _must(
        sdk_call(api.as_(config.operator_key).admin.create_user(tenant, user_id, projects=[SHARED_PROJECT]), 201),
        201, f"create user {tenant}/{user_id}",
    )  # fmt: skip
    issued = await _must(
        sdk_call(api.as_(config.operator_key).admin.issue_key(tenant, user_id, name="loadtest"), 201),
        201, f"issue key {tenant}/{user_id}",
    )  # fmt: skip
    return str(issued.body["key"])


async def provision(config: LoadConfig) -> Fleet:
    """Tenants, users (each granted the tenant's shared project), API keys, and seeded beliefs."""
    tag = names.run_tag()
    fleet = Fleet(tag=tag, tenants=[], users=[])
    async with make_client(config.request_timeout_s * 3, PROVISION_PARALLEL + 2) as client:
        api = Api(config, client)
        for t in range(config.tenants):
            tenant = f"load-{tag}-{t}"
            await _must(
                sdk_call(api.as_(config.operator_key).admin.create_tenant(tenant, f"load test {tag} #{t}"), 201),
                201, f"create tenant {tenant}",
            )  # fmt: skip
            fleet.tenants.append(tenant)
            for u in range(config.users_per_tenant):
                key = await _provision_user(api, config, tenant, f"u{u}")
                fleet.users.append(FleetUser(len(fleet.users), tenant, names.tenant_word(tag, t), f"u{u}", key))
        fleet.seeds = await _seed(api, fleet)
        for seed in fleet.seeds:
            fleet.own(seed.canonical_name, seed.tenant)
    return fleet


async def _seed(api: Api, fleet: Fleet) -> list[WriteRecord]:
    """Seeded beliefs go through the same endpoint as load writes and must all be acknowledged."""
    planned = [
        _write_record(fleet, user, user.scopes[i % len(user.scopes)], names.seed_word(n), seed=True)
        for n, (user, i) in enumerate(
            (user, i) for user in fleet.users for i in range(api.config.seed_beliefs_per_user)
        )
    ]
    gate = asyncio.Semaphore(PROVISION_PARALLEL)

    async def one(record: WriteRecord) -> None:
        async with gate:
            await _must(
                sdk_call(api.as_(fleet.user(record.user).key).beliefs.create(**_write_body(record)), 201),
                201, f"seed {record.belief_id}",
            )  # fmt: skip

    await asyncio.gather(*(one(r) for r in planned))
    return planned


def _write_record(fleet: Fleet, user: FleetUser, scope: str, word: str, *, seed: bool = False) -> WriteRecord:
    alias = f"{user.tenant_word} {word}"
    kind = "seed" if seed else "write"
    return WriteRecord(
        belief_id=f"load-{fleet.tag}-{kind}-{word}",
        tenant=user.tenant,
        user=user.index,
        scope=scope,
        alias=alias,
        canonical_name=f"load_{kind}_{user.tenant_word}_{word}",
        seed=seed,
    )


def _write_body(record: WriteRecord) -> dict[str, Any]:
    # universal-scope writes are preferences (the persona's material); the rest are decisions.
    # The content names the alias, so no two beliefs share content and compaction never merges them.
    kind = "preference" if record.scope == "user:universal" else "decision"
    return {
        "id": record.belief_id,
        "type": kind,
        "canonical_name": record.canonical_name,
        "aliases": [record.alias],
        "content": f"For {record.alias} the team settled on the documented approach ({kind}).",
        "why_it_matters": f"Answers about {record.alias} must follow it.",
        "scope": [record.scope],
        "confidence": 0.9,
    }


# ---------------------------------------------------------------------------- the run


class _Run:
    """The state of one run: samples, acknowledgements, and what each user may expect to recall."""

    def __init__(self, config: LoadConfig, fleet: Fleet, client: httpx.AsyncClient, started: float):
        self.config = config
        self.fleet = fleet
        self.client = client
        self.api = Api(config, client)
        self.started = started
        self.rng = random.Random(config.seed)
        self.samples: list[Sample] = []
        self.acked_writes: list[WriteRecord] = []
        self.acked_turns: list[TurnRecord] = []
        self.unacked_writes: list[WriteRecord] = []
        self.unacked_turns: list[TurnRecord] = []
        self.leaks: list[dict[str, Any]] = []
        self.expected_hits = 0
        self.missed_hits: list[str] = []
        self.transport_errors: list[TransportError] = []
        self.visible: dict[int, list[WriteRecord]] = {u.index: [] for u in fleet.users}
        self.seeds_of: dict[int, list[WriteRecord]] = {u.index: [] for u in fleet.users}
        for record in fleet.seeds:
            for reader in self._readers(record):
                self.seeds_of[reader].append(record)
        ops = [op for op in OPS if config.mix.get(op, 0) > 0]
        self.ops = ops
        self.weights = [config.mix[op] for op in ops]

    def _readers(self, record: WriteRecord) -> list[int]:
        """Personal scopes are the owner's alone; the shared project is read by the whole tenant."""
        if record.scope.startswith("project:"):
            return [u.index for u in self.fleet.users if u.tenant == record.tenant]
        return [record.user]

    def record(self, op: str, due: float, outcome: str, latency_ms: float, ok: bool, error: str | None = None) -> None:
        t_s = round(due - self.started, 4)
        self.samples.append(Sample(t_s, op, outcome, round(latency_ms, 2), ok))
        if error is not None and len(self.transport_errors) < MAX_TRANSPORT_ERRORS_KEPT:
            self.transport_errors.append(TransportError(t_s, op, outcome, round(latency_ms, 2), error))

    async def one(self, user: FleetUser, due: float | None = None) -> None:
        op = self.rng.choices(self.ops, self.weights)[0]
        handler: dict[str, Callable[[FleetUser, float | None], Awaitable[None]]] = {
            "recall": self.recall, "write": self.write, "turn": self.turn,
        }  # fmt: skip
        await handler[op](user, due)

    # ----------------------------------------------------------------- recall

    def _recall_query(self, user: FleetUser) -> tuple[str, WriteRecord | None]:
        """A recent own alias (45%), a seeded one (20%), another tenant's (10%), or a miss (25%)."""
        roll = self.rng.random()
        own = self.visible[user.index]
        if roll < 0.45 and own:
            target = own[-1 - int(self.rng.random() ** 2 * len(own))]  # recent ones more often
            return f"what did we settle about {target.alias} last week?", target
        if roll < 0.65 and self.seeds_of[user.index]:
            target = self.rng.choice(self.seeds_of[user.index])
            return f"remind me of {target.alias} before I change it", target
        if roll < 0.75:
            foreign = [w for w in self.acked_writes[-200:] if w.tenant != user.tenant]
            if foreign:
                probe = self.rng.choice(foreign)
                return f"what did we settle about {probe.alias} last week?", None
        return self.rng.choice(MISS_QUERIES), None

    async def recall(self, user: FleetUser, due: float | None) -> None:
        query, target = self._recall_query(user)
        t0 = due if due is not None else time.perf_counter()
        session = f"load-{user.tenant}-{user.user_id}"
        request = self.api.as_(user.key).recall(query, scopes=user.scopes, session_id=session)
        out = await sdk_call(request, 200, started=t0)
        if out.status != 200:
            self.record("recall", t0, out.kind, out.latency_ms, False, out.error)
            return
        items = _tier_items(out.body)
        leaked = self._leaks(user, items, query)
        self.record("recall", t0, "isolation_leak" if leaked else out.kind, out.latency_ms, not leaked)
        if target is not None:
            self.expected_hits += 1
            if target.belief_id not in {item.get("id") for item in items}:
                self.missed_hits.append(target.belief_id)

    def _leaks(self, user: FleetUser, items: list[dict[str, Any]], query: str) -> bool:
        leaked = False
        for item in items:
            owner = self.fleet.owners.get(str(item.get("canonical_name")))
            if owner is not None and owner != user.tenant:
                leaked = True
                self.leaks.append(
                    {"reader_tenant": user.tenant, "reader": user.user_id, "query": query,
                     "belief_id": item.get("id"), "canonical_name": item.get("canonical_name"),
                     "owner_tenant": owner}
                )  # fmt: skip
        return leaked

    # ----------------------------------------------------------------- write

    async def write(self, user: FleetUser, due: float | None) -> None:
        scope = self.rng.choices(user.scopes, weights=(2, 3, 5))[0]
        record = _write_record(self.fleet, user, scope, names.write_word(self.fleet.writes_sent))
        self.fleet.writes_sent += 1
        self.fleet.own(record.canonical_name, record.tenant)
        t0 = due if due is not None else time.perf_counter()
        out = await sdk_call(self.api.as_(user.key).beliefs.create(**_write_body(record)), 201, started=t0)
        ok = out.status == 201
        self.record("write", t0, out.kind, out.latency_ms, ok, out.error)
        if not ok:
            self.unacked_writes.append(record)
            return
        self.acked_writes.append(record)
        for reader in self._readers(record):
            self.visible[reader].append(record)

    # ----------------------------------------------------------------- proxy turn

    async def turn(self, user: FleetUser, due: float | None) -> None:
        token = names.turn_token(self.fleet.tag, self.fleet.turns_sent)
        self.fleet.turns_sent += 1
        scope = self.rng.choice(user.scopes)
        session = f"load-{self.fleet.tag}-{user.index}-{self.fleet.turns_sent}"
        self.fleet.own(f"load_turn_{token}", user.tenant)
        body = {
            "model": TURN_MODEL,
            "messages": [{"role": "user", "content": f"Let us settle this one. [[turn:{token} scope:{scope}]]"}],
            "metadata": {"scope": scope, "session_id": session},
        }
        t0 = due if due is not None else time.perf_counter()
        out = await call(
            self.client, "POST", self.config.endpoint("/v1/chat/completions"), user.key, json=body, started=t0
        )
        record = TurnRecord(token, scope, user.tenant, user.index, session)
        tenure = out.body.get("tenure") if out.status == 200 and isinstance(out.body, dict) else None
        if not isinstance(tenure, dict):
            self.record("turn", t0, out.kind if out.status != 200 else "no_tenure", out.latency_ms, False, out.error)
            self.unacked_turns.append(record)
            return
        # the visible answer must never carry the sidecar (the proxy strips it)
        leaked = SIDECAR_MARKER in str(out.body.get("choices"))
        self.record("turn", t0, "sidecar_leak" if leaked else out.kind, out.latency_ms, not leaked)
        self.acked_turns.append(
            TurnRecord(token, scope, user.tenant, user.index, session, tenure.get("turn_id"), tenure.get("extraction"))
        )

    # ----------------------------------------------------------------- drivers

    async def closed(self, deadline: float, stop: asyncio.Event) -> None:
        """N workers, each bound to one user, sending the next request as soon as one returns."""

        async def worker(w: int) -> None:
            user = self.fleet.users[w % len(self.fleet.users)]
            while not stop.is_set() and time.perf_counter() < deadline:
                await self.one(user)

        await asyncio.gather(*(worker(w) for w in range(self.config.concurrency)))

    async def open(self, rate: float, deadline: float, stop: asyncio.Event) -> None:
        """Poisson arrivals at ``rate``/s; at most ``concurrency`` in flight. Latency counts from
        the arrival, so waiting for a free slot is part of it (no coordinated omission)."""
        slots = asyncio.Semaphore(self.config.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        due = time.perf_counter()
        n = 0

        async def arrival(user: FleetUser, at: float) -> None:
            async with slots:
                await self.one(user, at)

        while not stop.is_set():
            due += self.rng.expovariate(rate)
            if due >= deadline:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            task = asyncio.create_task(arrival(self.fleet.users[n % len(self.fleet.users)], due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.gather(*tasks)

    def report(self, started_at: str, elapsed_s: float, load_before: tuple[float, float, float]) -> LoadReport:
        return LoadReport(
            config=self.config.to_json(),
            started_at=started_at,
            elapsed_s=round(elapsed_s, 3),
            ops={op: OpStats.of(op, self.samples, elapsed_s) for op in OPS},
            timeline=sorted(self.samples),
            acknowledged_writes=self.acked_writes,
            acknowledged_turns=self.acked_turns,
            unacknowledged_writes=self.unacked_writes,
            unacknowledged_turns=self.unacked_turns,
            isolation_leaks=self.leaks,
            recall_expected_hits=self.expected_hits,
            recall_missed_hits=self.missed_hits,
            transport_errors=self.transport_errors,
            load_average_before=load_before,
            load_average_after=os.getloadavg(),
        )


def _tier_items(body: Any) -> list[dict[str, Any]]:
    tiers = body.get("tiers") if isinstance(body, dict) else None
    if not isinstance(tiers, dict):
        return []
    return [item for tier in tiers.values() if isinstance(tier, list) for item in tier if isinstance(item, dict)]


async def run_load(config: LoadConfig, fleet: Fleet, stop: asyncio.Event | None = None) -> LoadReport:
    """Drive the mix for ``duration_s`` (or until ``stop`` is set) and report what happened."""
    if not fleet.users:
        raise ValueError("the fleet has no users")
    stop = stop or asyncio.Event()
    load_before = os.getloadavg()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    async with make_client(config.request_timeout_s, config.concurrency + 4) as client:
        t0 = time.perf_counter()
        run = _Run(config, fleet, client, t0)
        deadline = t0 + config.duration_s
        if config.rate:
            await run.open(config.rate, deadline, stop)
        else:
            await run.closed(deadline, stop)
        elapsed = time.perf_counter() - t0
    return run.report(started_at, elapsed, load_before)
