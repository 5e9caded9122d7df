"""A Redis that dies mid-run: the cache keeps serving (misses, recompute), the breaker opens
once, and the tier recovers when a server is back on the same address."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from kvstack.kv import KVCache
from tests.kv.tiers.remote.servers import RedisServer

pytestmark = pytest.mark.redis


def prompt(seed: int) -> tuple[list[int], torch.Tensor]:
    tokens = [seed * 1000 + i for i in range(16)]
    return tokens, torch.randn(2, 2, 16, 2, 8).to(torch.float16)


def cache(url: str) -> KVCache:
    tiers = ["cpu://?size=1MiB", url]
    return KVCache.from_config({"model": "m@1", "chunk_size": 4, "tiers": tiers})


def test_cache_survives_redis_death_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path).start()
    url = f"{server.url}?timeout_s=0.5&connect_timeout_s=0.2&breaker_failures=2&breaker_reset_s=0.3"
    a_tokens, a_kv = prompt(1)
    try:
        with cache(url) as first:
            assert first.store(a_tokens, a_kv) == 16 and first.flush(10)
        server.kill()
        with caplog.at_level(logging.WARNING), cache(url) as second:
            assert second.lookup(a_tokens) == 0  # redis is gone: a miss, not an error
            b_tokens, b_kv = prompt(2)
            assert second.store(b_tokens, b_kv) == 16  # the CPU tier still takes it
            for _ in range(20):
                assert second.lookup(b_tokens) == 16
                got, n = second.retrieve(b_tokens)
                assert n == 16 and got is not None and torch.equal(got, b_kv)
                assert second.lookup(a_tokens) == 0
            redis_stats = second.stats().by_tier["redis"]
            assert redis_stats.extra["breaker_open"] == 1.0
            assert redis_stats.extra["breaker_trips"] == 1.0
            opened = [r for r in caplog.records if "circuit breaker open" in r.getMessage()]
            assert len(opened) == 1  # logged once for the incident, not per call

            server.start()  # back, empty, on the same port
            time.sleep(0.35)  # the breaker's retry interval
            c_tokens, c_kv = prompt(3)
            deadline = time.monotonic() + 10
            while second.lookup(c_tokens) < 16 or not _in_redis(url, c_tokens):
                assert time.monotonic() < deadline, "redis tier did not recover"
                second.store(c_tokens, c_kv)
                second.flush(5)
                time.sleep(0.1)
            assert second.stats().by_tier["redis"].extra["breaker_open"] == 0.0
    finally:
        server.stop()


def _in_redis(url: str, tokens: list[int]) -> bool:
    with cache(url) as fresh:
        return fresh.lookup(tokens) == 16
