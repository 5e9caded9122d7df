"""Router replicas share their soft state over a real redis-server: a dispatch by one replica
counts as in flight, and its prompt as routed, on the other's view of that engine until it
finishes; a replica that vanishes has its requests dropped after the timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kvstack.index.radix import Owner, RadixNamespace
from kvstack.router.fleet.backends import Backend, BackendPool
from kvstack.router.prefix.replicas import ReplicaSync
from kvstack.router.prefix.state import PrefixState
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.router.scheduling.tokenizers import PromptTokens
from tests.kv.tiers.conftest import redis_server
from tests.kv.tiers.remote.servers import RedisServer
from tests.router.conftest import until

__all__ = ["redis_server"]
pytestmark = pytest.mark.redis
TOKENS = list(range(64))
NS = RadixNamespace("m")


class Replica:
    def __init__(self, config: PrefixConfig) -> None:
        self.pool = BackendPool()
        self.pool.apply([Backend("e1", "http://e1:8000"), Backend("e2", "http://e2:8000")])
        self.prefix = PrefixState(config, self.pool)
        self.sync = ReplicaSync(config, self.prefix, self.pool)

    def routed(self, backend: str) -> int:
        return self.prefix.index.match(NS, TOKENS).tokens(Owner(backend, "routed"))

    def in_flight(self, backend: str) -> int:
        state = self.pool.get(backend)
        assert state is not None
        return state.load.in_flight


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[Replica, Replica]]:
    config = PrefixConfig(share_url=redis_server.url, share_channel="t-replicas",
                          share_timeout_s=0.5)  # fmt: skip
    pair = (Replica(config), Replica(config))
    for replica in pair:
        await replica.sync.start()
    await asyncio.sleep(0.2)  # both subscribed
    yield pair
    for replica in pair:
        await replica.sync.close()


def request() -> RoutingRequest:
    r = RoutingRequest(request_id="r1", endpoint="completions", model="m", target="m")
    r.state.prompt = PromptTokens(TOKENS, NS, exact=True)
    return r


async def test_a_dispatch_elsewhere_counts_here_until_it_finishes(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    sent = request()
    e1 = a.pool.get("e1")
    assert e1 is not None
    a.sync.on_dispatch(sent, e1)
    await until(lambda: b.in_flight("e1") == 1 and b.routed("e1") == 64)
    assert b.in_flight("e2") == 0 and a.in_flight("e1") == 0  # its own load the proxy counts
    a.sync.on_first_token(sent, e1, 0.1)
    a.sync.on_finish(sent, e1, "ok")
    await until(lambda: b.in_flight("e1") == 0)
    assert b.routed("e1") == 64  # the belief stays (unlocked), as after its own dispatches


async def test_requests_of_a_vanished_replica_are_dropped(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    e2 = a.pool.get("e2")
    assert e2 is not None
    a.sync.on_dispatch(request(), e2)
    await until(lambda: b.in_flight("e2") == 1)
    await a.sync.close()  # gone without finishing
    await until(lambda: b.in_flight("e2") == 0, timeout_s=10)
