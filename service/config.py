"""One typed settings object for the whole service (API, workers, evals, benchmarks).

Read from the environment with the ``TENURE_`` prefix (and an optional ``.env``). Build it once with
:func:`get_settings`; tests construct their own :class:`Settings` instead of patching globals.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class RecallDefaults(BaseSettings):
    """Budget and thresholds of the context builder (paper §5.2 defaults)."""

    model_config = SettingsConfigDict(env_prefix="TENURE_RECALL_", extra="ignore")

    max_beliefs: int = Field(20, ge=0, le=200)
    max_pinned_facts: int = Field(10, ge=0, le=100)
    max_questions: int = Field(15, ge=0, le=100)
    max_chars_per_belief: int = Field(400, ge=40, le=10_000)
    max_persona_chars: int = Field(800, ge=0, le=10_000)
    # A single whole-alias hit (boost 5) clears it, partial/weak evidence does not (paper: minScore 3).
    min_score: float = Field(3.0, ge=0.0)
    max_query_chars: int = Field(1000, ge=16, le=20_000)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TENURE_", env_file=".env", extra="ignore", env_nested_delimiter="__"
    )

    environment: str = "development"

    opensearch_url: str = "http://127.0.0.1:9200"
    opensearch_username: str | None = None
    opensearch_password: SecretStr | None = None
    opensearch_timeout_s: float = 10.0
    # Prefix of every index, alias and index template this deployment owns; tests and evals use
    # their own namespace so they never touch a real deployment's data.
    opensearch_namespace: str = "tenure"

    redis_url: str = "redis://127.0.0.1:6379/0"
    celery_broker_url: str | None = None

    recall: RecallDefaults = Field(default_factory=RecallDefaults)

    @property
    def broker_url(self) -> str:
        return self.celery_broker_url or self.redis_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
