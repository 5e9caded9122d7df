"""vLLM's paged KV as chunk-sized byte pages: layout description and block gather/scatter.

vLLM places layer ``l``'s page of block ``b`` at ``offset + l * layer_stride + b * block_stride``
bytes of a ``KVCacheTensor`` allocation (``KVCacheConfig.kv_cache_tensors``). kvstack stores a
chunk as those pages, verbatim: a ``uint8`` tensor ``[num_layers, blocks_per_chunk, page_bytes]``
in the engine's own page encoding. No reformatting happens on the hot path, and the layout
signature (device, attention layout, block size, page size, dtype, heads...) is part of the key
namespace, so engines with different layouts never exchange chunks.

**Restorable layouts.** kvstack restores a prefix by writing every layer's pages of its blocks.
That is the whole state only when the model has one KV cache group of full attention: a
sliding-window or chunked-local group drops blocks outside its window, a Mamba group keeps a
running state, and several groups need several block tables. For any other layout
:func:`describe_layout` returns a layout with ``restorable = False`` and the reason; the
connector then stores nothing and serves no hit for that model (the model still runs).

Copies are vectorised torch ops, one per layer per chunk, and can run one layer at a time (for
layer pipelining). On GPUs the caller runs them on a side stream (:mod:`.streams`).
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
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

__all__ = ["PagedKV", "PagedLayout", "describe_layout", "unrestorable_reason"]


@dataclass(frozen=True)
class PagedLayout:
    layer_names: tuple[str, ...]
    block_size: int
    page_bytes: int
    kv_dtype: str
    signature: str  # short digest of everything that decides the page bytes
    unrestorable: str = ""  # why kvstack cannot restore this model's KV ("" when it can)

    @property
    def restorable(self) -> bool:
        return not self.unrestorable

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    def chunk_shape(self, blocks: int) -> tuple[int, int, int]:
        return (self.num_layers, blocks, self.page_bytes)


def unrestorable_reason(kv_cache_config: KVCacheConfig) -> str:
    """Why loading pages would not restore this model's KV state ("" when it would)."""
    groups = [g for g in kv_cache_config.kv_cache_groups if g.layer_names]
    kinds = [_spec_kind(g.kv_cache_spec) for g in groups]
    if len(groups) == 1 and kinds[0] == "full attention":
        return ""
    if len(groups) == 1:
        return f"its one KV cache group is {kinds[0]}, which keeps no full prefix state"
    return (
        f"vLLM keeps {len(groups)} KV cache groups ({', '.join(kinds)}): blocks outside a "
        "sliding window or a recurrent state are not pages kvstack can restore. Start vLLM "
        "with --disable-hybrid-kv-cache-manager to keep every layer's full KV, which kvstack "
        "then serves"
    )


def _spec_kind(spec: KVCacheSpec) -> str:
    from vllm.v1.kv_cache_interface import FullAttentionSpec, RSWASpec, UniformTypeKVCacheSpecs

    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {_spec_kind(s) for s in spec.kv_cache_specs.values()}
        pages = {s.page_size_bytes for s in spec.kv_cache_specs.values()}
        if inner == {"full attention"} and len(pages) == 1:
            return "full attention"
        return "layers of different page sizes"
    if isinstance(spec, FullAttentionSpec) and not isinstance(spec, RSWASpec):
        return "full attention"
    return type(spec).__name__.removesuffix("Spec").replace("_", " ") or "unknown"


def describe_layout(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> PagedLayout:
    """The layout both connector roles derive from the same ``KVCacheConfig``."""
    groups = [g for g in kv_cache_config.kv_cache_groups if g.layer_names]
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
    reason = unrestorable_reason(kv_cache_config)
    if reason:  # never exchange chunks with a restorable layout of the same first group
        described["groups"] = [type(g.kv_cache_spec).__name__ for g in groups]
    digest = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    return PagedLayout(
        layers, spec.block_size, spec.page_size_bytes, dtype, f"vllm-{digest}", reason
    )


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
        self.layer_index = {name: i for i, name in enumerate(layout.layer_names)}
        self.device = self.pages[0].device

    def block_index(self, block_ids: Sequence[int]) -> torch.Tensor:
        """Block ids as an index tensor on the KV's device (build once, use per layer)."""
        return torch.tensor(block_ids, dtype=torch.long, device=self.device)

    def gather_layer(self, layer: int, index: torch.Tensor, out: torch.Tensor) -> None:
        """Copy layer ``layer``'s pages of the blocks in ``index`` into ``out``
        (``[len(index), page]``, host memory; on a GPU a non-blocking copy on the caller's
        stream, so ``out`` must be pinned and kept until that stream has run it)."""
        pages = self.pages[layer]
        if pages.device.type == "cpu":
            torch.index_select(pages, 0, index, out=out)
        else:
            out.copy_(pages.index_select(0, index), non_blocking=True)

    def scatter_layer(self, layer: int, index: torch.Tensor, src: torch.Tensor) -> None:
        """Write ``src`` (``[len(index), page]``, host memory) into layer ``layer``'s pages."""
        pages = self.pages[layer]
        if pages.device.type != "cpu":
            src = src.to(pages.device, non_blocking=True)
        pages.index_copy_(0, index, src)

    def gather(self, block_ids: Sequence[int], out: torch.Tensor) -> None:
        """Every layer's pages of ``block_ids`` into ``out`` (``[layers, len(ids), page]``)."""
        index = self.block_index(block_ids)
        for layer in range(len(self.pages)):
            self.gather_layer(layer, index, out[layer])

    def scatter(self, block_ids: Sequence[int], src: torch.Tensor) -> None:
        """Write ``src`` (``[layers, len(ids), page]``) into the pages of ``block_ids``."""
        index = self.block_index(block_ids)
        for layer in range(len(self.pages)):
            self.scatter_layer(layer, index, src[layer])


def _raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of the whole storage behind ``tensor``."""
    raw = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return raw.set_(tensor.untyped_storage())
