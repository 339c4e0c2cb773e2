"""After a run: is every acknowledged write present and recallable, every acknowledged turn
extracted exactly once, and did any answer cross a tenant boundary?"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel
from tenure_client import AsyncTenure

from loadtest.http import Api, Outcome, make_client, sdk_call
from loadtest.report import LoadReport, TurnRecord, WriteRecord

if TYPE_CHECKING:
    from loadtest.generator import Fleet, FleetUser, LoadConfig

PARALLEL = 16
PARALLEL_PER_USER = 4  # one credential's rate limit (20/s by default) is shared by its checks
TERMINAL_TURN_STATES = ("done", "skipped", "failed")
TURN_PREFIX = "load_turn_"
RETRIES = 4  # faults (5xx, transport errors) are retried this many times before judging
# A 429 is the server pacing this credential, not a fault: the check waits as long as Retry-After
# says, again and again, for up to this long per request from its first 429 (time spent queued
# behind the credential's other checks does not count). Judging "lost" on a 429 would blame the
# service for the verifier's own burst.
RATE_LIMITED_PATIENCE_S = 120.0


@dataclass
class Verification:
    acknowledged_writes: int = 0
    writes_present: int = 0
    writes_recallable: int = 0
    lost_writes: list[dict[str, Any]] = field(default_factory=list)
    unrecallable_writes: list[dict[str, Any]] = field(default_factory=list)
    acknowledged_turns: int = 0
    extractions_found: int = 0
    lost_extractions: list[dict[str, Any]] = field(default_factory=list)
    duplicate_extractions: list[dict[str, Any]] = field(default_factory=list)
    # a turn belief reinforced although its token occurs in one turn only: the sidecar was merged twice
    reapplied_extractions: list[dict[str, Any]] = field(default_factory=list)
    isolation_leaks: list[dict[str, Any]] = field(default_factory=list)  # during the run and now
    foreign_probes: int = 0
    unacknowledged_writes: int = 0
    unacknowledged_writes_landed: int = 0
    unacknowledged_turns: int = 0
    unacknowledged_turns_extracted: int = 0
    turns_not_drained: int = 0
    drain_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.lost_writes
            or self.unrecallable_writes
            or self.lost_extractions
            or self.duplicate_extractions
            or self.reapplied_extractions
            or self.isolation_leaks
        )

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def format_summary(self) -> str:
        verdict = "PASSED" if self.ok else "FAILED"
        return "\n".join(
            [
                f"verification {verdict} in {self.elapsed_s:.1f} s (worker drained in {self.drain_s:.1f} s)",
                f"writes: {self.acknowledged_writes} acknowledged, {self.writes_present} present, "
                f"{self.writes_recallable} recallable; lost {len(self.lost_writes)}, "
                f"not recallable {len(self.unrecallable_writes)}",
                f"turns: {self.acknowledged_turns} acknowledged, {self.extractions_found} extracted; "
                f"lost {len(self.lost_extractions)}, duplicated {len(self.duplicate_extractions)}, "
                f"re-applied {len(self.reapplied_extractions)}, not drained {self.turns_not_drained}",
                f"isolation: {self.foreign_probes} cross-tenant probes, {len(self.isolation_leaks)} leaks",
                f"unacknowledged: {self.unacknowledged_writes} writes ({self.unacknowledged_writes_landed} landed), "
                f"{self.unacknowledged_turns} turns ({self.unacknowledged_turns_extracted} extracted)",
            ]
        )


def _fault(outcome: Outcome) -> bool:
    return outcome.status is None or outcome.status >= 500


def _retry_after_s(outcome: Outcome) -> float:
    """How long the server asked us to wait (at least a beat, at most 10 s), plus jitter so the
    waiting checks of one credential do not come back in one burst."""
    try:
        asked = float(outcome.retry_after) if outcome.retry_after else 1.0
    except ValueError:
        asked = 1.0
    return min(max(asked, 0.1), 10.0) + random.uniform(0.0, 0.5)


async def patiently(attempt: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """Make one check's request the way every verifier does (the load test's, the compose
    check's through it, the fault drills' probe): a 429 is waited out as long as Retry-After says,
    for up to :data:`RATE_LIMITED_PATIENCE_S` from the first 429; a fault (5xx, no answer) is
    retried up to :data:`RETRIES` times; any other answer is the verdict. ``attempt`` sends the request once."""
    patience_ends: float | None = None
    faults = 0
    while True:
        outcome = await attempt()
        if outcome.status == 429:
            if patience_ends is None:
                patience_ends = time.monotonic() + RATE_LIMITED_PATIENCE_S
            if time.monotonic() >= patience_ends:
                return outcome
            await asyncio.sleep(_retry_after_s(outcome))
        elif _fault(outcome) and faults < RETRIES - 1:
            faults += 1
            await asyncio.sleep(0.5 * faults)
        else:
            return outcome


class _Checker:
    def __init__(self, config: LoadConfig, fleet: Fleet, report: LoadReport, client: httpx.AsyncClient):
        self.config = config
        self.fleet = fleet
        self.report = report
        self.api = Api(config, client)
        self.gate = asyncio.Semaphore(PARALLEL)
        self.user_gates: dict[str, asyncio.Semaphore] = {}
        self.result = Verification()
        writes = {w.belief_id: w for w in [*fleet.seeds, *report.acknowledged_writes]}
        self.writes = list(writes.values())
        for write in [*self.writes, *report.unacknowledged_writes]:
            fleet.own(write.canonical_name, write.tenant)
        for turn in [*report.acknowledged_turns, *report.unacknowledged_turns]:
            fleet.own(TURN_PREFIX + turn.token, turn.tenant)

    async def request(self, user: FleetUser, send: Callable[[AsyncTenure], Awaitable[BaseModel]]) -> Outcome:
        """One SDK call (``send`` makes it with the user's client) under the parallelism caps,
        waited out while rate-limited and retried while the answer is a fault.

        The check keeps its credential's slot while it waits out a 429: the credential's other
        checks queue behind it instead of overtaking it, so its requests slow to what the server
        allows. (A 600 s compose run judged 11 of its 4,051 writes lost when each 429 sent the
        check to the back of its credential's queue and patience ran out there.)"""
        user_gate = self.user_gates.setdefault(user.key, asyncio.Semaphore(PARALLEL_PER_USER))

        async def attempt() -> Outcome:
            async with self.gate:
                return await sdk_call(send(self.api.as_(user.key)), 200)

        async with user_gate:
            return await patiently(attempt)

    async def gather(self, items: list[Any], check: Callable[[Any], Awaitable[None]]) -> None:
        await asyncio.gather(*(check(item) for item in items))

    # ------------------------------------------------------------------ writes

    async def check_write(self, write: WriteRecord) -> None:
        owner = self.fleet.user(write.user)
        got = await self.request(owner, lambda sdk: sdk.beliefs.get(write.belief_id))
        name = got.body.get("canonical_name") if isinstance(got.body, dict) else None
        if got.status != 200 or name != write.canonical_name:
            reason = f"GET {got.kind}" if got.status != 200 else f"canonical_name is {name!r}"
            self.result.lost_writes.append({**asdict(write), "reason": reason})
            return
        self.result.writes_present += 1
        query = f"what did we settle about {write.alias}?"
        items = await self.recall(owner, [write.scope], query)
        if items is None or write.belief_id not in {item.get("id") for item in items}:
            detail = "recall failed" if items is None else f"recall returned {[i.get('id') for i in items]}"
            self.result.unrecallable_writes.append({**asdict(write), "reason": detail})
        else:
            self.result.writes_recallable += 1
        if write.scope.startswith("project:"):
            await self.foreign_probe(write, query)

    async def foreign_probe(self, write: WriteRecord, query: str) -> None:
        """A user of another tenant asks for the alias under the same project label: nothing of it."""
        others = [u for u in self.fleet.users if u.tenant != write.tenant]
        if not others:
            return
        reader = others[write.user % len(others)]
        self.result.foreign_probes += 1
        await self.recall(reader, list(reader.scopes), query)

    async def recall(self, reader: FleetUser, scopes: list[str], query: str) -> list[dict[str, Any]] | None:
        got = await self.request(reader, lambda sdk: sdk.recall(query, scopes=scopes))
        if got.status != 200 or not isinstance(got.body, dict):
            return None
        tiers = got.body.get("tiers") or {}
        items = [item for tier in tiers.values() for item in tier]
        self.note_leaks(reader, items, f"recall {query!r}")
        return items

    def note_leaks(self, reader: FleetUser, items: list[dict[str, Any]], where: str) -> None:
        for item in items:
            owner = self.fleet.owners.get(str(item.get("canonical_name")))
            if owner is not None and owner != reader.tenant:
                self.result.isolation_leaks.append(
                    {"reader_tenant": reader.tenant, "reader": reader.user_id, "where": where,
                     "belief_id": item.get("id"), "canonical_name": item.get("canonical_name"),
                     "owner_tenant": owner}
                )  # fmt: skip

    async def check_unacknowledged_write(self, write: WriteRecord) -> None:
        got = await self.request(self.fleet.user(write.user), lambda sdk: sdk.beliefs.get(write.belief_id))
        if got.status == 200:
            self.result.unacknowledged_writes_landed += 1

    # ------------------------------------------------------------------ turns

    async def drain(self, turns: list[TurnRecord], timeout_s: float) -> dict[str, dict[str, Any]]:
        """Wait until every acknowledged turn's extraction has finished; the last state of each."""
        states: dict[str, dict[str, Any]] = {}
        pending = [t for t in turns if t.turn_id]
        deadline = time.monotonic() + timeout_s
        while pending:

            async def poll(turn: TurnRecord) -> None:
                turn_id = str(turn.turn_id)
                got = await self.request(self.fleet.user(turn.user), lambda sdk: sdk.get_turn(turn_id))
                states[turn.token] = got.body if got.status == 200 else {"extraction_status": f"GET {got.kind}"}

            await self.gather(pending, poll)
            pending = [t for t in pending if states[t.token].get("extraction_status") not in TERMINAL_TURN_STATES]
            if not pending or time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        self.result.turns_not_drained = len(pending)
        return states

    async def turn_beliefs(self) -> dict[str, list[dict[str, Any]]]:
        """Every ``load_turn_*`` belief of the fleet, by canonical name (each tenant read by all of
        its users, so personal scopes are covered; deduplicated by id per tenant)."""
        by_name: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}

        async def read(user: FleetUser) -> None:
            for item in await self.list_decisions(user):
                name = str(item.get("canonical_name"))
                if name.startswith(TURN_PREFIX):
                    by_name.setdefault(name, {})[(user.tenant, str(item.get("id")))] = item

        await self.gather(self.fleet.users, read)
        return {name: list(found.values()) for name, found in by_name.items()}

    async def list_decisions(self, user: FleetUser) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            got = await self.request(user, _decisions_page(cursor))
            if got.status != 200:
                raise RuntimeError(f"listing beliefs of {user.tenant}/{user.user_id} failed: {got.kind} {got.body!r}")
            page = got.body.get("items", [])
            self.note_leaks(user, page, "GET /v1/beliefs")
            items.extend(page)
            cursor = got.body.get("next_cursor")
            if not cursor:
                return items

    def judge_turns(self, states: dict[str, dict[str, Any]], found: dict[str, list[dict[str, Any]]]) -> None:
        for turn in self.report.acknowledged_turns:
            beliefs = found.get(TURN_PREFIX + turn.token, [])
            if not beliefs:
                state = states.get(turn.token, {})
                self.result.lost_extractions.append(
                    {**asdict(turn), "turn_status": state.get("extraction_status", "no turn id"),
                     "turn_result": _short(state.get("result"))}
                )  # fmt: skip
                continue
            self.result.extractions_found += 1
            if len(beliefs) > 1:
                self.result.duplicate_extractions.append(
                    {**asdict(turn), "count": len(beliefs), "belief_ids": sorted(str(b.get("id")) for b in beliefs)}
                )
            reinforced = [b for b in beliefs if int(b.get("reinforcement_count") or 0) > 0]
            if reinforced:
                self.result.reapplied_extractions.append(
                    {**asdict(turn), "reinforcement_count": [b.get("reinforcement_count") for b in reinforced]}
                )
        self.result.unacknowledged_turns_extracted = sum(
            1 for t in self.report.unacknowledged_turns if TURN_PREFIX + t.token in found
        )


def _decisions_page(cursor: str | None) -> Callable[[AsyncTenure], Awaitable[BaseModel]]:
    """One page of the user's decisions (the SDK call :meth:`_Checker.request` makes)."""
    return lambda sdk: sdk.beliefs.list(type=["decision"], limit=500, cursor=cursor)


def _short(value: Any, limit: int = 600) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


async def verify(
    config: LoadConfig, fleet: Fleet, report: LoadReport, *, drain_timeout_s: float = 120.0
) -> Verification:
    """Check every acknowledged write and turn of ``report`` (and the fleet's seeds)."""
    started = time.monotonic()
    async with make_client(config.request_timeout_s, PARALLEL + 4) as client:
        checker = _Checker(config, fleet, report, client)
        result = checker.result
        result.isolation_leaks.extend(report.isolation_leaks)
        result.acknowledged_writes = len(checker.writes)
        result.acknowledged_turns = len(report.acknowledged_turns)
        result.unacknowledged_writes = len(report.unacknowledged_writes)
        result.unacknowledged_turns = len(report.unacknowledged_turns)
        # drain first: the worker's merges should not compete with the write checks for the node
        drain_started = time.monotonic()
        states = await checker.drain(report.acknowledged_turns, drain_timeout_s)
        result.drain_s = round(time.monotonic() - drain_started, 2)
        await checker.gather(checker.writes, checker.check_write)
        await checker.gather(report.unacknowledged_writes, checker.check_unacknowledged_write)
        checker.judge_turns(states, await checker.turn_beliefs())
    result.elapsed_s = round(time.monotonic() - started, 2)
    return result
