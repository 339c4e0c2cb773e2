from __future__ import annotations

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
