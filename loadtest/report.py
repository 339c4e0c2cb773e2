"""What a load run produces: per-operation statistics, the timeline, and what was acknowledged."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from loadtest.stats import LatencySummary

OPS = ("recall", "write", "turn")
# The server pacing a credential (429 with Retry-After) is the rate limit working, not a fault: it
# is counted and reported, but a run is not failed for it (the verifier waits 429s out too).
RATE_LIMITED = "429"


@dataclass(frozen=True)
class WriteRecord:
    """A belief write the generator sent (acknowledged = 201 received)."""

    belief_id: str
    tenant: str
    user: int  # index into Fleet.users: whose key wrote it, and reads it back
    scope: str
    alias: str
    canonical_name: str
    seed: bool = False


@dataclass(frozen=True)
class TurnRecord:
    """A proxy turn whose answer carried the scripted sidecar for ``load_turn_<token>``."""

    token: str
    scope: str
    tenant: str
    user: int
    session_id: str
    turn_id: str | None = None  # from the response's ``tenure`` object, when acknowledged
    extraction: str | None = None  # ``tenure.extraction`` as the proxy reported it


class Sample(NamedTuple):
    """One request: seconds since the run started, operation, HTTP status or error kind, latency."""

    t_s: float
    op: str
    outcome: str  # "201", "503", "timeout", "connect", "other", "isolation_leak"
    latency_ms: float
    ok: bool


class TransportError(NamedTuple):
    """A request that got no HTTP answer, with httpx's account of why (kept for diagnosis)."""

    t_s: float
    op: str
    outcome: str  # "timeout", "connect" or "other"
    latency_ms: float
    error: str  # "RemoteProtocolError: Server disconnected without sending a response."


@dataclass
class OpStats:
    op: str
    count: int
    successes: int
    throughput_ok_s: float
    latency_ok_ms: LatencySummary
    latency_failed_ms: LatencySummary
    errors: dict[str, int]

    @property
    def failures(self) -> int:
        """Requests that did not succeed, rate-limited ones included."""
        return self.count - self.successes

    @property
    def rate_limited(self) -> int:
        return self.errors.get(RATE_LIMITED, 0)

    @classmethod
    def of(cls, op: str, samples: list[Sample], elapsed_s: float) -> OpStats:
        mine = [s for s in samples if s.op == op]
        ok = [s.latency_ms for s in mine if s.ok]
        failed = [s for s in mine if not s.ok]
        errors: dict[str, int] = {}
        for s in failed:
            errors[s.outcome] = errors.get(s.outcome, 0) + 1
        return cls(
            op=op,
            count=len(mine),
            successes=len(ok),
            throughput_ok_s=round(len(ok) / elapsed_s, 2) if elapsed_s > 0 else 0.0,
            latency_ok_ms=LatencySummary.of(ok),
            latency_failed_ms=LatencySummary.of([s.latency_ms for s in failed]),
            errors=dict(sorted(errors.items())),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "count": self.count,
            "successes": self.successes,
            "failures": self.failures,
            "rate_limited": self.rate_limited,
            "throughput_ok_s": self.throughput_ok_s,
            "latency_ok_ms": self.latency_ok_ms.to_json(),
            "latency_failed_ms": self.latency_failed_ms.to_json(),
            "errors": self.errors,
        }


@dataclass
class LoadReport:
    config: dict[str, Any]
    started_at: str
    elapsed_s: float
    ops: dict[str, OpStats]
    timeline: list[Sample]
    acknowledged_writes: list[WriteRecord]
    acknowledged_turns: list[TurnRecord]
    unacknowledged_writes: list[WriteRecord]
    unacknowledged_turns: list[TurnRecord]
    # recall answers that contained a belief of another tenant (each is also a failed sample)
    isolation_leaks: list[dict[str, Any]]
    # read-your-writes under load: recalls of an acknowledged alias that did not return it
    recall_expected_hits: int
    recall_missed_hits: list[str]
    load_average_before: tuple[float, float, float]
    load_average_after: tuple[float, float, float]
    # the first requests that got no HTTP answer, each with httpx's message
    transport_errors: list[TransportError] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. process RSS, filled in by the CLI

    @property
    def total_requests(self) -> int:
        return sum(s.count for s in self.ops.values())

    @property
    def total_errors(self) -> int:
        """Failed requests that were not rate limited: what fails a run."""
        return sum(s.failures - s.rate_limited for s in self.ops.values())

    @property
    def total_rate_limited(self) -> int:
        return sum(s.rate_limited for s in self.ops.values())

    @property
    def throughput_ok_s(self) -> float:
        return round(sum(s.throughput_ok_s for s in self.ops.values()), 2)

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "started_at": self.started_at,
            "elapsed_s": self.elapsed_s,
            "total_requests": self.total_requests,
            "total_errors": self.total_errors,
            "total_rate_limited": self.total_rate_limited,
            "throughput_ok_s": self.throughput_ok_s,
            "ops": {op: stats.to_json() for op, stats in self.ops.items()},
            "isolation_leaks": self.isolation_leaks,
            "recall_expected_hits": self.recall_expected_hits,
            "recall_missed_hits": self.recall_missed_hits,
            "transport_errors": [e._asdict() for e in self.transport_errors],
            "load_average_before": list(self.load_average_before),
            "load_average_after": list(self.load_average_after),
            "acknowledged_writes": [asdict(w) for w in self.acknowledged_writes],
            "acknowledged_turns": [asdict(t) for t in self.acknowledged_turns],
            "unacknowledged_writes": [asdict(w) for w in self.unacknowledged_writes],
            "unacknowledged_turns": [asdict(t) for t in self.unacknowledged_turns],
            # compact: [t_s, op, outcome, latency_ms, ok]
            "timeline_fields": list(Sample._fields),
            "timeline": [[s.t_s, s.op, s.outcome, s.latency_ms, int(s.ok)] for s in self.timeline],
            "extra": self.extra,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def format_summary(self) -> str:
        lines = [
            f"load run {self.started_at}: {self.elapsed_s:.1f} s, {self.total_requests} requests, "
            f"{self.throughput_ok_s:.1f} ok/s, {self.total_errors} errors, "
            f"{self.total_rate_limited} rate limited (429, not errors)",
            f"{'op':<7}{'count':>8}{'ok':>8}{'ok/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}  errors",
        ]
        for stats in self.ops.values():
            lat = stats.latency_ok_ms
            errors = ", ".join(f"{k}: {v}" for k, v in stats.errors.items()) or "-"
            lines.append(
                f"{stats.op:<7}{stats.count:>8}{stats.successes:>8}{stats.throughput_ok_s:>9.1f}"
                f"{lat.p50:>9.1f}{lat.p95:>9.1f}{lat.p99:>9.1f}{lat.max:>9.1f}  {errors}"
            )
        lines.append(
            f"acknowledged: {len(self.acknowledged_writes)} writes, {len(self.acknowledged_turns)} turns; "
            f"unacknowledged: {len(self.unacknowledged_writes)} writes, {len(self.unacknowledged_turns)} turns"
        )
        lines.append(
            f"recall of acknowledged aliases: {self.recall_expected_hits} expected hits, "
            f"{len(self.recall_missed_hits)} missed; isolation leaks: {len(self.isolation_leaks)}"
        )
        lines.extend(
            f"no answer at {e.t_s:.2f} s ({e.op}, {e.latency_ms:.0f} ms): {e.error}" for e in self.transport_errors[:5]
        )
        lines.append(
            "load average before: {:.2f} {:.2f} {:.2f}, after: {:.2f} {:.2f} {:.2f}".format(
                *self.load_average_before, *self.load_average_after
            )
        )
        return "\n".join(lines)
