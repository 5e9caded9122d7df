"""The s3:// tier against moto's S3 server: parallel batched reads, ranged reads and multipart
writes for large chunks, verification, listing, and a server that dies and comes back."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch

from kvstack.errors import ConfigError
from kvstack.kv import KVCache
from kvstack.kv.format import HEADER_BYTES
from kvstack.kv.keys import ChunkKey, Namespace, chunk_keys
from kvstack.kv.tiers import TierEvent, make_tier
from kvstack.kv.tiers.s3.tier import S3Tier
from tests.kv.tiers.remote.servers import MotoS3

pytestmark = pytest.mark.s3


def keys(n: int, salt: str = "") -> list[ChunkKey]:
    return chunk_keys(list(range(n)), Namespace("m", salt=salt), 1)


def chunk(seed: int, shape: tuple[int, ...] = (2, 2, 4, 2, 8)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def s3_tier(url: str) -> S3Tier:
    tier = make_tier(url, name="s3")
    assert isinstance(tier, S3Tier)
    return tier


def test_roundtrip_batched(s3_url: str) -> None:
    tier = s3_tier(s3_url)
    events: list[TierEvent] = []
    tier.add_listener(events.append)
    ks, chunks = keys(6), [chunk(i) for i in range(6)]
    try:
        assert tier.put_many(ks[:4], chunks[:4]) == [True] * 4
        assert tier.flush(20)
        assert sorted(e.key for e in events if e.kind == "stored") == sorted(ks[:4])
        fresh = s3_tier(s3_url)  # no local knowledge: HEADs
        assert fresh.contains_many(ks) == [True] * 4 + [False] * 2
        outs = [torch.empty_like(c) for c in chunks]
        assert fresh.get_many_into(ks, outs) == [True] * 4 + [False] * 2
        assert all(torch.equal(o, c) for o, c in zip(outs[:4], chunks[:4], strict=True))
        got = fresh.get(ks[1])
        assert got is not None and torch.equal(got, chunks[1])
        assert sorted(fresh.keys()) == sorted(ks[:4])
        assert fresh.remove(ks[0]) and not fresh.contains(ks[0])
        fresh.close()
    finally:
        tier.close()


def test_large_chunk_multipart_and_ranged_reads(s3_url: str, moto_server: MotoS3) -> None:
    url = s3_url + "&part_size=5MiB&multipart_threshold=6MiB"
    tier = s3_tier(url)
    big = chunk(5, (4, 2, 512, 8, 160))  # 10 MiB: two full parts and a remainder
    k = keys(1, salt="big")[0]
    try:
        tier.put(k, big)
        assert tier.flush(60)
        client: Any = moto_server.client()
        bucket = tier.options.bucket
        obj = client.head_object(Bucket=bucket, Key=f"kv/{k.hex()}")
        assert obj["ContentLength"] == big.numel() * 2 + HEADER_BYTES
        assert "-" in obj["ETag"]  # a multipart upload's ETag
        reader = s3_tier(url)
        out = torch.empty_like(big)
        assert reader.get_into(k, out) and torch.equal(out, big)
        reader.close()
    finally:
        tier.close()


def test_corrupt_object_is_a_miss_and_deleted(s3_url: str, moto_server: MotoS3) -> None:
    tier = s3_tier(s3_url)
    k, c = keys(1, salt="bad")[0], chunk(9)
    try:
        tier.put(k, c)
        tier.flush(20)
        client: Any = moto_server.client()
        name = f"kv/{k.hex()}"
        body = bytearray(client.get_object(Bucket=tier.options.bucket, Key=name)["Body"].read())
        body[-1] ^= 0xFF
        client.put_object(Bucket=tier.options.bucket, Key=name, Body=bytes(body))
        reader = s3_tier(s3_url)
        assert not reader.get_into(k, torch.empty_like(c))
        assert reader.stats().corrupt == 1
        assert not reader.contains(k)
        reader.close()
    finally:
        tier.close()


def test_kvcache_over_s3(s3_url: str) -> None:
    config = {"model": "m@1", "chunk_size": 4, "tiers": ["cpu://?size=1MiB", s3_url]}
    tokens, kv = list(range(8)), torch.randn(2, 2, 8, 2, 8).to(torch.float16)
    with KVCache.from_config(config) as first:
        assert first.store(tokens, kv) == 8 and first.flush(20)
    with KVCache.from_config(config) as second:
        got, n = second.retrieve(tokens)
        assert n == 8 and got is not None and torch.equal(got, kv)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("s3:///kv", "names no bucket"),
        ("s3://b/kv?part_size=1MiB", "5MiB"),
        ("s3://b/kv?addressing_style=sideways", "addressing_style"),
        ("s3://b/kv?threads=0", "must be >= 1"),
        ("s3://b/kv?shiny=1", "unknown parameter"),
    ],
)
def test_bad_urls_name_the_problem(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        make_tier(url)


def test_s3_down_then_back(moto_env: None, caplog: pytest.LogCaptureFixture) -> None:
    server = MotoS3().start()
    url = (
        f"s3://kv-outage/kv?endpoint_url={server.endpoint}&create_bucket=true"
        "&timeout_s=1&connect_timeout_s=0.2&breaker_failures=1&breaker_reset_s=0.3"
    )
    config = {"model": "m@1", "chunk_size": 4, "tiers": ["cpu://?size=1MiB", url]}
    tokens, kv = list(range(8)), torch.randn(2, 2, 8, 2, 8).to(torch.float16)
    try:
        with KVCache.from_config(config) as first:
            assert first.store(tokens, kv) == 8 and first.flush(20)
        server.stop()
        with caplog.at_level(logging.WARNING), KVCache.from_config(config) as second:
            for _ in range(10):
                assert second.lookup(tokens) == 0  # S3 is gone: misses, no errors
            assert second.store(tokens, kv) == 8  # the CPU tier takes it
            assert second.lookup(tokens) == 8
            assert second.stats().by_tier["s3"].extra["breaker_open"] == 1.0
            assert sum("circuit breaker open" in r.getMessage() for r in caplog.records) == 1
            server = MotoS3(server.port).start()  # back, empty
            time.sleep(0.35)
            deadline = time.monotonic() + 20
            while not _stored_in_s3(config, tokens):
                assert time.monotonic() < deadline, "s3 tier did not recover"
                second.store(tokens, kv)
                second.flush(5)
                time.sleep(0.1)
    finally:
        server.stop()


def _stored_in_s3(config: dict[str, Any], tokens: list[int]) -> bool:
    with KVCache.from_config(config) as fresh:
        return fresh.lookup(tokens) == 8
