"""An index server on a thread of the test process, on a free loopback port; Valkey indexes on
the tier tests' real redis-server and 3-master Redis Cluster (each test its own key prefix)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kvstack.index.config import IndexServiceConfig
from kvstack.index.runner import IndexServerThread
from kvstack.stack.ports import free_port
from tests.kv.tiers.conftest import redis_cluster, redis_server
from tests.kv.tiers.remote.servers import RedisCluster, RedisServer

__all__ = ["index_server", "redis_cluster", "redis_server", "valkey_url"]


@pytest.fixture
def index_server() -> Iterator[IndexServerThread]:
    server = IndexServerThread(IndexServiceConfig(port=free_port(), instance_ttl_s=30)).start()
    yield server
    server.stop()


def valkey_index_url(server: RedisServer | RedisCluster, **params: object) -> str:
    """An index URL on ``server`` with a key prefix of its own (and ``params``)."""
    base = server.url.partition("?")[0]
    query = [f"prefix=t{uuid.uuid4().hex[:8]}:"]
    if isinstance(server, RedisCluster):
        query.append("cluster=true")
    query += [f"{name}={value}" for name, value in params.items()]
    return f"{base}?{'&'.join(query)}"


@pytest.fixture(params=["standalone", "cluster"])
def valkey_url(request: pytest.FixtureRequest) -> str:
    """A fresh index URL on the session's redis-server, then on its Redis Cluster."""
    fixture = "redis_server" if request.param == "standalone" else "redis_cluster"
    return valkey_index_url(request.getfixturevalue(fixture))
