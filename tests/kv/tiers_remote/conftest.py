"""Fixtures: one real redis-server per session (tests isolate themselves by key prefix)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.kv.tiers_remote.servers import MotoS3, RedisCluster, RedisServer

MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL with a prefix of this test's own."""
    return f"{redis_server.url}?prefix=t{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="session")
def moto_env() -> Iterator[None]:
    """Fake credentials for moto; restored afterwards."""
    saved = {name: os.environ.get(name) for name in MOTO_ENV}
    os.environ.update(MOTO_ENV)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def moto_server(moto_env: None) -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()


@pytest.fixture
def s3_url(moto_server: MotoS3) -> str:
    """A fresh bucket (created by the tier) on the session's moto server."""
    bucket = f"kv-{uuid.uuid4().hex[:12]}"
    return f"s3://{bucket}/kv?endpoint_url={moto_server.endpoint}&create_bucket=true"


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Three masters on loopback (tests isolate themselves by key prefix)."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()
