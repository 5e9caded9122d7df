"""kvstack tiers from the real index (the index server on loopback, or Valkey on a real
redis-server): an engine's local tiers credit that backend, a shared store credits every backend
at its lower weight, and a dead index costs the request only its credit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstack.index.backend import open_index
from kvstack.index.config import IndexServiceConfig
from kvstack.index.protocol import AnnounceBatch, KeyProfile, TierInfo
from kvstack.index.radix import RadixNamespace
from kvstack.index.runner import IndexServerThread
from kvstack.kv.keys import Namespace as KeyNamespace
from kvstack.kv.keys import chunk_keys
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.prefix.shared import SharedTierLookup, tier_kind
from kvstack.router.prefix.view import credited_tokens
from kvstack.router.scheduling.config import DEFAULT_TIER_WEIGHTS, PrefixConfig
from kvstack.router.scheduling.tokenizers import PromptTokens
from kvstack.stack.ports import free_port
from tests.index.conftest import valkey_index_url
from tests.kv.tiers.conftest import redis_server
from tests.kv.tiers.remote.servers import RedisServer

__all__ = ["redis_server"]

CHUNK = 16
TOKENS = list(range(100, 100 + 8 * CHUNK))  # 8 chunks
REDIS = "redis://cache:6379/0/kvstack:"


def announce(url: str) -> None:
    """Engine a holds 6 chunks in its CPU tier; the shared Redis store holds 3."""
    keys = chunk_keys(TOKENS, KeyNamespace("m"), CHUNK)
    profile = KeyProfile(model="m", chunk_size=CHUNK)
    tiers = [TierInfo("cpu"), TierInfo("redis", shared=True, location=REDIS)]
    client = open_index(url)
    client.report(
        AnnounceBatch("engine-a", profile, tiers=tiers, reset=True,
                      stored={"cpu": keys[:6], "redis": keys[:3]})
    )  # fmt: skip
    client.close()


@pytest.fixture(params=["http", "zmq", "valkey"])
def index_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "valkey":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = valkey_index_url(server)
        announce(url)
        yield url
        return
    service = IndexServerThread(IndexServiceConfig(port=free_port(), zmq_port=free_port()))
    service.start()
    try:
        announce(service.url)
        yield {"http": service.url, "zmq": service.zmq_url}[request.param]
    finally:
        service.stop()


def backend(name: str, instance: str | None = None) -> BackendState:
    labels = {"kvstack.io/index-instance": instance} if instance else {}
    return BackendState(Backend(name, f"http://{name}:1", labels=labels))


async def test_local_and_shared_tiers_per_backend(index_url: str) -> None:
    lookup = SharedTierLookup(PrefixConfig(index_url=index_url, index_timeout_s=5.0))
    await lookup.start()
    try:
        prompt = PromptTokens([*TOKENS, 1, 2, 3], RadixNamespace("m"), exact=True)
        hits = await lookup.lookup(prompt, [backend("a", "engine-a"), backend("b")])
    finally:
        await lookup.close()
    assert hits["a"] == {"cpu": 6 * CHUNK, "redis": 3 * CHUNK}
    assert hits["b"] == {"redis": 3 * CHUNK}  # readable by every engine running the connector
    weights = DEFAULT_TIER_WEIGHTS
    assert credited_tokens(hits["a"], weights) == pytest.approx(0.75 * 6 * CHUNK)
    assert credited_tokens(hits["b"], weights) == pytest.approx(0.5 * 3 * CHUNK)
    # Device tokens count fully, the rest of the CPU run at its weight.
    both = {"gpu": 2 * CHUNK, **hits["a"]}
    assert credited_tokens(both, weights) == pytest.approx(2 * CHUNK + 0.75 * 4 * CHUNK)


@pytest.mark.parametrize("scheme", ["http", "zmq", "redis"])
async def test_an_unreachable_index_costs_only_the_credit(scheme: str) -> None:
    dead = f"{scheme}://127.0.0.1:{free_port()}"
    lookup = SharedTierLookup(PrefixConfig(index_url=dead, index_timeout_s=0.5))
    await lookup.start()
    try:
        prompt = PromptTokens(TOKENS, RadixNamespace("m"), exact=True)
        assert await lookup.lookup(prompt, [backend("a")]) == {}
        approximate = PromptTokens(TOKENS, RadixNamespace("chars:m"), exact=False)
        assert await lookup.lookup(approximate, [backend("a")]) == {}
    finally:
        await lookup.close()


def test_tier_kinds_from_store_locations() -> None:
    assert tier_kind(REDIS) == "redis"
    assert tier_kind("rediss://x:1/0") == "redis"
    assert tier_kind("s3://bucket/prefix") == "s3"
    assert tier_kind("file:///mnt/shared/kv") == "disk"
