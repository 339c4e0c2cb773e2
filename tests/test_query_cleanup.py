from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import cleanup_ab
from benchmarks.cleanup_ab import REFERENCE_EMPHASIS, REFERENCE_HEX, REFERENCE_INTEGER, reference_text, time_both
from service.recall import query
from service.recall.query import clean_query


def test_short_messages_pass_through_raw() -> None:
    assert clean_query("k8s?").text == "k8s?"


def test_noise_is_stripped() -> None:
    message = (
        "Why does `redis.get()` fail at https://example.com/x in src/app/cache.py?\n"
        "```python\nprint('hi')\n```\n    at Object.<anonymous> (/srv/app.js:10:5)\n"
        "error 0xdeadbeefcafe 1234 times **really**"
    )
    cleaned = clean_query(message)
    assert cleaned.text == "Why does fail at in error times really"
    assert cleaned.was_noisy


def test_long_messages_are_clamped_front_biased() -> None:
    cleaned = clean_query("redis " * 500, max_chars=100)
    assert cleaned.clamped and len(cleaned.text) <= 100 and cleaned.text.startswith("redis")


def test_snake_case_and_dotted_names_survive() -> None:
    assert clean_query("what about redis_cache and react.js here?").text == "what about redis_cache and react.js here"


def test_cjk_text_survives_clean_up() -> None:
    message = "数据库/缓存/队列 怎么选？セッションストアの設定を教えて。ログは /var/log/app.log にある"
    text = clean_query(message).text
    assert "数据库/缓存/队列" in text and "セッションストアの設定を教えて" in text
    assert "/var/log/app.log" not in text


def test_a_long_cjk_message_is_clamped_by_characters_not_to_its_first_space() -> None:
    message = "Redis " + "設定を見直す" * 300
    text = clean_query(message, max_chars=1000).text
    assert len(text) == 1000 and text.startswith("Redis 設定")


def test_clamping_never_splits_a_grapheme() -> None:
    message = "テスト" + "か\u3099" * 600  # kana + combining voiced sound mark: one grapheme each
    text = clean_query(message, max_chars=1000).text
    assert len(text) == 999 and text.endswith("か\u3099")


# ---------------------------------------------------------------- the fast clean-up is the same

# The plain clean-up (every pattern tried on every message, the original spelling of the three
# rewritten ones) lives beside its benchmark, benchmarks/cleanup_ab.py: the fast one must equal it.


# Characters the patterns care about, look-alikes re folds under IGNORECASE (long s, dotless and
# dotted i, Kelvin), other white space, digits of other scripts, Latin and CJK letters.
_ALPHABET = (
    "aAbfFhHiIsStTwWxX0123456789 _*.,;:?!/~@-`#<>[]()\"'\t\n\r\x0b\x0c"
    "\u00a0\u2028\u3000\u017f\u0130\u0131\u212a\u00e9\u0663\uff11数据库缓存"
)
_TOKENS = (
    "https://",
    "HTTP://",
    "ftp://",
    "file://",
    "www.",
    "WWW.",
    "0x",
    "0X",
    "```",
    "~~~",
    "    ",
    "\tat ",
    " at ",
    "__",
    "***",
    "deadbeef",
    "DeadBeef00",
    "12.5",
    "1,000",
    "src/app/x.py",
    "/var/log",
    "~/x",
    "../y",
    "a/b/c",
    "[x.md]",
    "<a.TS>",
    "<b>",
    "</i>",
    "# ",
    "### ",
    "redis_cache",
    "_x_",
    "snake_case_",
)
_messages = st.lists(st.one_of(st.text(alphabet=_ALPHABET, max_size=6), st.sampled_from(_TOKENS)), max_size=40).map(
    "".join
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_messages)
def test_the_fast_clean_up_equals_the_reference(message: str) -> None:
    assert clean_query(message, max_chars=10_000).text == reference_text(message)


@pytest.mark.parametrize(
    ("fast", "reference"),
    [(query._EMPHASIS, REFERENCE_EMPHASIS), (query._HEX, REFERENCE_HEX), (query._INTEGER, REFERENCE_INTEGER)],
    ids=["emphasis", "hex", "integer"],
)
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet=_ALPHABET, max_size=8), st.sampled_from(_TOKENS)), max_size=30).map("".join))
def test_each_rewritten_pattern_matches_where_its_original_did(
    fast: re.Pattern[str], reference: re.Pattern[str], text: str
) -> None:
    assert [m.span() for m in fast.finditer(text)] == [m.span() for m in reference.finditer(text)]


def test_the_generated_benchmark_messages_clean_up_as_before() -> None:
    # real shapes: the long rambling messages with code, URLs and paths of the recall benchmarks
    rng = random.Random(7)
    words = [
        "redis",
        "kafka_topic",
        "see",
        "https://example.com/issues/7541",
        "/srv/app/config.yaml",
        "0xdeadbeefcafe",
        "**bold**",
        "`code()`",
        "src/app/cache.py",
        "12.5",
        "v1.2.3",
        "```python\nimport os\n```",
        "#",
        "__init__",
    ]
    for _ in range(500):
        message = " ".join(rng.choice(words) for _ in range(rng.randint(1, 140)))
        assert clean_query(message, max_chars=10_000).text == reference_text(message)


def test_the_benchmark_times_both_forms_and_refuses_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = ["see https://example.com/x and **bold** 0xdeadbeefcafe in src/app/x.py", "a short one, v1.2"]
    figures = time_both(messages, 2)
    assert figures["messages"] == 2 and figures["rounds"] == 2 and 0 <= figures["fast_faster_rounds"] <= 2
    assert figures["fast_us"] > 0 and figures["reference_us"] > 0
    monkeypatch.setattr(cleanup_ab, "_fast_text", lambda message: message)
    with pytest.raises(RuntimeError, match="differs"):
        time_both(messages, 1)
