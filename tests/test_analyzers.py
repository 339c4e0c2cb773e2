"""Pin the analyzers' output through OpenSearch's own _analyze API on the live index."""

from __future__ import annotations

import pytest
from opensearchpy import OpenSearch

from service.config import Settings


def analyze(client: OpenSearch, index: str, analyzer: str, text: str) -> list[str]:
    result = client.indices.analyze(index=index, body={"analyzer": analyzer, "text": text})
    return [t["token"] for t in result["tokens"]]


@pytest.fixture(scope="module")
def index(os_client: OpenSearch, settings: Settings) -> str:
    return f"{settings.opensearch_namespace}-beliefs"


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("redis_cache", ["redis cache", "rediscache"]),
        ("RedisCache", ["redis cache", "rediscache"]),
        ("react.js", ["react js", "reactjs"]),
        ("ci-pipeline", ["ci pipeline", "cipipeline"]),
        ("TypeScript", ["type script", "typescript"]),
        ("k8s", ["k8s"]),
        ("Mara's", ["mara"]),
        ("Mara\u2019s", ["mara"]),
        ("Café", ["cafe"]),
        ("class hierarchies", ["class hierarchies"]),
        ("chapter 7", ["chapter 7"]),
        ("allkeys-lru", ["allkeys lru", "allkeyslru"]),
        ("@typescript-eslint", ["typescript eslint", "typescripteslint"]),
    ],
)
def test_whole_name_is_one_unit_per_word_form(os_client: OpenSearch, index: str, text: str, tokens: list[str]) -> None:
    assert sorted(analyze(os_client, index, "tenure_whole_name", text)) == sorted(tokens)


def test_query_words_split_into_word_forms(os_client: OpenSearch, index: str) -> None:
    assert analyze(os_client, index, "tenure_query_words", "What's my k8s deploy story? react.js ci-pipeline") == [
        "what",
        "my",
        "k8s",
        "deploy",
        "story",
        "react",
        "js",
        "ci",
        "pipeline",
    ]


def test_query_words_keep_camel_case_joined_so_it_meets_the_catenated_variant(
    os_client: OpenSearch, index: str
) -> None:
    assert analyze(os_client, index, "tenure_query_words", "RedisCache TypeScript") == ["rediscache", "typescript"]


def test_query_shingles_are_two_and_three_words_without_unigrams(os_client: OpenSearch, index: str) -> None:
    assert analyze(os_client, index, "tenure_query_shingles", "the class hierarchies here") == [
        "the class",
        "the class hierarchies",
        "class hierarchies",
        "class hierarchies here",
        "hierarchies here",
    ]


def test_phrase_side_drops_stopwords_before_shingling(os_client: OpenSearch, index: str) -> None:
    tokens = analyze(os_client, index, "tenure_query_phrase", "what is the error handling approach")
    assert "error handling" in tokens
    assert not any(t.startswith(("what ", "the ")) for t in tokens)


# ---------------------------------------------------------------- the .cjk sub-fields (v2)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("セッションストア", ["セッション ストア"]),
        ("決済プロバイダ", ["決済 プロバイダ"]),
        ("サーバー設定", ["サーバ 設定"]),  # prolonged sound mark folded
        ("ｻｰﾊﾞｰ設定", ["サーバ 設定"]),  # half-width katakana
        ("ＡＰＩゲートウェイ", ["api ゲート ウェイ"]),  # full-width Latin; ICU splits the katakana compound
        ("数据库选型", ["数据 库 选 型"]),
        ("größenlimit", ["grossenlimit"]),
        ("überwachung", ["uberwachung"]),
        ("configuración_regional", ["configuracion regional", "configuracionregional"]),
        ("redis_cache", ["redis cache", "rediscache"]),
        ("rate limit", ["rate limit"]),
    ],
)
def test_cjk_whole_name_is_one_unit_segmented_by_the_icu_tokenizer(
    os_client: OpenSearch, index: str, text: str, tokens: list[str]
) -> None:
    assert sorted(analyze(os_client, index, "tenure_cjk_whole_name", text)) == sorted(tokens)


def test_cjk_query_is_segmented_not_split_on_spaces(os_client: OpenSearch, index: str) -> None:
    assert analyze(os_client, index, "tenure_cjk_query_words", "セッションストアの設定を教えて") == [
        "セッション",
        "ストア",
        "の",
        "設定",
        "を",
        "教え",
        "て",
    ]
    shingles = analyze(os_client, index, "tenure_cjk_query_shingles", "セッションストアの設定を教えて")
    assert "セッション ストア" in shingles and "ストア の 設定" in shingles


def test_latin_words_in_cjk_text_are_separated_for_the_fuzzy_clause(os_client: OpenSearch, index: str) -> None:
    assert analyze(os_client, index, "tenure_cjk_query_latin", "Rate Limitの値とredis缓存") == [
        "rate",
        "limit",
        "redis",
    ]
    assert analyze(os_client, index, "tenure_cjk_query_words", "Rate Limitの値とredis缓存") == [
        "の",
        "値",
        "と",
        "缓",
        "存",
    ]
