"""The recall benchmark's compiled load client (``benchmarks/pacer/``, Go, standard library only).

The Python clients cost 0.35-0.5 ms of CPU per recall (the SDK's lean transport, decoding each
answer), taken from the same two cores that serve the recalls: at 300/s that is 6-8 % of the
machine, and in the sequential pass it is time on every call's critical path. The pacer sends the
same requests (headers and body as the SDK builds them, one keep-alive connection per request in
flight) without decoding the answers, reads nothing but the status, and reports each request's
latency (from its due time in the paced pass) and its own CPU. ``fastpath_bench --load-client go
--seq-client go`` uses it; the figures are shaped by ``fastpath_bench`` like its own clients'.

Building needs the Go toolchain (``go`` on ``PATH`` or ``GO``); the binary is cached under the
state dir, named by a hash of the sources, so an edit rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tenure_client import _calls as calls
from tenure_client.client import USER_AGENT

from benchmarks.recall_bench import Query

SOURCE = Path(__file__).resolve().parent / "pacer"
DEFAULT_GO_DIR = "/usr/local/go/bin"  # where Go's own archive installs it, often not on PATH
SENT_HEADERS = ("content-type", "user-agent", "authorization")  # Go sets Host and Content-Length


class PacerUnavailable(RuntimeError):
    """The Go toolchain is missing or the build failed."""


def build(into: Path) -> Path:
    """The pacer's binary under ``into``, built unless one of the same sources is there."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE.glob("*")):
        if path.suffix in (".go", ".mod"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    binary = into / f"pacer-{digest.hexdigest()[:12]}"
    if binary.exists():
        return binary
    go = os.environ.get("GO") or shutil.which("go") or shutil.which("go", path=DEFAULT_GO_DIR)
    if go is None:
        raise PacerUnavailable("the Go toolchain is needed for the compiled load client: install go or set GO=")
    into.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    done = subprocess.run(  # noqa: S603 - our own sources, a fixed command
        [go, "build", "-trimpath", "-o", str(partial), "."], cwd=SOURCE, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise PacerUnavailable(f"go build failed: {done.stderr.strip()}")
    partial.rename(binary)
    return binary


def request_of(url: str, api_key: str, q: Query) -> dict[str, Any]:
    """``q`` as the SDK's ``recall_json`` sends it: its call's JSON body, the SDK's headers."""
    call = calls.recall(q.message, q.scopes, None, None, False)
    request = httpx.Request(
        call.method, url, json=call.json, headers={"User-Agent": USER_AGENT, "Authorization": f"Bearer {api_key}"}
    )
    headers = {name: value for name, value in request.headers.items() if name.lower() in SENT_HEADERS}
    return {"headers": headers, "body": request.content.decode()}


@dataclass(frozen=True)
class Plan:
    """The requests of one pass, written once before it is timed (building them costs the client
    ~50 us each, which is not the pass's work)."""

    url: str
    path: Path
    kinds: list[str]

    @classmethod
    def write(cls, base_url: str, queries: Iterable[Query], key_for: Callable[[Query], str], into: Path) -> Plan:
        url = f"{base_url}/v1/recall"
        listed = list(queries)
        if not listed:
            raise ValueError("a plan needs requests")
        into.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix="pacer-plan-", suffix=".json", dir=into)
        with os.fdopen(handle, "w") as out:
            json.dump([request_of(url, key_for(q), q) for q in listed], out)
        return cls(url, Path(name), [q.kind for q in listed])

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Outcome:
    """What the pacer saw: each answered request's (offset from the start in s, latency ms, kind),
    the failures by cause, the pass's wall time, the pacer's own CPU seconds, the wall-clock
    time of its start (the paced pass's first due time) and the TCP connections it opened (one
    per lane or client, one more each time the server closed one)."""

    answered: list[tuple[float, float, str]]
    causes: dict[str, int]
    wall_s: float
    cpu_s: float
    start_unix_s: float
    connects: int


def run(binary: Path, plan: Plan, mode: str, *, timeout_s: float = 30.0, **params: float) -> Outcome:
    """One pass (``sequential``, ``paced`` with ``rate``, ``seconds``, ``grace_s``,
    ``max_in_flight``; ``ceiling`` with ``connections``, ``seconds``; ``max_s`` stops a
    sequential pass) over ``plan``'s requests, in order, cycling when a pass outlasts them."""
    spec = {"url": plan.url, "mode": mode, "requests_file": str(plan.path), "timeout_s": timeout_s, **params}
    with tempfile.TemporaryDirectory(prefix="pacer-") as scratch:
        spec_path, out_path = Path(scratch) / "plan.json", Path(scratch) / "result.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(  # noqa: S603 - the binary built from our sources
            [str(binary), "-plan", str(spec_path), "-out", str(out_path)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"pacer {mode} failed ({done.returncode}): {done.stderr.strip()}")
        result = json.loads(out_path.read_text())
    kinds = plan.kinds
    answered = [
        (r["at_ns"] / 1e9, r["latency_ns"] / 1e6, kinds[r["k"] % len(kinds)])
        for r in sorted(result["records"] or [], key=lambda r: r["at_ns"])
        if not r.get("cause")
    ]
    return Outcome(
        answered=answered,
        causes=dict(result["causes"] or {}),
        wall_s=float(result["wall_s"]),
        cpu_s=float(result["cpu_s"]),
        start_unix_s=result["start_unix_ns"] / 1e9,
        connects=int(result["connects"]),
    )
