"""A generated corpus and generated recall messages for differential checks of the relevance path
(tests/test_vocabulary_differential.py, benchmarks/vocabulary_bench.py).

Seeded and self-contained: the same seed gives the same beliefs and the same messages. Names and
aliases mix real technology words, invented ones, plurals, CamelCase, dotted, hyphenated and short
handles, multi-word phrases and a few Japanese/Chinese/accented units; messages are short, long (past
the 32 fuzzy words), misspelt (one edit anywhere, also in the guarded prefix), multi-word, and
code-heavy (fences, paths, URLs, identifiers) so the query clean-up and both word and shingle
clauses are exercised.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from typing import Any

from service.domain.belief import Belief


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


REAL_WORDS = _words(
    "kafka postgres redis mongo mongoose react typescript python django fastapi celery docker kubernetes "
    "terraform ansible nginx graphql grpc webpack vite jest pytest eslint prettier sentry datadog grafana "
    "prometheus elasticsearch opensearch lambda aurora dynamo cassandra rabbitmq sqlite mysql prisma "
    "sequelize express nextjs remix svelte angular vue tailwind bootstrap stripe paypal oauth jwt saml "
    "session cache queue worker scheduler migration rollback deploy release branch review testing "
    "logging metrics tracing retry timeout backoff idempotency pagination cursor sharding replica "
    "eviction tuning index schema payment invoice refund currency money decimal float error handling "
    "strategy hierarchy class interface inheritance composition monorepo polyrepo lint format style"
)
SHORT_HANDLES = ("k8s", "ts", "gha", "ci", "cd", "db", "ui", "api", "sql", "orm", "s3", "ec2", "tf")
FOREIGN_UNITS = (
    "größenlimit",
    "überwachung",
    "café",
    "テスト方針",
    "セッションストア",
    "決済プロバイダ",
    "数据库选型",
    "缓存",
)
STOPWORDS = ("the", "a", "and", "of", "to", "for", "with", "our", "we", "is", "what", "how", "does", "in", "on")
FILLER = _words(
    "please can you help me figure out why this keeps failing whenever we try again after lunch today "
    "maybe something changed yesterday but nobody remembers exactly what it was so let us check"
)


def _invented(rng: random.Random) -> str:
    syllables = ["ka", "lo", "mi", "ter", "zen", "dra", "pix", "qu", "sor", "vel", "no", "rax", "ti", "bun", "ex"]
    return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words = list(REAL_WORDS)
    while len(words) < size:
        words.append(_invented(rng))
    return words


def one_edit(rng: random.Random, word: str) -> str:
    """A random insertion, deletion, substitution or adjacent transposition, anywhere."""
    if len(word) < 2:
        return word + rng.choice(string.ascii_lowercase)
    i = rng.randrange(len(word))
    kind = rng.choice(("insert", "delete", "substitute", "transpose", "plural"))
    if kind == "insert":
        return word[:i] + rng.choice(string.ascii_lowercase) + word[i:]
    if kind == "delete":
        return word[:i] + word[i + 1 :]
    if kind == "substitute":
        return word[:i] + rng.choice(string.ascii_lowercase) + word[i + 1 :]
    if kind == "transpose" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word + "s"


def _alias(rng: random.Random, words: list[str]) -> str:
    shape = rng.random()
    if shape < 0.35:
        return rng.choice(words)
    if shape < 0.6:
        return " ".join(rng.sample(words, rng.randint(2, 3)))
    if shape < 0.68:
        return "".join(w.capitalize() for w in rng.sample(words, 2))  # CamelCase
    if shape < 0.74:
        return f"{rng.choice(words)}.js"
    if shape < 0.8:
        return "-".join(rng.sample(words, 2))
    if shape < 0.88:
        return rng.choice(SHORT_HANDLES)
    if shape < 0.94:
        return rng.choice(words) + "s"
    return rng.choice(FOREIGN_UNITS)


def generated_beliefs(tenant_id: str, owner: str, count: int, *, seed: int = 16) -> list[Belief]:
    """``count`` beliefs of one owner in ``domain:code``; a few superseded or open questions, so
    the lifecycle and type filters are part of what both paths must agree on."""
    rng = random.Random(seed)
    words = _vocabulary(rng, 400)
    beliefs = []
    for i in range(count):
        name = "_".join(rng.sample(words, rng.randint(1, 3)))
        record: dict[str, Any] = {
            "_id": f"g-{i}",
            "type": rng.choice(("decision", "preference", "entity")),
            "canonical_name": f"{name}_{i}" if rng.random() < 0.3 else name,
            "aliases": sorted({_alias(rng, words) for _ in range(rng.randint(0, 5))}),
            "content": f"Generated belief {i}.",
            "why_it_matters": "Differential check.",
            "scope": ["domain:code"],
            "owner_id": owner,
            "pinned": False,
        }
        if rng.random() < 0.05:
            record["type"] = "open_question"
        if rng.random() < 0.05:
            record.update(superseded_by=f"g-{(i + 1) % count}", epistemic_status="superseded")
        beliefs.append(Belief.from_record(record, tenant_id=tenant_id))
    return beliefs


def generated_messages(beliefs: list[Belief], count: int, *, seed: int = 61) -> Iterator[str]:
    """``count`` recall messages drawn from the corpus' own names and aliases (and near misses)."""
    rng = random.Random(seed)
    units = [a for b in beliefs for a in b.aliases] + [b.canonical_name for b in beliefs]
    words = sorted({w for u in units for w in u.replace("_", " ").replace("-", " ").split()} | set(REAL_WORDS))

    def word() -> str:
        w = rng.choice(words)
        return one_edit(rng, w) if rng.random() < 0.3 else w

    def sentence(n: int) -> str:
        out = []
        for _ in range(n):
            r = rng.random()
            out.append(rng.choice(STOPWORDS) if r < 0.2 else rng.choice(FILLER) if r < 0.45 else word())
            if rng.random() < 0.08:
                out.append(rng.choice(units))
        return " ".join(out)

    kinds = ("short", "typo", "multi", "long", "code", "case")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        if kind == "short":
            yield " ".join(word() for _ in range(rng.randint(1, 3))) + rng.choice(("", "?", "!"))
        elif kind == "typo":
            yield f"{rng.choice(STOPWORDS)} {one_edit(rng, rng.choice(units))} {one_edit(rng, word())}"
        elif kind == "multi":
            yield f"how do we handle {rng.choice(units)} and {rng.choice(units)} in {sentence(3)}"
        elif kind == "long":
            yield sentence(rng.randint(36, 90))
        elif kind == "code":
            ident = rng.choice(units).replace(" ", "_")
            yield (
                f"Why does `{ident}()` fail in src/{word()}/{word()}.py?\n```python\nimport {word()}\n"
                f"{ident} = {word()}.connect('https://{word()}.example.com/x')\n```\n"
                f"Trace: at {word()}.run (/srv/app/{word()}.js:12:3) {sentence(rng.randint(3, 12))} 0xdeadbeef42"
            )
        else:
            yield " ".join(rng.choice((str.upper, str.title, str.lower))(word()) for _ in range(rng.randint(2, 6)))
