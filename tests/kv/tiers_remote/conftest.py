"""Fixtures: one real redis-server per session (tests isolate themselves by key prefix)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.kv.tiers_remote.servers import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL with a prefix of this test's own."""
    return f"{redis_server.url}?prefix=t{uuid.uuid4().hex[:8]}:"
