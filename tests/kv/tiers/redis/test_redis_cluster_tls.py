"""rediss:// against a TLS-only redis-server, and a real 3-master Redis Cluster on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstack.kv.keys import Namespace, chunk_keys
from kvstack.kv.tiers import make_tier
from kvstack.kv.tiers.redis.tier import RedisTier
from kvstack.stack.ports import free_port
from tests.kv.tiers.remote.servers import RedisCluster, RedisServer
from tests.kv.tiers.remote.tls import make_tls_files

pytestmark = pytest.mark.redis


def test_rediss_with_a_private_ca(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    port = free_port()
    server = RedisServer(
        tmp_path, 0, "--tls-port", str(port), "--tls-cert-file", str(files.cert),
        "--tls-key-file", str(files.key), "--tls-ca-cert-file", str(files.ca),
        "--tls-auth-clients", "no",
    )  # fmt: skip
    server.start(ready_port=0)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={files.ca}&connect_timeout_s=5"
    key = chunk_keys([1, 2], Namespace("tls"), 2)[0]
    value = torch.arange(64, dtype=torch.float16).view(2, 2, 2, 2, 4)
    try:
        tier = make_tier(url)
        _wait_until(lambda: tier.put(key, value) and tier.flush(5) and tier.contains(key))
        out = torch.empty_like(value)
        assert tier.get_into(key, out) and torch.equal(out, value)
        tier.close()
        untrusted = make_tier(f"rediss://127.0.0.1:{port}/0")  # system CAs only: refused
        assert untrusted.get(key) is None and untrusted.stats().errors == 1
        untrusted.close()
    finally:
        server.stop()


def _wait_until(check: object, attempts: int = 100) -> None:
    import time

    assert callable(check)
    for _ in range(attempts):  # the TLS port may accept a little after the process starts
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met")


def test_cluster_spreads_chunks_over_masters_and_reads_them_back(
    redis_cluster: RedisCluster,
) -> None:
    tier = make_tier(redis_cluster.url + "&prefix=spread:")
    assert isinstance(tier, RedisTier)
    keys = chunk_keys(list(range(48)), Namespace("cluster"), 1)
    chunks = [torch.full((2, 2, 4, 2, 8), float(i), dtype=torch.float16) for i in range(48)]
    try:
        assert all(tier.put_many(keys, chunks))
        assert tier.flush(10)
        assert tier.stats().errors == 0, tier.stats()  # no write refused by a converging node
        nodes = redis_cluster.nodes
        per_node = [len(n.cli("--scan", "--pattern", "spread:*").split()) for n in nodes]
        assert sum(per_node) == 48 and min(per_node) > 0, per_node
        outs = [torch.empty_like(c) for c in chunks]
        assert tier.get_many_into(keys, outs) == [True] * 48
        assert all(torch.equal(o, c) for o, c in zip(outs, chunks, strict=True))
        assert tier.contains_many(keys) == [True] * 48
        assert sorted(tier.keys()) == sorted(keys)
    finally:
        tier.close()
