"""Fixtures of the tier tests: the tier factories the contract suite runs over, and real servers
for the remote tiers (one redis-server per session, moto's S3, a 3-node Redis Cluster; tests
isolate themselves by key prefix or bucket).

To run the tier contract (``tests/kv/tiers/tier_contract.py``) over another tier, add one
``pytest.param(factory, id=..., marks=...)`` line to ``TIER_FACTORIES``. A factory takes the
pytest request (for fixtures such as a redis server: ``request.getfixturevalue(...)``) and an
empty temporary directory, and returns a fresh, empty tier of at least 16 MiB.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstack.kv.tiers import Tier
from kvstack.kv.tiers.cpu.tier import CPUTier
from kvstack.kv.tiers.file.tier import FileTier
from tests.kv.tiers.remote.servers import MotoS3, RedisCluster, RedisServer

TierFactory = Callable[[pytest.FixtureRequest, Path], Tier]

TIER_FACTORIES = [
    pytest.param(lambda request, root: CPUTier(16 << 20, name="cpu"), id="cpu"),
    pytest.param(lambda request, root: CPUTier(16 << 20, "s3fifo", name="cpu"), id="cpu-s3fifo"),
    pytest.param(lambda request, root: FileTier(root, 16 << 20, name="file"), id="file"),
    pytest.param(
        lambda request, root: FileTier(root, 16 << 20, compression="zstd", name="file"),
        id="file-zstd",
    ),
    pytest.param(
        lambda request, root: FileTier(root, 16 << 20, compression="lz4", fsync=True, name="file"),
        id="file-lz4-fsync",
    ),
]


@pytest.fixture(params=TIER_FACTORIES)
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    """A fresh, empty tier of every registered kind; closed after the test."""
    factory: TierFactory = request.param
    made = factory(request, tmp_path / "tier")
    try:
        yield made
    finally:
        made.close()


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
