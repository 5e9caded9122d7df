"""Engines on the Valkey index end to end (real redis-server): a KVCache's announcer writes its
chunks and evictions, a restarted engine resyncs, a Valkey that lost its data is refilled by
the engines' full syncs, upkeep cleans up after a forgotten engine, and engine B finds engine
A's chunks through Valkey and loads them over the peer path."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import torch

from kvstack.cluster.announcer import Announcer
from kvstack.cluster.attach import attach_cluster
from kvstack.cluster.config import AnnounceConfig, IndexConfig, PeerServerConfig
from kvstack.index.backend import open_index
from kvstack.index.client import lookup_request
from kvstack.index.valkey.client import ValkeyIndex
from kvstack.kv import KVCache
from tests.index.conftest import valkey_index_url
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = pytest.mark.redis
CHUNK = 4


def kv(num_tokens: int) -> torch.Tensor:
    return torch.randn(2, 2, num_tokens, 2, 8).to(torch.float16)


def wait_for(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@contextmanager
def engine(url: str, name: str, size: str = "1MiB") -> Iterator[tuple[KVCache, Announcer]]:
    cache = KVCache.from_config(
        {"model": "toy@1", "chunk_size": CHUNK, "tiers": [f"cpu://?size={size}"]}
    )
    config = AnnounceConfig(index_url=url, instance_id=name, served_model_names=["toy"],
                            interval_s=0.02, heartbeat_s=0.2)  # fmt: skip
    announcer = Announcer(cache, config).start()
    try:
        yield cache, announcer
    finally:
        announcer.close()
        cache.close()


def matched(url: str, tokens: list[int]) -> dict[str, int]:
    client = open_index(url)
    try:
        reply = client.lookup(lookup_request("toy", tokens))
    finally:
        client.close()
    return {name: m.matched_tokens for name, m in reply.instances.items()}


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return valkey_index_url(redis_server)


def test_an_engines_chunks_and_evictions_reach_valkey(url: str) -> None:
    prompt = list(range(40))
    with engine(url, "a", size="16KiB") as (cache, _):
        cache.store(prompt, kv(40))
        wait_for(lambda: matched(url, prompt).get("a") == cache.lookup(prompt) == 40)
        for n in range(8):  # more than the 16 KiB tier holds: the prompt's chunks are evicted
            cache.store([1000 * (n + 1) + t for t in range(40)], kv(40))
        wait_for(lambda: matched(url, prompt).get("a") == cache.lookup(prompt))
        assert cache.lookup(prompt) < 40


def test_a_restarted_engine_resyncs(url: str) -> None:
    first, second = list(range(16)), list(range(100, 116))
    with engine(url, "a") as (cache, _):
        cache.store(first, kv(16))
        wait_for(lambda: matched(url, first).get("a") == 16)
    with engine(url, "a") as (cache, announcer):  # the same id, a new process and cache
        cache.store(second, kv(16))
        wait_for(lambda: matched(url, second).get("a") == 16)
        assert matched(url, first).get("a") == 0  # what the old process held is gone
        assert announcer.full_syncs == 1


def test_a_valkey_that_lost_its_data_is_refilled(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    url = valkey_index_url(server)
    prompt = list(range(24))
    try:
        with engine(url, "a") as (cache, announcer):
            cache.store(prompt, kv(24))
            wait_for(lambda: matched(url, prompt).get("a") == 24)
            redis.Redis(port=server.port).flushall()  # a restart without persistence
            assert matched(url, prompt) == {}
            wait_for(lambda: matched(url, prompt).get("a") == 24)
            assert announcer.full_syncs == 2
    finally:
        server.stop()


def test_upkeep_cleans_up_after_a_forgotten_engine(redis_server: RedisServer) -> None:
    url = valkey_index_url(redis_server, instance_ttl_s=0.5, maintain_s=0.1)
    prefix = url.partition("prefix=")[2].partition("&")[0]
    raw = redis.Redis(port=redis_server.port)

    def entries() -> int:
        return sum(1 for _ in raw.scan_iter(match=f"{{{prefix}b*"))

    with engine(url, "a") as (cache, _):
        cache.store(list(range(32)), kv(32))
        wait_for(lambda: matched(url, list(range(32))).get("a") == 32)
    assert entries() == 8 + 1  # 8 chunk entries and the set of what a holds
    writer = ValkeyIndex(url)
    try:
        wait_for(lambda: not writer.maintain() and entries() == 0, timeout_s=10)
        assert matched(url, list(range(32))) == {}
    finally:
        writer.close()
    with engine(url, "b") as (cache, _):  # b may reuse a's freed bit: nothing of a's shows
        cache.store(list(range(8)), kv(8))
        wait_for(lambda: matched(url, list(range(8))).get("b") == 8)
        assert matched(url, list(range(32))) == {"b": 8}


def test_engine_b_loads_engine_a_chunks_through_valkey(url: str) -> None:
    tokens = list(range(64))
    data = torch.randn(2, 2, 64, 2, 8).half()
    config = IndexConfig(
        announce=AnnounceConfig(index_url=url, served_model_names=["toy"], interval_s=0.02),
        peer=PeerServerConfig(enabled=True, host="127.0.0.1", port=0),
    )
    with KVCache.from_config({"model": "toy@1", "chunk_size": 16,
                              "tiers": ["cpu://?size=1MiB"]}) as cache_a:  # fmt: skip
        link = attach_cluster(cache_a, config, instance_id="a")
        try:
            cache_a.store(tokens, data)
            wait_for(lambda: matched(url, tokens).get("a") == 64)
            peer = f"peer://?index={quote(url, safe='')}&self=b"
            with KVCache.from_config({"model": "toy@1", "chunk_size": 16,
                                      "tiers": ["cpu://?size=1MiB", peer]}) as cache_b:  # fmt: skip
                got, n = cache_b.retrieve(tokens)
                assert n == 64 and got is not None and torch.equal(got, data)
                assert cache_b.stats().by_tier["peer"].hits == 4
        finally:
            link.close()
