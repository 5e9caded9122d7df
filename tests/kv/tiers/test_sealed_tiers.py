"""Chunk MACs through real tiers (a directory, a real redis-server, moto's S3 server): a chunk
written with another secret, altered with a recomputed XXH3, or written without a MAC is a miss
for a cache that has the secret (it never reaches the caller's buffer as a hit) and is counted
under ``kvstack_kv_chunks_rejected_total{reason="mac"}``; during a rotation the previous secret
still verifies. Without a secret the same altered chunk loads, which is what the MAC is for."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
import xxhash
from prometheus_client import REGISTRY

from kvstack.kv import KVCache, KVConfig
from kvstack.kv.format import HEADER_BYTES
from kvstack.kv.tensors import torch
from kvstack.security import ClusterKeys
from tests.kv.tiers.remote.servers import MotoS3, RedisServer

OLD, NEW = ClusterKeys(b"o" * 32), ClusterKeys(b"n" * 32)
TOKENS = list(range(64))
SHAPE = (2, 2, 64, 2, 8)


def kv() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(3)).half()


def cache(url: str, keys: ClusterKeys | None, name: str = "t") -> KVCache:
    config = KVConfig(model="sealed@1", chunk_size=16, tiers=[url])
    made = KVCache(config, keys=keys)
    assert made.tiers[0].name in ("file", "redis", "s3"), made.tiers
    return made


def rejected(tier: str, reason: str = "mac") -> float:
    value = REGISTRY.get_sample_value(
        "kvstack_kv_chunks_rejected_total", {"tier": tier, "reason": reason}
    )
    return value or 0.0


def loaded(c: KVCache) -> int:
    """Chunks of TOKENS loaded into caller buffers, as the connector loads them."""
    keys = c.chunk_keys(TOKENS)
    outs = [torch.full((2, 2, 16, 2, 8), 7.0, dtype=torch.float16) for _ in keys]
    return c.get_chunks_into(keys, outs)


def write(url: str, keys: ClusterKeys | None) -> None:
    with cache(url, keys) as c:
        assert c.store(TOKENS, kv()) == 64
        c.flush()


def check_mac_rules(url: str, tier: str, alter: object) -> None:
    """The scenario of this file, on one tier URL (an empty store)."""
    write(url, OLD)
    before = rejected(tier)
    with cache(url, NEW) as other:  # another cluster's secret
        assert loaded(other) == 0
    assert rejected(tier) > before
    write(url, OLD)  # (the other cluster dropped them)
    with cache(url, ClusterKeys(b"n" * 32, b"o" * 32)) as rotating:  # rotation: old verifies
        assert loaded(rotating) == 4
        got, n = rotating.retrieve(TOKENS)
        assert n == 64 and got is not None and torch.equal(got, kv())
    alter()  # change one chunk's KV and fix its XXH3 and header checksum
    with cache(url, None) as blind:  # without a secret the forgery passes the checksum...
        assert loaded(blind) == 4
    before = rejected(tier)
    with cache(url, OLD) as keyed:  # ...with it, the forged chunk is a miss
        assert loaded(keyed) < 4
    assert rejected(tier) == before + 1


def _forge(value: bytes) -> bytes:
    """One payload byte changed, the payload XXH3 and the header's XXH32 recomputed."""
    data = bytearray(value)
    data[HEADER_BYTES + 5] ^= 0x40
    struct.pack_into("<Q", data, 24, xxhash.xxh3_64_intdigest(bytes(data[HEADER_BYTES:])))
    struct.pack_into("<I", data, 104, xxhash.xxh32_intdigest(bytes(data[:104])))
    return bytes(data)


def test_file_tier(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/kv?size=16MiB"

    def alter() -> None:
        path = sorted((tmp_path / "kv").glob("*/*.kvc"))[0]
        path.write_bytes(_forge(path.read_bytes()))

    check_mac_rules(url, "file", alter)


def test_an_unsigned_chunk_is_a_miss_once_a_secret_is_set(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/kv?size=16MiB"
    write(url, None)  # written before the cluster had a secret
    before = rejected("file")
    with cache(url, OLD) as keyed:
        assert loaded(keyed) == 0
    assert rejected("file") > before


@pytest.mark.redis
def test_redis_tier(redis_server: RedisServer) -> None:
    prefix = f"s{uuid.uuid4().hex[:8]}:"
    url = f"{redis_server.url}?prefix={prefix}"

    def alter() -> None:
        import redis

        client = redis.Redis(port=redis_server.port)
        name = sorted(client.keys(f"{prefix}*"))[0]
        client.set(name, _forge(client.get(name)))
        client.close()

    check_mac_rules(url, "redis", alter)


@pytest.mark.s3
def test_s3_tier(s3_url: str, moto_server: MotoS3) -> None:
    bucket = s3_url.removeprefix("s3://").split("/")[0]

    def alter() -> None:
        client: Any = moto_server.client()
        name = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])[0]
        body = client.get_object(Bucket=bucket, Key=name)["Body"].read()
        client.put_object(Bucket=bucket, Key=name, Body=_forge(body))

    check_mac_rules(s3_url, "s3", alter)
