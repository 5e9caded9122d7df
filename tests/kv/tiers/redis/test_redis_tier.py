"""The redis:// tier against a real redis-server: batched reads into caller buffers, background
writes, TTL, prefixes, verification of every value, compression, auth and database selection."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstack.errors import ConfigError
from kvstack.kv import KVCache
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys
from kvstack.kv.tiers import TierEvent, make_tier
from kvstack.kv.tiers.redis import redis_io
from kvstack.kv.tiers.redis.tier import RedisTier
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = pytest.mark.redis


def keys(n: int, salt: str = "") -> list[ChunkKey]:
    return chunk_keys(list(range(n)), Namespace("m", salt=salt), 1)


def chunk(seed: int, shape: tuple[int, ...] = (2, 2, 4, 2, 8)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def redis_tier(url: str) -> RedisTier:
    tier = make_tier(url, name="redis")
    assert isinstance(tier, RedisTier)
    return tier


def test_put_is_queued_then_written_and_read_back_in_batches(redis_url: str) -> None:
    tier = redis_tier(redis_url)
    events: list[TierEvent] = []
    tier.add_listener(events.append)
    ks, chunks = keys(6), [chunk(i) for i in range(6)]
    try:
        assert tier.put_many(ks[:4], chunks[:4]) == [True] * 4
        assert tier.contains_many(ks) == [True] * 4 + [False] * 2  # queued counts as held
        assert tier.flush(10)
        assert sorted(e.key for e in events if e.kind == "stored") == sorted(ks[:4])
        outs = [torch.empty_like(c) for c in chunks]
        assert tier.get_many_into(ks, outs) == [True] * 4 + [False] * 2
        for out, want in zip(outs[:4], chunks[:4], strict=True):
            assert torch.equal(out, want)
        got = tier.get(ks[2])
        assert got is not None and torch.equal(got, chunks[2])
        assert tier.get(ks[5]) is None
        stats = tier.stats()
        assert stats.hits == 5 and stats.misses == 3 and stats.bytes_written > 0
    finally:
        tier.close()


def test_a_chunk_removed_while_its_write_is_in_flight_stays_removed(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, gate = threading.Event(), threading.Event()
    real = redis_io.write_batch

    def blocked(*args: Any, **kw: Any) -> list[bool]:
        entered.set()
        gate.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(redis_io, "write_batch", blocked)
    tier = redis_tier(redis_url)
    events: list[TierEvent] = []
    tier.add_listener(events.append)
    (k,) = keys(1)
    try:
        assert tier.put(k, chunk(0)) and entered.wait(10)
        assert tier.remove(k)
        assert not tier.contains(k) and tier.get(k) is None  # gone at once
        gate.set()
        assert tier.flush(10)
        assert not tier.contains(k) and tier.get(k) is None  # the landed write was undone
        assert [e.kind for e in events] == ["removed"]
    finally:
        tier.close()


def test_strided_and_mismatched_outputs(redis_url: str) -> None:
    tier = redis_tier(redis_url)
    k, c = keys(1)[0], chunk(7)
    try:
        tier.put(k, c)
        tier.flush(10)
        big = torch.zeros(2, 2, 8, 2, 8, dtype=torch.float16)
        strided = big[:, :, 2:6]  # a non-contiguous view of the right shape
        assert tier.get_into(k, strided)
        assert torch.equal(big[:, :, 2:6], c) and not big[:, :, :2].any()
        assert not tier.get_into(k, torch.empty(2, 2, 4, 2, 8, dtype=torch.float32))
        assert not tier.get_into(k, torch.empty(2, 2, 4, 2, 4, dtype=torch.float16))
        assert tier.get_into(k, torch.empty_like(c))  # the connection is still in sync
    finally:
        tier.close()


@pytest.mark.parametrize("damage", ["garbage", "flipped payload byte", "truncated"])
def test_corrupt_values_are_misses_and_deleted(
    redis_server: RedisServer, redis_url: str, damage: str
) -> None:
    tier = redis_tier(redis_url)
    events: list[TierEvent] = []
    tier.add_listener(events.append)
    k, c = keys(1)[0], chunk(3)
    name = f"{tier.options.prefix}{k.hex()}"
    try:
        tier.put(k, c)
        tier.flush(10)
        if damage == "garbage":
            redis_server.cli("SET", name, "not a chunk")
        elif damage == "flipped payload byte":
            redis_server.cli("SETRANGE", name, "200", "\x7f")
        else:
            truncate = (
                "return redis.call('SET', KEYS[1], string.sub(redis.call('GET', KEYS[1]), 1, 150))"
            )
            redis_server.cli("EVAL", truncate, "1", name)
        out = torch.empty_like(c)
        assert not tier.get_into(k, out)
        assert tier.get(k) is None
        assert redis_server.cli("EXISTS", name).strip() == "0"
        assert tier.stats().corrupt == 1
        assert events[-1] == TierEvent("removed", "redis", k, reason="corrupt")
    finally:
        tier.close()


def test_ttl_prefix_isolation_keys_and_remove(redis_server: RedisServer) -> None:
    a = redis_tier(f"{redis_server.url}?prefix=ttl-a:&ttl_s=60")
    b = redis_tier(f"{redis_server.url}?prefix=ttl-b:")
    ks = keys(3, salt="ttl")
    try:
        a.put_many(ks, [chunk(i) for i in range(3)])
        a.flush(10)
        ttl_ms = int(redis_server.cli("PTTL", f"ttl-a:{ks[0].hex()}"))
        assert 0 < ttl_ms <= 60_000
        assert b.contains_many(ks) == [False] * 3
        assert sorted(a.keys()) == sorted(ks) and list(b.keys()) == []
        assert a.remove(ks[0]) and not a.remove(ks[0])
        assert a.contains_many(ks) == [False, True, True]
    finally:
        a.close()
        b.close()


def test_compression_roundtrip(redis_url: str) -> None:
    tier = redis_tier(redis_url + "&compression=zstd")
    k, c = keys(1)[0], torch.zeros(4, 2, 16, 2, 8, dtype=torch.float16)  # compressible
    try:
        tier.put(k, c)
        tier.flush(10)
        assert tier.stats().bytes_written < c.numel() * 2 / 4
        out = torch.full_like(c, 1.0)
        assert tier.get_into(k, out) and torch.equal(out, c)
    finally:
        tier.close()


def test_password_and_database(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, None, "--requirepass", "s3cret").start()
    try:
        good = redis_tier(f"redis://:s3cret@127.0.0.1:{server.port}/3?breaker_failures=1")
        k, c = keys(1)[0], chunk(1)
        good.put(k, c)
        good.flush(10)
        assert server.cli("-n", "3", "EXISTS", f"kvstack:{k.hex()}").strip() == "1"
        assert good.get(k) is not None
        wrong = redis_tier(f"redis://:nope@127.0.0.1:{server.port}/3?breaker_failures=1")
        assert wrong.get(k) is None and wrong.contains(k) is False  # auth failure is a miss
        assert wrong.stats().errors >= 1
        good.close()
        wrong.close()
    finally:
        server.stop()


def test_kvcache_instances_share_the_redis_tier(redis_url: str) -> None:
    config = {"model": "m@1", "chunk_size": 4, "tiers": ["cpu://?size=1MiB", redis_url]}
    tokens = list(range(12))
    kv = torch.randn(2, 2, 12, 2, 8).to(torch.float16)
    with KVCache.from_config(config) as first:
        assert first.store(tokens, kv) == 12
        assert first.flush(10)
    with KVCache.from_config(config) as second:  # another engine: empty CPU tier
        assert second.lookup(tokens) == 12
        got, n = second.retrieve(tokens)
        assert n == 12 and got is not None and torch.equal(got, kv)
        assert second.stats().by_tier["redis"].hits == 3


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://127.0.0.1:99999/0", "bad port"),
        ("redis://127.0.0.1:6379/x", "must be a number"),
        ("redis://127.0.0.1:6379/0?colour=red", "unknown parameter"),
        ("redis://127.0.0.1:6379/2?cluster=true", "only database 0"),
        ("redis://127.0.0.1:6379/0?ttl_s=-1", "must be >= 0"),
        ("redis://127.0.0.1:6379/0?compression=zip", "compression"),
        ("redis://127.0.0.1:6379/0?password_env=KVSTACK_TEST_NO_SUCH_VAR", "not set"),
    ],
)
def test_bad_urls_name_the_problem(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        make_tier(url)


def test_put_never_waits_for_a_stalled_server(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    # A put that touched the network would wait out the 5 s socket timeout on a stopped server.
    tier = redis_tier(f"{server.url}?queue=2&timeout_s=5&breaker_failures=1&breaker_reset_s=60")
    ks = keys(4, salt="stall")
    chunks = [chunk(i, (64, 2, 16, 8, 64)) for i in range(4)]
    try:
        server.pause()
        start = time.perf_counter()
        accepted = [tier.put(k, c) for k, c in zip(ks, chunks, strict=True)]
        assert time.perf_counter() - start < 2.5  # queued, not sent
        assert accepted[:2] == [True, True] and accepted[3] is False  # bounded queue
        assert tier.stats().dropped_writes >= 1
    finally:
        server.resume()
        tier.close()
        server.stop()
