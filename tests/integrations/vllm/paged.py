"""A small real paged KV allocation (vLLM's layout: layer-outermost pages) and a KV cache."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from kvstack.integrations.vllm.layout import PagedKV, PagedLayout
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig

LAYERS, BLOCKS, PAGE, BLOCK_SIZE, CHUNK = 3, 16, 64, 4, 8
PER_CHUNK = CHUNK // BLOCK_SIZE
SHAPE = (LAYERS, PER_CHUNK, PAGE)


def layout() -> PagedLayout:
    names = tuple(f"model.layers.{i}.attn" for i in range(LAYERS))
    return PagedLayout(names, BLOCK_SIZE, PAGE, "uint8", "test-layout")


def allocation() -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    """What vLLM hands a worker's ``register_kv_caches``: a KV cache config placing every layer
    in one zeroed allocation, the caches by layer name, and that allocation
    ``[layers, blocks, page]``."""
    memory = torch.zeros(LAYERS, BLOCKS, PAGE, dtype=torch.uint8)
    names = layout().layer_names
    placement = SimpleNamespace(
        layers=list(names), offset=0, layer_stride=BLOCKS * PAGE, block_stride=PAGE
    )
    config: Any = SimpleNamespace(num_blocks=BLOCKS, kv_cache_tensors=[placement])
    return config, {names[0]: memory}, memory


def paged_kv() -> tuple[PagedKV, torch.Tensor]:
    """A PagedKV over one zeroed allocation, and that allocation ``[layers, blocks, page]``."""
    config, caches, memory = allocation()
    return PagedKV(layout(), config, caches), memory


class CountingCache:
    """Wraps a cache for a loader: counts the keys read (the fetch) and signals the first read."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.read, self.first = kv, 0, threading.Event()

    def get_chunks_into(self, keys: Sequence[Any], outs: Sequence[torch.Tensor]) -> int:
        self.read += len(keys)
        self.first.set()
        return int(self.kv.get_chunks_into(keys, outs))


class StalledCache:
    """Wraps a cache so that reads wait until ``release`` is set (a tier answering late): reads
    of ``key`` only, or every read where ``key`` is None."""

    def __init__(self, kv: Any, key: Any = None) -> None:
        self.kv, self.key = kv, key
        self.entered, self.release = threading.Event(), threading.Event()

    def get_chunks_into(self, keys: Sequence[Any], outs: Sequence[torch.Tensor]) -> int:
        if self.key is None or self.key in keys:
            self.entered.set()
            self.release.wait(10)
        return int(self.kv.get_chunks_into(keys, outs))


def chunk_of(value: int) -> torch.Tensor:
    """A chunk whose every page byte says which chunk and layer it is."""
    out = torch.empty(SHAPE, dtype=torch.uint8)
    for layer in range(LAYERS):
        out[layer] = value * 10 + layer
    return out


def cache(tiers: list[str] | None = None) -> KVCache:
    config = KVConfig(model="test", chunk_size=CHUNK, tiers=tiers or ["cpu://?size=4MiB"])
    return KVCache(config)
