"""Belief compaction (paper §5.1): per (tenant, owner, scope, type) buckets over thresholds.

Conservative: a false merge is worse than a duplicate.
- Only beliefs with the *same scopes* are merged: the merged belief has the keep's scopes, so
  another source's statement would otherwise reach a scope it was never in, or leave one it was in
  (the bucket is one scope; a belief may have several).
- Without a configured model only beliefs with the *same normalised content* (same
  ``content_fingerprint``) are merged.
- With a model (``loop.compaction_llm_*``, OpenAI-compatible) the model proposes merges and
  per-domain expertise assessments; every proposal is checked (ids from the bucket only, each id in
  one merge, the same scopes, valid names, no instruction-like text) and anything doubtful is
  dropped.
A merge inserts a new belief (id derived from the sources, so a re-run is idempotent) with the
union of aliases plus the retired canonical names, the summed reinforcement and the latest
reinforcement time, then supersedes every source with a compaction note. Everything is audited.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import redis
from redis.exceptions import LockNotOwnedError

from service import redis_keys
from service.auth.actor import Actor
from service.beliefs.lifecycle import BeliefLifecycle, Change, merge_aliases, spoken_name
from service.config import MemoryLoopSettings, Settings
from service.content_coding import IDENTITY, AnswerTooLarge, AnswerTooSlow, ContentCodingError, read_bounded
from service.domain import scopes as scope_rules
from service.domain.audit import AuditAction
from service.domain.belief import (
    MAX_ALIASES,
    Belief,
    BeliefType,
    EpistemicStatus,
    ExpertiseDepth,
    Subtype,
    content_fingerprint,
    normalize_aliases,
    normalize_canonical_name,
    utcnow,
)
from service.domain.principal import Principal
from service.domain.text import clip
from service.extraction.validator import addresses_system
from service.storage.lookup import BeliefLookup, BucketKey

log = logging.getLogger("tenure.extraction.compaction")
ACTOR = "compaction"
DEDUP_PROMPT = """You merge duplicate beliefs about one user. Input: a JSON array of beliefs
{id, type, canonical_name, content, aliases, scope}. Only merge when you are highly confident two
beliefs express the same fact. Conservative is always correct here: when unsure, leave them.
Return ONLY JSON: {"merges": [{"keep_id", "retire_ids": [...], "merged_content",
"merged_canonical_name" (snake_case), "merged_aliases": [...], "compaction_note", "belief_type"}],
"no_action_ids": [...]}. merged_aliases must include the canonical names of all retired beliefs
for search continuity. For preferences, merged_content must read as a direct instruction a model
can act on immediately; preserve nuance."""
EXPERTISE_PROMPT = """You synthesise a user's expertise per domain from evidence beliefs.
Input: a JSON array {id, canonical_name, content, why_it_matters, expertise_domain,
expertise_depth, epistemic_status, confidence, reinforcement_count, scope}. Depths: learning
(explain), working (skip basics, show trade-offs), deep (informed peer), expert (defer on opinion).
Produce a parent rollup only when 2+ subdomains are assessed and consistent; a parent depth is the
floor of its subdomains. Never invent a rollup from one subdomain. Return ONLY JSON:
{"assessments": [{"domain", "depth", "evidence_count", "canonical_name", "content",
"why_it_matters", "confidence"}], "retire_ids": [...]}."""


def bucket_kind(type_: str, subtype: str | None) -> str | None:
    if type_ == BeliefType.PREFERENCE.value:
        return "expertise" if subtype == Subtype.EXPERTISE.value else ("preference" if subtype is None else None)
    if type_ in (BeliefType.ENTITY.value, BeliefType.DECISION.value) and subtype is None:
        return type_
    return None  # relations, open questions and style signals are never compacted


def thresholds(policy: MemoryLoopSettings) -> dict[str, int]:
    return {
        "preference": policy.compaction_threshold_preference,
        "expertise": policy.compaction_threshold_expertise,
        "entity": policy.compaction_threshold_entity,
        "decision": policy.compaction_threshold_decision,
    }


class Cooldown(Protocol):
    def active(self, key: str) -> bool: ...
    def mark(self, key: str, seconds: int) -> None: ...


class RedisCooldown:
    def __init__(self, client: redis.Redis[bytes], namespace: str):
        self.client = client
        self.namespace = namespace

    def active(self, key: str) -> bool:
        return bool(self.client.exists(redis_keys.compaction_cooldown(self.namespace, key)))

    def mark(self, key: str, seconds: int) -> None:
        if seconds > 0:
            self.client.set(redis_keys.compaction_cooldown(self.namespace, key), "1", ex=seconds)


class BucketLock(Protocol):
    def hold(self, key: str) -> AbstractContextManager[bool]: ...


class RedisBucketLock:
    """One compaction of a bucket at a time. Two runs at once (the admin trigger and beat, or a
    redelivered task beside the first) would each ask the model, get different plans, and so
    write two overlapping merged beliefs (the ids derive from the sources). ``ttl_s`` outlasts
    the task's hard time limit, so a lock of a killed task frees itself only when no run of it
    can be left; until then its bucket waits for the next plan. redis-py's lock: a token per
    holder, released only by its holder."""

    def __init__(self, client: redis.Redis[bytes], namespace: str, ttl_s: int):
        self.client = client
        self.namespace = namespace
        self.ttl_s = ttl_s

    @contextmanager
    def hold(self, key: str) -> Iterator[bool]:
        """Yields whether this run holds the bucket (False: another run does; do nothing)."""
        lock = self.client.lock(redis_keys.compaction_lock(self.namespace, key), timeout=self.ttl_s, blocking=False)
        held = lock.acquire()
        try:
            yield held
        finally:
            if held:
                with contextlib.suppress(LockNotOwnedError):  # expired meanwhile: another run may hold it
                    lock.release()


class ModelUnavailable(Exception):
    """The compaction model gave no answer to use: unreachable, an error status, or an answer past
    its bounds (too large once decoded, or still arriving at the call's deadline)."""


class CompactionLLM:
    """A synchronous OpenAI-compatible chat call that must answer with one JSON object.

    The model provider is not this deployment's: its answer is asked for uncompressed, read as it
    arrives (one compressed anyway decoded in bounded pieces) up to ``max_body_bytes`` decoded, and
    the whole call ends ``timeout_s`` after it began (httpx's timeout applies to each read; a read
    waiting at the deadline ends at its own, the same length). Past either the connection is
    closed with the rest unread and nothing of the answer is used (:class:`ModelUnavailable`)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        timeout_s: float = 80.0,
        max_body_bytes: int = 16 * 1024 * 1024,
    ):
        headers = {**IDENTITY, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.model = model
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes

    def complete_json(self, system: str, payload: Any, *, max_tokens: int) -> dict[str, Any] | None:
        """The JSON object in the model's answer; None when it holds none (an answer without one
        is the model declining); :class:`ModelUnavailable` when there is no answer to use."""
        body = {
            "model": self.model,
            "temperature": 0.1,
            "max_tokens": max_tokens,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
            ],
        }
        answer = self._post(body)
        try:
            text = json.loads(answer)["choices"][0]["message"]["content"]
            data = _object_in(text) if isinstance(text, str) else None
        except (KeyError, IndexError, TypeError, ValueError, RecursionError):  # nested past the parser's limit
            return None
        return data if isinstance(data, dict) else None

    def _post(self, body: dict[str, Any]) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        try:
            with self.client.stream("POST", "/chat/completions", json=body) as response:
                response.raise_for_status()
                return read_bounded(response.iter_raw(), response.headers, self.max_body_bytes, deadline=deadline)
        except AnswerTooLarge as exc:
            raise ModelUnavailable(
                f"its answer exceeds {exc.limit} bytes (TENURE_LOOP_UPSTREAM_MAX_BODY_BYTES)"
            ) from exc
        except AnswerTooSlow as exc:
            raise ModelUnavailable(
                f"its answer took longer than {self.timeout_s:g} s (TENURE_LOOP_COMPACTION_LLM_TIMEOUT_S)"
            ) from exc
        except (httpx.HTTPError, ContentCodingError) as exc:
            raise ModelUnavailable(f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def _object_in(text: str) -> Any:
    """The JSON from the text's first ``{`` to its last ``}`` (a model may wrap its object in
    prose), None without such a span. Found in linear time: a regex search for it tried every
    ``{`` to the text's end, quadratic in an answer of braces that never close."""
    start, end = text.find("{"), text.rfind("}")
    return json.loads(text[start : end + 1]) if 0 <= start < end else None


def llm_from_settings(settings: Settings) -> CompactionLLM | None:
    loop = settings.loop
    if not loop.compaction_llm_model:
        return None
    base = loop.compaction_llm_base_url or loop.upstream_base_url
    if not base:
        return None
    key = loop.compaction_llm_api_key or loop.upstream_api_key
    # a third of the bucket task's soft limit at most: even with a read waiting at the deadline
    # (ending at its own timeout, as long), the call ends before the soft limit, merges still to do
    timeout_s = min(loop.compaction_llm_timeout_s, settings.celery.heavy_soft_time_limit_s / 3)
    return CompactionLLM(
        base,
        loop.compaction_llm_model,
        key.get_secret_value() if key else None,
        timeout_s=timeout_s,
        max_body_bytes=loop.upstream_max_body_bytes,
    )


@dataclass(frozen=True)
class MergePlan:
    keep_id: str
    retire_ids: tuple[str, ...]
    content: str
    canonical_name: str
    aliases: tuple[str, ...]
    note: str


@dataclass
class CompactionReport:
    bucket: dict[str, Any]
    ran: bool = False
    reason: str | None = None
    merges: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# How settled a statement is (paper §2.2): stated by the user, inferred, being considered.
SETTLED = {EpistemicStatus.ACTIVE: 2, EpistemicStatus.INFERRED: 1, EpistemicStatus.EXPLORATORY: 0}


def _owner_principal(key: BucketKey) -> Principal:
    """The bucket's owner, with the grant for a shared bucket scope (their own beliefs)."""
    projects = frozenset({key.scope.split(":", 1)[1]}) if key.scope.startswith("project:") else frozenset()
    teams = frozenset({key.scope.split(":", 1)[1]}) if key.scope.startswith("team:") else frozenset()
    return Principal(tenant_id=key.tenant_id, user_id=key.owner_id, projects=projects, teams=teams)


def _unavailable(exc: ModelUnavailable, outcome: str) -> str:
    """The run's note (in its report and audit event) of a model call with no answer to use; the
    bucket is left as it is, the next plan after its cooldown asks again."""
    log.warning("compaction model unavailable: %s", exc)
    return f"model unavailable: {exc}; {outcome}"


def _clean_text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip() or len(value) > limit or addresses_system(value):
        return None
    return value.strip()


class Compactor:
    def __init__(
        self,
        lifecycle: BeliefLifecycle,
        policy: MemoryLoopSettings,
        cooldown: Cooldown,
        lock: BucketLock,
        llm: CompactionLLM | None,
        *,
        actor_kind: str = "memory_loop",
    ):
        self.lifecycle = lifecycle
        self.store = lifecycle.store
        self.lookup = BeliefLookup(lifecycle.store)
        self.policy = policy
        self.cooldown = cooldown
        self.lock = lock
        self.llm = llm
        self.actor_kind = actor_kind

    def _change(self, principal: Principal, key: str) -> Change:
        """Compaction's changes: the bucket owner's beliefs, ``compaction`` in their change logs,
        keyed by the plan so a re-run of the same bucket repeats nothing."""
        return Change(actor=Actor(principal=principal, kind=self.actor_kind), key=key, author=ACTOR)

    # --------------------------------------------------------------- planning

    def plan(self, *, tenant_id: str | None = None, force: bool = False) -> list[BucketKey]:
        limits = thresholds(self.policy)
        floor = 2 if force else min(limits.values())
        out: list[BucketKey] = []
        for key in self.lookup.plan_buckets(min_count=floor, tenant_id=tenant_id):
            kind = bucket_kind(key.type, key.subtype)
            if kind is None or (kind == "expertise" and self.llm is None):
                continue
            if not force and (key.count < limits[kind] or self.cooldown.active(self._cooldown_key(key))):
                continue
            out.append(key)
        return out

    @staticmethod
    def _cooldown_key(key: BucketKey) -> str:
        return f"{key.tenant_id}|{key.owner_id}|{key.scope}|{key.type}|{key.subtype}"

    # --------------------------------------------------------------- one bucket

    def compact(self, key: BucketKey, *, force: bool = False) -> CompactionReport:
        with self.lock.hold(self._cooldown_key(key)) as held:
            if not held:
                report = CompactionReport(bucket=key.__dict__)
                report.reason = "another compaction of this bucket is running"
                return report
            return self._compact(key, force=force)

    def _compact(self, key: BucketKey, *, force: bool) -> CompactionReport:
        report = CompactionReport(bucket=key.__dict__)
        kind = bucket_kind(key.type, key.subtype)
        if kind is None:
            report.reason = "this type is never compacted"
            return report
        principal = _owner_principal(key)
        beliefs = self.lookup.bucket(principal, key.scope, key.type, key.subtype)
        if not force and len(beliefs) < thresholds(self.policy)[kind]:
            report.reason = f"{len(beliefs)} live beliefs, below the threshold"
            return report
        report.ran = True
        if kind == "expertise":
            self._synthesise(principal, key, beliefs, report)
        else:
            plans = self._llm_plans(beliefs, report) if self.llm else self._exact_plans(beliefs)
            for plan in plans:
                if (taken := self._source_taken(key, plan)) is not None:
                    report.rejected.append(taken)
                    continue
                report.merges.append(self._apply(principal, key, beliefs, plan))
        self.cooldown.mark(self._cooldown_key(key), self.policy.compaction_cooldown_s)
        self.lifecycle.record(
            self._change(principal, f"run|{self._cooldown_key(key)}|{utcnow().isoformat()}"),
            AuditAction.COMPACTION_RUN,
            [m["new_id"] for m in report.merges],
            scopes=[key.scope],
            details={
                "bucket": key.__dict__,
                "merges": report.merges,
                "rejected": report.rejected,
                "mode": "llm" if self.llm else "exact",
            },
        )
        return report

    @staticmethod
    def _exact_plans(beliefs: list[Belief]) -> list[MergePlan]:
        groups: dict[tuple[str, frozenset[str]], list[Belief]] = defaultdict(list)
        for belief in beliefs:
            groups[content_fingerprint(belief.content), frozenset(belief.scope)].append(belief)
        plans = []
        for group in groups.values():
            if len(group) < 2:
                continue
            # the merged belief takes the kept one's status: after the user's own edit, the most
            # settled copy of the same statement is kept, never hedged by a more reinforced guess
            keep = max(
                group,
                key=lambda b: (
                    b.user_edited,
                    SETTLED.get(b.epistemic_status, 0),
                    b.pinned,
                    b.reinforcement_count,
                    -b.created_at.timestamp(),
                ),
            )
            retire = tuple(b.id for b in group if b.id != keep.id)
            plans.append(
                MergePlan(
                    keep.id,
                    retire,
                    keep.content,
                    keep.canonical_name,
                    (),
                    f"compaction: exact duplicates (same normalised content) of {keep.id}",
                )
            )
        return plans

    def _llm_plans(self, beliefs: list[Belief], report: CompactionReport) -> list[MergePlan]:
        assert self.llm is not None
        payload = [
            {
                "id": b.id,
                "type": b.type.value,
                "canonical_name": b.canonical_name,
                "content": b.content,
                "aliases": b.aliases,
                "scope": b.scope,
            }
            for b in beliefs
        ]
        try:
            data = self.llm.complete_json(DEDUP_PROMPT, payload, max_tokens=2000)
        except ModelUnavailable as exc:
            report.rejected.append(_unavailable(exc, "nothing merged"))
            return []
        if data is None or not isinstance(data.get("merges"), list):
            report.rejected.append("model answer unusable; nothing merged")
            return []
        known = {b.id: frozenset(b.scope) for b in beliefs}
        used: set[str] = set()
        plans = []
        for raw in data["merges"]:
            plan = self._check_plan(raw, known, used)
            if isinstance(plan, str):
                report.rejected.append(plan)
                continue
            used.update({plan.keep_id, *plan.retire_ids})
            plans.append(plan)
        return plans

    @staticmethod
    def _check_plan(raw: Any, known: dict[str, frozenset[str]], used: set[str]) -> MergePlan | str:
        """``known``: the bucket's ids and their scope sets."""
        if not isinstance(raw, dict):
            return "merge entry is not an object"
        keep, retire = raw.get("keep_id"), raw.get("retire_ids")
        if not isinstance(keep, str) or not isinstance(retire, list) or not retire:
            return "merge entry without keep_id/retire_ids"
        ids = [keep, *retire]
        if not all(isinstance(i, str) and i in known for i in ids) or len(set(ids)) != len(ids):
            return f"merge {keep!r} names ids outside the bucket or repeats one"
        if used.intersection(ids):
            return f"merge {keep!r} reuses an id of another merge"
        if len({known[i] for i in ids}) > 1:
            # the merged belief has the keep's scopes: another source's statement would reach a
            # scope it was never in, or leave one it was in
            return f"merge {keep!r} joins beliefs with different scopes"
        content = _clean_text(raw.get("merged_content"), 2000)
        name = normalize_canonical_name(str(raw.get("merged_canonical_name") or ""))
        if content is None or not name or len(name) > 120:
            return f"merge {keep!r} has no usable content or name"
        raw_aliases = raw.get("merged_aliases")
        aliases: list[Any] = raw_aliases if isinstance(raw_aliases, list) else []
        note = _clean_text(raw.get("compaction_note"), 500) or "compaction: merged by model"
        return MergePlan(
            keep,
            tuple(retire),
            content,
            name,
            tuple(a for a in aliases if isinstance(a, str)),
            note,
        )

    # --------------------------------------------------------------- applying

    @staticmethod
    def _merged_id(key: BucketKey, plan: MergePlan) -> str:
        """The merged belief's id, from the sources: the same plan run again writes the same one."""
        source_ids = sorted([plan.keep_id, *plan.retire_ids])
        return "b-c" + hashlib.sha256("|".join([key.tenant_id, *source_ids]).encode()).hexdigest()[:24]

    def _source_taken(self, key: BucketKey, plan: MergePlan) -> str | None:
        """Why the plan must not be applied: a source already superseded by another belief (read
        by key, in real time). The bucket was read before the model answered; meanwhile another
        run may have merged a source into a merged belief of its own plan, and a second merged
        belief would overlap it (its retire of that source then fails). A source superseded by
        this very plan's belief is an earlier attempt of the same merge, to be finished."""
        new_id = self._merged_id(key, plan)
        for source_id in (plan.keep_id, *plan.retire_ids):
            successor = self.store.successor_now(key.tenant_id, source_id)
            if successor not in (None, new_id):
                return f"merge {plan.keep_id!r} skipped: {source_id!r} is already superseded by {successor!r}"
        return None

    def _apply(self, principal: Principal, key: BucketKey, beliefs: list[Belief], plan: MergePlan) -> dict[str, Any]:
        by_id = {b.id: b for b in beliefs}
        keep = by_id[plan.keep_id]
        sources = [keep, *(by_id[i] for i in plan.retire_ids)]
        source_ids = sorted(b.id for b in sources)
        new_id = self._merged_id(key, plan)
        retired_names = [spoken_name(b.canonical_name) for b in sources if b.canonical_name != plan.canonical_name]
        # aliases a person took back from a source stay out, whatever the plan proposes
        current = {a for b in sources for a in b.aliases}
        removed = [a for b in sources for a in b.removed_aliases() if a not in current]
        proposed = [a for a in normalize_aliases(list(plan.aliases), cap=None) if a not in removed]
        # retired names first: they must survive the cap for search continuity
        aliases, cut = merge_aliases(
            [],
            [*retired_names, *proposed, *(a for b in sources for a in b.aliases)],
            cap=MAX_ALIASES,
        )
        all_inferred = all(b.epistemic_status is EpistemicStatus.INFERRED for b in sources)
        total = sum(b.reinforcement_count for b in sources)
        status = EpistemicStatus.ACTIVE if all_inferred and total >= 3 else keep.epistemic_status
        change = self._change(principal, f"compact|{new_id}")
        now = change.at
        latest = [b.last_reinforced_at for b in sources if b.last_reinforced_at]
        note = plan.note + (f" (alias cap: dropped {cut})" if cut else "")
        merged = keep.model_copy(
            update={
                "id": new_id,
                "canonical_name": plan.canonical_name,
                "content": plan.content,
                "aliases": aliases,
                "epistemic_status": status,
                "reinforcement_count": total,
                "last_reinforced_at": max(latest) if latest else now,
                "pinned": any(b.pinned for b in sources),
                "user_edited": any(b.user_edited for b in sources),
                "supersedes": keep.id,
                "superseded_by": None,
                "compaction_note": clip(note, 2000),
                "created_at": now,
                "updated_at": now,
                "version": 1,
                "change_log": [
                    change.entry(
                        f"compaction: merged from {', '.join(source_ids)}",
                        note=note,
                        removed_aliases=[a for a in dict.fromkeys(removed) if a not in aliases],
                    )
                ],
            }
        )
        Belief.model_validate(merged.model_dump())
        self.lifecycle.merge(change, merged, sources, clip(note, 2000))
        return {
            "new_id": new_id,
            "sources": source_ids,
            "canonical_name": plan.canonical_name,
            "aliases": aliases,
        }

    def _synthesise(
        self, principal: Principal, key: BucketKey, beliefs: list[Belief], report: CompactionReport
    ) -> None:
        assert self.llm is not None
        payload = [
            {
                "id": b.id,
                "canonical_name": b.canonical_name,
                "content": b.content,
                "why_it_matters": b.why_it_matters,
                "expertise_domain": b.expertise_domain,
                "expertise_depth": b.expertise_depth.value if b.expertise_depth else None,
                "epistemic_status": b.epistemic_status.value,
                "confidence": b.confidence,
                "reinforcement_count": b.reinforcement_count,
                "scope": b.scope,
            }
            for b in beliefs
        ]
        try:
            data = self.llm.complete_json(EXPERTISE_PROMPT, payload, max_tokens=3000)
        except ModelUnavailable as exc:
            report.rejected.append(_unavailable(exc, "no expertise synthesised"))
            return
        if data is None or not isinstance(data.get("assessments"), list):
            report.rejected.append("model answer unusable; no expertise synthesised")
            return
        raw_retire = data.get("retire_ids")
        listed = [i for i in raw_retire if isinstance(i, str)] if isinstance(raw_retire, list) else []
        by_id = {b.id: b for b in beliefs}
        also_retire = {i for i in listed if i in by_id}
        now = utcnow()
        for raw in data["assessments"]:
            if not isinstance(raw, dict):
                continue
            domain = _clean_text(raw.get("domain"), 200)
            content = _clean_text(raw.get("content"), 2000)
            why = _clean_text(raw.get("why_it_matters"), 500) or ""
            try:
                depth = ExpertiseDepth(raw.get("depth"))
            except ValueError:
                depth = None
            if not domain or not content or depth is None:
                report.rejected.append(f"assessment for {str(raw.get('domain'))[:40]!r} incomplete")
                continue
            raw_evidence = raw.get("evidence_count")
            evidence: int = raw_evidence if isinstance(raw_evidence, int) else 1
            name = normalize_canonical_name(domain.replace("/", "_")) + "_expertise"
            new_id = (
                "b-x" + hashlib.sha256(f"{key.tenant_id}|{key.owner_id}|{name}|{content}".encode()).hexdigest()[:24]
            )
            same_domain = [b for b in beliefs if b.expertise_domain == domain]
            change = self._change(principal, f"expertise|{new_id}")
            try:  # the model's values may break a rule only the whole belief checks (a long name)
                belief = Belief(
                    id=new_id,
                    tenant_id=key.tenant_id,
                    owner_id=key.owner_id,
                    type=BeliefType.PREFERENCE,
                    subtype=Subtype.EXPERTISE,
                    canonical_name=name,
                    content=content,
                    why_it_matters=why,
                    scope=scope_rules.normalize_scopes([key.scope]),
                    epistemic_status=EpistemicStatus.ACTIVE,
                    confidence=float(raw["confidence"])
                    if isinstance(raw.get("confidence"), int | float) and 0 <= raw["confidence"] <= 1
                    else 0.8,
                    reinforcement_count=max(0, evidence),
                    last_reinforced_at=now,
                    expertise_domain=domain,
                    expertise_depth=depth,
                    aliases=same_domain[0].aliases if same_domain else [],
                    compaction_note="compaction: expertise synthesis",
                    change_log=[change.entry("compaction: expertise synthesis")],
                )
            except ValueError as exc:
                report.rejected.append(f"assessment for {domain[:40]!r} incomplete: {str(exc)[:200]}")
                continue
            # an earlier run of this bucket may have created it: the keyed change finishes that run
            self.lifecycle.create(change, belief, details={"trigger": "compaction: expertise synthesis"})
            retire = {b.id for b in same_domain} | also_retire
            # the new belief has the bucket's scope alone: evidence in other scopes too stays there
            retire = {i for i in retire if set(by_id[i].scope) == {key.scope}}
            for rid in sorted(retire):
                if rid != new_id:
                    self.lifecycle.retire(change, rid, new_id, note="compaction: expertise synthesis", compaction=True)
            report.merges.append(
                {
                    "new_id": new_id,
                    "sources": sorted(retire),
                    "canonical_name": name,
                    "aliases": belief.aliases,
                }
            )
