"""The peer:// tier: engine B loads what engine A computed, found through a static peer list or
the cluster index; a dead peer is a fast miss behind its breaker, never an error."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from kvstack.cluster.announcer import Announcer
from kvstack.cluster.config import AnnounceConfig, PeerServerConfig
from kvstack.cluster.peer_server import PeerServer
from kvstack.index.config import IndexServiceConfig
from kvstack.index.runner import IndexServerThread
from kvstack.kv import KVCache
from kvstack.kv.tiers.peer.client import PeerClient
from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess

TOKENS = list(range(32))


def config(tiers: list[str]) -> dict[str, object]:
    return {"model": "toy@1", "chunk_size": 8, "tiers": tiers}


@contextmanager
def lending_engine() -> Iterator[tuple[KVCache, PeerServer]]:
    cache = KVCache.from_config(config(["cpu://?size=1MiB"]))
    server = PeerServer.for_cache(cache, PeerServerConfig(host="127.0.0.1", port=0))
    server.start_background()
    try:
        yield cache, server
    finally:
        server.stop()
        cache.close()


def test_static_peer_list_and_a_dead_peer() -> None:
    kv = torch.randn(2, 2, 32, 2, 8).half()
    with lending_engine() as (cache_a, server):
        cache_a.store(TOKENS, kv)
        url = f"peer://127.0.0.1:{server.port}?breaker_failures=1&breaker_reset_s=60"
        with KVCache.from_config(config(["cpu://?size=1MiB", url])) as borrower:
            assert borrower.lookup(TOKENS) == 32
            got, n = borrower.retrieve(TOKENS)
            assert n == 32 and got is not None and torch.equal(got, kv)
            assert borrower.stats().by_tier["peer"].hits == 4
            assert borrower.lookup(TOKENS) == 32  # promoted into its own CPU tier now
            server.stop()
            other = list(range(100, 132))
            start = time.perf_counter()
            for _ in range(5):
                assert borrower.lookup(other) == 0  # refused connection: a miss
            assert time.perf_counter() - start < 5  # refused at once, no timeouts
            assert borrower.stats().by_tier["peer"].extra["peers_open"] == 1.0


def test_peers_found_through_the_index(tmp_path: Path) -> None:
    index = IndexServerThread(IndexServiceConfig(port=free_port())).start()
    kv = torch.randn(2, 2, 32, 2, 8).half()
    try:
        with lending_engine() as (cache_a, server):
            announce = AnnounceConfig(
                index_url=index.url, instance_id="a", interval_s=0.02,
                peer_address=f"127.0.0.1:{server.port}",
            )  # fmt: skip
            announcer = Announcer(cache_a, announce).start()
            cache_a.store(TOKENS, kv)
            assert announcer.flush()
            url = f"peer://?index={index.url}&self=b"
            with KVCache.from_config(config(["cpu://?size=1MiB", url])) as cache_b:
                assert cache_b.lookup(TOKENS) == 32
                got, n = cache_b.retrieve(TOKENS)
                assert n == 32 and got is not None and torch.equal(got, kv)
            with KVCache.from_config(config([f"peer://?index={index.url}&self=a"])) as same:
                assert same.lookup(TOKENS) == 0  # an engine never fetches from itself
            announcer.close()
    finally:
        index.stop()


def test_peer_server_command_lends_a_disk_tier(tmp_path: Path) -> None:
    kv = torch.randn(2, 2, 32, 2, 8).half()
    tier = f"file://{tmp_path}/kv?size=10MiB"
    with KVCache.from_config(config([tier])) as writer:
        writer.store(TOKENS, kv)
        keys = writer.chunk_keys(TOKENS)
    port = free_port()
    argv = [sys.executable, "-m", "kvstack", "peer-server", "--host", "127.0.0.1",
            "--port", str(port), "--tier", tier]  # fmt: skip
    env = {"KVSTACK_KV_MODEL": "toy@1"}
    import os

    with ManagedProcess("peer", argv, tmp_path / "peer.log", env={**os.environ, **env}):
        client = PeerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                held = client.lookup(keys)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "peer.log").read_text()
                time.sleep(0.1)
        assert held == [True] * 4
        results = client.get(keys, [None] * 4)
        assert results is not None and all(r.outcome == "hit" for r in results)
        assert torch.equal(torch.cat([r.chunk for r in results if r.chunk is not None], 2), kv)
        client.close()


@pytest.mark.parametrize(
    ("url", "problem"),
    [("peer://", "needs index"), ("peer://nohost", "host:port"), ("peer://h:1?x=1", "unknown")],
)
def test_bad_urls(url: str, problem: str) -> None:
    from kvstack.kv.tiers import make_tier

    with pytest.raises(ValueError, match=problem):
        make_tier(url)
