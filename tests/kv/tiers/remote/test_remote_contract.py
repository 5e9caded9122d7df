"""The tier contract (tests/kv/tiers/tier_contract.py) over the remote tiers, on real servers.

Remote stores do not know how many entries or bytes they hold for this tier, so the stats test
checks the counters they do keep."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from kvstack.kv.tiers import Tier, make_tier
from tests.kv.tiers.remote.servers import MotoS3, RedisCluster, RedisServer
from tests.kv.tiers.tier_contract import TierContract, chunk, key, stored


@pytest.fixture(params=["redis", "redis-zstd", "redis-cluster", "s3"])
def tier(request: pytest.FixtureRequest) -> Iterator[Tier]:
    prefix = f"contract-{uuid.uuid4().hex[:8]}"
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        made = make_tier(f"{cluster.url}&prefix={prefix}:", name="redis")
    elif request.param.startswith("redis"):
        server: RedisServer = request.getfixturevalue("redis_server")
        codec = "&compression=zstd" if request.param.endswith("zstd") else ""
        made = make_tier(f"{server.url}?prefix={prefix}:{codec}", name="redis")
    else:
        moto: MotoS3 = request.getfixturevalue("moto_server")
        made = make_tier(
            f"s3://{prefix}/kv?endpoint_url={moto.endpoint}&create_bucket=true", name="s3"
        )
    try:
        yield made
    finally:
        made.close()


class TestRemoteTierContract(TierContract):
    def test_stats_count_operations(self, tier: Tier) -> None:
        stored(tier, key(1), chunk(1))
        tier.get(key(1))
        tier.get(key(2))
        s = tier.stats()
        assert (s.name, s.hits, s.misses) == (tier.name, 1, 1)
        assert s.bytes_written >= chunk(1).numel() * 2 * 0.5 and s.bytes_read > 0
