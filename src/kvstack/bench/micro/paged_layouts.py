"""Paged KV allocations in vLLM's layouts, without vLLM, for benchmarks of the connector's copies.

vLLM (0.32) describes a KV cache group's memory with ``KVCacheTensor`` placements: layer ``l``'s
page of block ``b`` starts at ``offset + l * layer_stride + b * block_stride`` bytes into an
allocation. Two layouts matter on GPUs (``vllm.v1.kv_cache_layout.KVCacheLayout``):

- ``per-layer`` (``LBHNC``; FlashAttention's ``[num_blocks, num_kv_heads, block_size,
  2 * head_size]`` view per layer, FlashInfer's ``LBNHC`` differs only inside a page): one
  allocation per layer, ``block_stride = page``;
- ``cross-layer`` (``BLHNC``, block outermost): one allocation for every layer, each block a
  run of all layers' pages (``layer_stride = page``, ``block_stride = num_layers * page``).

:func:`build_paged` makes such an allocation on any device, fills it with random bytes, and
wraps it in the connector's own :class:`~kvstack.integrations.vllm.layout.PagedKV` exactly as
the connector's ``register_kv_caches`` does with vLLM's ``KVCacheConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvstack.integrations.vllm.layout import PagedKV, PagedLayout
from kvstack.kv.tensors import torch

__all__ = ["LAYOUTS", "PagedAllocation", "PagedShape", "build_paged"]

LAYOUTS = ("per-layer", "cross-layer")


class PagedShape(NamedTuple):
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def page_bytes(self) -> int:
        """One layer's K and V of one block."""
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def token_bytes(self) -> int:
        return self.num_layers * self.page_bytes // self.block_size


@dataclass(frozen=True)
class _Placement:  # the fields of vLLM's KVCacheTensor that PagedKV reads
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int = 0


@dataclass(frozen=True)
class _CacheConfig:  # the fields of vLLM's KVCacheConfig that PagedKV reads
    num_blocks: int
    kv_cache_tensors: list[_Placement] = field(default_factory=list)


@dataclass
class PagedAllocation:
    paged: PagedKV
    kv_caches: dict[str, torch.Tensor]  # per layer, in the attention backend's view
    layout: str


def build_paged(
    shape: PagedShape, layout: str, num_blocks: int, device: torch.device, seed: int = 0
) -> PagedAllocation:
    """A random-filled paged KV allocation of ``num_blocks`` blocks in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown paged layout {layout!r}; known: {', '.join(LAYOUTS)}")
    names = [f"model.layers.{i}.self_attn.attn" for i in range(shape.num_layers)]
    page = shape.page_bytes
    block_view = (shape.num_kv_heads, shape.block_size, 2 * shape.head_dim)
    gen = torch.Generator(device=device).manual_seed(seed)
    if layout == "per-layer":
        raws = [_random_bytes(num_blocks * page, device, gen) for _ in names]
        views = [r.view(shape.dtype).view(num_blocks, *block_view) for r in raws]
        caches = dict(zip(names, views, strict=True))
        placements = [_Placement([n], 0, page) for n in names]
    else:
        raw = _random_bytes(num_blocks * shape.num_layers * page, device, gen)
        whole = raw.view(shape.dtype).view(num_blocks, shape.num_layers, *block_view)
        caches = {n: whole[:, i] for i, n in enumerate(names)}
        placements = [_Placement(names, page, shape.num_layers * page)]
    paged_layout = PagedLayout(
        tuple(names), shape.block_size, page, str(shape.dtype).removeprefix("torch."),
        f"bench-{shape.name}-{layout}",
    )  # fmt: skip
    config: Any = _CacheConfig(num_blocks, placements)
    return PagedAllocation(PagedKV(paged_layout, config, caches), caches, layout)


def _random_bytes(num_bytes: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    # Random bytes, not random values: fp8 and bf16 bit patterns alike (NaNs included) must
    # survive a round trip, which only a byte comparison checks.
    return torch.randint(0, 256, (num_bytes,), dtype=torch.uint8, device=device, generator=gen)
