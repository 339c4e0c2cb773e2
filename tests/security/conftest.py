"""Fixtures of the abuse suite: the API fixtures of ``tests/api`` (the real app on a real
OpenSearch node and Redis server, teams provisioned over HTTP), plus the API served by a real
uvicorn process for what only the HTTP server itself sees (malformed header bytes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opensearchpy import OpenSearch

from deploy.localstack import LocalStack, StackConfig
from service.domain.belief import Belief
from service.storage.client import routed_id
from service.storage.templates import BELIEFS
from tests.api.conftest import (  # noqa: F401 - fixtures shared with the API suite
    api_settings,
    app,
    client,
    operator,
    operator_key,
    other_team,
    services,
    signing_keys,
    team,
)


def api_only_stack(root: Path, opensearch_url: str, redis_url: str, env: dict[str, str] | None = None) -> LocalStack:
    """The app under uvicorn (one worker), without the scripted LLM, a worker or beat; ``env``:
    extra ``TENURE_*`` settings for it."""
    config = StackConfig(
        root=root,
        opensearch_url=opensearch_url,
        redis_url=redis_url,
        api_workers=1,
        with_llm=False,
        with_worker=False,
        with_beat=False,
        env=env or {},
    )
    return LocalStack(config)


@pytest.fixture(scope="module")
def served_api(tmp_path_factory: pytest.TempPathFactory, opensearch_url: str, redis_url: str) -> Iterator[LocalStack]:
    """The app under uvicorn (one worker), on the session's OpenSearch and Redis."""
    with api_only_stack(Path(tmp_path_factory.mktemp("served-api")), opensearch_url, redis_url) as stack:
        yield stack


def store_as_is(os_client: OpenSearch, namespace: str, belief: Belief, **damage: Any) -> None:
    """Write a belief document straight into the namespace's belief index, with ``damage`` laid over
    its fields: what an older version, a hand edit or a restore could have left (the API no longer
    writes such documents)."""
    os_client.index(
        index=BELIEFS.alias(namespace),
        id=routed_id(belief.tenant_id, belief.id),
        routing=belief.tenant_id,
        body={**belief.to_document(), **damage},
        refresh=True,
    )
