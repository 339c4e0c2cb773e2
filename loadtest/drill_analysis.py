"""What a fault drill's timeline says: how requests failed during the outage, how fast, and when
each operation was served again. Pure functions over the load generator's samples, so the pass
criteria can be tested without a stack.

Times are seconds since the load run started (``Sample.t_s``, when the request was sent); the
drill records its own events (fault injected, component ready) on the same clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.report import Sample
from loadtest.stats import LatencySummary


def is_server_error(outcome: str) -> bool:
    """A 5xx other than the clean, retryable 503 (a crash, an untranslated store error...)."""
    return outcome.isdigit() and int(outcome) >= 500 and outcome != "503"


def ended_s(sample: Sample) -> float:
    return sample.t_s + sample.latency_ms / 1000


@dataclass(frozen=True)
class Window:
    """The failed and successful requests sent between two instants, by operation and outcome."""

    start_s: float
    end_s: float
    outcomes: dict[str, dict[str, int]]
    failed_latency_ms: LatencySummary
    ok_latency_ms: LatencySummary

    @classmethod
    def of(cls, samples: Sequence[Sample], start_s: float, end_s: float) -> Window:
        inside = [s for s in samples if start_s <= s.t_s < end_s]
        outcomes: dict[str, Counter[str]] = {}
        for s in inside:
            outcomes.setdefault(s.op, Counter())[s.outcome] += 1
        return cls(
            start_s=round(start_s, 3),
            end_s=round(end_s, 3),
            outcomes={op: dict(sorted(c.items())) for op, c in sorted(outcomes.items())},
            failed_latency_ms=LatencySummary.of([s.latency_ms for s in inside if not s.ok]),
            ok_latency_ms=LatencySummary.of([s.latency_ms for s in inside if s.ok]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "outcomes": self.outcomes,
            "failed_latency_ms": self.failed_latency_ms.to_json(),
            "ok_latency_ms": self.ok_latency_ms.to_json(),
        }


@dataclass(frozen=True)
class Recovery:
    """One operation after the component was back: the first success, and the start of the
    success streak that lasted to the end of the run (no failure sent after it)."""

    op: str
    first_success_s: float | None  # after "ready"; None: never served again
    sustained_s: float | None  # after "ready"; None: still failing at the end
    failures_after_ready: int
    successes_after_ready: int

    @classmethod
    def of(cls, op: str, samples: Sequence[Sample], ready_s: float) -> Recovery:
        after = sorted((s for s in samples if s.op == op and s.t_s >= ready_s), key=lambda s: s.t_s)
        first = next((s.t_s for s in after if s.ok), None)
        last_failure = max((s.t_s for s in after if not s.ok), default=None)
        if last_failure is None:
            sustained = first
        else:
            sustained = next((s.t_s for s in after if s.ok and s.t_s > last_failure), None)
        return cls(
            op=op,
            first_success_s=None if first is None else round(max(0.0, first - ready_s), 3),
            sustained_s=None if sustained is None else round(max(0.0, sustained - ready_s), 3),
            failures_after_ready=sum(1 for s in after if not s.ok),
            successes_after_ready=sum(1 for s in after if s.ok),
        )


@dataclass(frozen=True)
class InFlight:
    """Requests sent before the fault and answered (or broken off) after it."""

    count: int
    outcomes: dict[str, int]

    @classmethod
    def of(cls, samples: Sequence[Sample], fault_s: float) -> InFlight:
        crossing = [s for s in samples if s.t_s < fault_s <= ended_s(s)]
        return cls(len(crossing), dict(sorted(Counter(s.outcome for s in crossing).items())))


def per_second(samples: Iterable[Sample], bucket_s: float = 1.0) -> list[dict[str, Any]]:
    """Outcome counts per operation for each bucket of send times: the drill's timeline, compact."""
    buckets: dict[int, dict[str, Counter[str]]] = {}
    for s in samples:
        buckets.setdefault(int(s.t_s // bucket_s), {}).setdefault(s.op, Counter())[s.outcome] += 1
    return [
        {"t_s": round(b * bucket_s, 3), **{op: dict(sorted(c.items())) for op, c in sorted(ops.items())}}
        for b, ops in sorted(buckets.items())
    ]


@dataclass
class Criteria:
    """The drill's pass criteria; each failed one is a line in :attr:`failures`."""

    allowed_failures: frozenset[str]  # outcomes a request may end with while the component is down
    fail_fast_ms: float  # every failed request must have failed at least this fast
    recovery_budget_s: float  # every operation must be served steadily again within this
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, failure: str) -> None:
        if not ok:
            self.failures.append(failure)

    def judge_timeline(self, samples: Sequence[Sample], fault_s: float, recoveries: Sequence[Recovery]) -> None:
        before = [s for s in samples if ended_s(s) < fault_s and not s.ok]
        self.check(not before, f"{len(before)} requests failed before the fault was injected")
        crashes = Counter(s.outcome for s in samples if is_server_error(s.outcome))
        self.check(not crashes, f"server errors other than 503: {dict(crashes)}")
        hangs = [s for s in samples if s.outcome == "timeout"]
        self.check(not hangs, f"{len(hangs)} requests hung until the client timeout")
        unexpected = Counter(s.outcome for s in samples if not s.ok and s.outcome not in self.allowed_failures)
        self.check(not unexpected, f"failures other than {sorted(self.allowed_failures)}: {dict(unexpected)}")
        slow = [s for s in samples if not s.ok and s.latency_ms > self.fail_fast_ms]
        self.check(
            not slow,
            f"{len(slow)} failed requests took longer than {self.fail_fast_ms:.0f} ms "
            f"(slowest {max((s.latency_ms for s in slow), default=0):.0f} ms)",
        )
        for r in recoveries:
            steady = r.sustained_s is not None and r.sustained_s <= self.recovery_budget_s
            self.check(
                steady,
                f"{r.op} not served steadily within {self.recovery_budget_s:.0f} s of the component's return "
                f"(sustained after {r.sustained_s} s)",
            )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["allowed_failures"] = sorted(self.allowed_failures)
        data["passed"] = not self.failures
        return data
