"""A first narrative over the public API: store, look up, retrieve, restart."""

from __future__ import annotations

from pathlib import Path

import torch

from kvstack.kv import KVCache


def test_store_lookup_retrieve_and_restart(tmp_path: Path) -> None:
    config = {
        "model": "tiny@1",
        "chunk_size": 4,
        "tiers": ["cpu://?size=1MiB", f"file://{tmp_path}?size=10MiB"],
    }
    tokens = list(range(10))
    kv = torch.randn(2, 2, 10, 2, 4)
    with KVCache.from_config(config) as cache:
        assert cache.store(tokens, kv) == 8
        cache.flush()
        assert cache.lookup(tokens) == 8
        got, n = cache.retrieve(tokens)
        assert n == 8 and got is not None and torch.equal(got, kv[:, :, :8])
        cache.check_integrity()
    with KVCache.from_config(config) as cache:  # a new process sees the same disk tier
        got, n = cache.retrieve(tokens)
        assert n == 8 and got is not None and torch.equal(got, kv[:, :, :8])
        cache.check_integrity()
