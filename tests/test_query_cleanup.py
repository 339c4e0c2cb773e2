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
