"""vLLM's paged KV as chunk-sized byte pages: layout description and block gather/scatter.

vLLM places layer ``l``'s page of block ``b`` at ``offset + l * layer_stride + b * block_stride``
bytes of a ``KVCacheTensor`` allocation (``KVCacheConfig.kv_cache_tensors``). kvstack stores a
chunk as those pages, verbatim: a ``uint8`` tensor ``[num_layers, blocks_per_chunk, page_bytes]``
in the engine's own page encoding. No reformatting happens on the hot path, and the layout
signature (device, attention layout, block size, page size, dtype, heads...) is part of the key
namespace, so engines with different layouts never exchange chunks.

Copies are vectorised torch ops, one per layer per chunk. On GPUs the pages are gathered on the
device, then copied to pinned host memory with a non-blocking copy on a side stream.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvstack.errors import ConfigError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

__all__ = ["PagedKV", "PagedLayout", "describe_layout"]


@dataclass(frozen=True)
class PagedLayout:
    layer_names: tuple[str, ...]
    block_size: int
    page_bytes: int
    kv_dtype: str
    signature: str  # short digest of everything that decides the page bytes

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    def chunk_shape(self, blocks: int) -> tuple[int, int, int]:
        return (self.num_layers, blocks, self.page_bytes)


def describe_layout(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> PagedLayout:
    """The layout both connector roles derive from the same ``KVCacheConfig``."""
    groups = [g for g in kv_cache_config.kv_cache_groups if g.layer_names]
    if len(groups) != 1:
        raise ConfigError(
            f"kvstack's connector supports models with one KV cache group; this model has "
            f"{len(groups)} (hybrid or sliding-window attention)"
        )
    spec = groups[0].kv_cache_spec
    layers = tuple(name for t in kv_cache_config.kv_cache_tensors for name in t.layers)
    dtype = str(getattr(spec, "dtype", "unknown")).removeprefix("torch.")
    described: dict[str, Any] = {
        "device": str(vllm_config.device_config.device_type),
        "layout": kv_cache_config.kv_cache_layout,
        "spec": type(spec).__name__,
        "block_size": spec.block_size,
        "page_bytes": spec.page_size_bytes,
        "dtype": dtype,
        "cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "num_kv_heads": getattr(spec, "num_kv_heads", None),
        "head_size": getattr(spec, "head_size", None),
        "layers": len(layers),
    }
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    return PagedLayout(layers, spec.block_size, spec.page_size_bytes, dtype, f"vllm-{digest}")


class PagedKV:
    """Per-layer ``[num_blocks, page_bytes]`` byte views of the engine's KV allocation."""

    def __init__(
        self,
        layout: PagedLayout,
        kv_cache_config: KVCacheConfig,
        kv_caches: dict[str, torch.Tensor],
    ) -> None:
        self.layout = layout
        self.num_blocks = kv_cache_config.num_blocks
        views: dict[str, torch.Tensor] = {}
        for placement in kv_cache_config.kv_cache_tensors:
            some_layer = next((n for n in placement.layers if n in kv_caches), None)
            if some_layer is None:
                continue
            raw = _raw_bytes(kv_caches[some_layer])
            for index, name in enumerate(placement.layers):
                start = placement.offset + index * placement.layer_stride
                end = start + (self.num_blocks - 1) * placement.block_stride + layout.page_bytes
                if end > raw.numel():
                    raise ConfigError(f"KV layout of {name} runs past its allocation")
                views[name] = raw.as_strided(
                    (self.num_blocks, layout.page_bytes), (placement.block_stride, 1), start
                )
        missing = [n for n in layout.layer_names if n not in views]
        if missing:
            raise ConfigError(f"no KV cache registered for layers {missing[:3]}")
        self.pages = [views[n] for n in layout.layer_names]
        self.device = self.pages[0].device
        self._stream: torch.cuda.Stream | None = None
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]

    def gather(self, block_ids: Sequence[int], out: torch.Tensor) -> None:
        """Copy the pages of ``block_ids`` into ``out`` (host ``[layers, len(ids), page]``)."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        if self._stream is None:
            for layer, pages in enumerate(self.pages):
                torch.index_select(pages, 0, idx, out=out[layer])
            return
        staged = torch.stack([pages.index_select(0, idx) for pages in self.pages])
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            out.copy_(staged, non_blocking=True)
        self._stream.synchronize()

    def scatter(self, block_ids: Sequence[int], src: torch.Tensor) -> None:
        """Write ``src`` (host ``[layers, len(ids), page]``) into the pages of ``block_ids``."""
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                src = src.to(self.device, non_blocking=True)
            torch.cuda.current_stream().wait_stream(self._stream)
        for layer, pages in enumerate(self.pages):
            pages.index_copy_(0, idx, src[layer])


def _raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of the whole storage behind ``tensor``."""
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return raw.set_(tensor.untyped_storage())
