"""attach_cluster end to end: engine A lends and announces, engine B finds A's chunks through
the index and loads them over the peer path; a shared Redis tier's chunks stored before an
engine started are announced by its first full sync."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from kvstack.cluster.attach import attach_cluster
from kvstack.cluster.config import AnnounceConfig, IndexConfig, PeerServerConfig
from kvstack.index.client import IndexClient, lookup_request
from kvstack.index.runner import IndexServerThread
from kvstack.kv import KVCache
from tests.kv.tiers.remote.servers import RedisServer

TOKENS = list(range(64))


def kv_config(tiers: list[str]) -> dict[str, object]:
    return {"model": "toy@1", "chunk_size": 16, "tiers": tiers}


def cluster_config(index_url: str) -> IndexConfig:
    return IndexConfig(
        announce=AnnounceConfig(index_url=index_url, served_model_names=["toy"], interval_s=0.02),
        peer=PeerServerConfig(enabled=True, host="127.0.0.1", port=0),
    )


def wait_for(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_engine_b_loads_engine_a_chunks_over_the_peer_path(
    index_server: IndexServerThread,
) -> None:
    kv = torch.randn(2, 2, 64, 2, 8).half()
    client = IndexClient(index_server.url)
    with KVCache.from_config(kv_config(["cpu://?size=1MiB"])) as cache_a:
        link = attach_cluster(cache_a, cluster_config(index_server.url), instance_id="a")
        try:
            assert link.server is not None and link.announcer is not None
            cache_a.store(TOKENS, kv)
            wait_for(lambda: "a" in client.lookup(lookup_request("toy", TOKENS)).instances)
            match = client.lookup(lookup_request("toy", TOKENS)).instances["a"]
            assert match.matched_tokens == 64
            assert match.peer == f"127.0.0.1:{link.server.port}"
            peer_url = f"peer://?index={index_server.url}&self=b"
            with KVCache.from_config(kv_config(["cpu://?size=1MiB", peer_url])) as cache_b:
                got, n = cache_b.retrieve(TOKENS)
                assert n == 64 and got is not None and torch.equal(got, kv)
                assert cache_b.stats().by_tier["peer"].hits == 4
        finally:
            link.close()
    client.close()


def test_shared_tier_chunks_from_before_the_start_are_announced(
    index_server: IndexServerThread, tmp_path: Path
) -> None:
    redis = RedisServer(tmp_path).start()
    url = f"{redis.url}?prefix=seed:"
    client = IndexClient(index_server.url)
    try:
        with KVCache.from_config(kv_config(["cpu://?size=1MiB", url])) as earlier:
            earlier.store(TOKENS, torch.randn(2, 2, 64, 2, 8).half())
            assert earlier.flush(10)
        config = cluster_config(index_server.url).model_copy(
            update={"peer": PeerServerConfig(enabled=False)}
        )
        with KVCache.from_config(kv_config(["cpu://?size=1MiB", url])) as cache:
            link = attach_cluster(cache, config, instance_id="late")
            try:
                wait_for(lambda: bool(client.lookup(lookup_request("toy", TOKENS)).shared))
                reply = client.lookup(lookup_request("toy", TOKENS))
                assert reply.instances["late"].matched_tokens == 64  # through redis
                assert reply.instances["late"].tiers == {"cpu": 0, "redis": 64}
                assert list(reply.shared.values()) == [64]
            finally:
                link.close()
    finally:
        client.close()
        redis.stop()
