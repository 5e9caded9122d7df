"""One kernel for every layer: a request's pages gathered from (or scattered into) vLLM's paged
KV on a GPU, with Triton.

With PyTorch's own operators a copy between the paged KV and a contiguous buffer takes one
``index_select`` or ``index_copy_`` per layer, because each layer's pages are their own
allocation. On an H200 that launch-bound loop kept the connector's copies of Llama-3-70B at
TP=8 (80 layers, 4-8 KiB pages) at 0.40x-0.69x of PyTorch's pinned copy of the same bytes
(``benchmarks/results/gpu/``). These kernels read each layer's base address from a small table
and copy every (block, layer) page of a request in one launch, between the paged KV and a
*chunk-major* device buffer: chunk ``i``'s ``[layers, blocks_i, page]`` bytes are contiguous
there, exactly the chunk's format in host staging, so each chunk then crosses the link in one
transfer with no reordering.

Triton ships with PyTorch's CUDA wheels and with vLLM on GPUs; where it cannot be imported,
or the layers do not share one block stride, :func:`kernels_usable` is False and the connector
keeps its PyTorch path (:mod:`.transfers`). On CPUs the kernels run only in Triton's
interpreter, which the tests use to check them byte for byte.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvstack.integrations.vllm.layout import PagedKV

__all__ = ["ChunkBuffer", "ChunkPlan", "gather", "kernels_usable", "plan_chunks", "scatter"]

log = logging.getLogger(__name__)
DISABLE_ENV = "KVSTACK_PAGED_KERNELS"
WORD = 8  # bytes per element the kernels move (pages are multiples of 16 bytes)
BLOCK = 512  # words per program


def kernels_usable(paged: PagedKV) -> bool:
    """Whether this paged KV can be copied with the kernels (on its GPU, with Triton; on CPU
    tensors only in Triton's interpreter, ``TRITON_INTERPRET=1``). ``KVSTACK_PAGED_KERNELS=0``
    turns them off: the PyTorch path is then used, as where Triton is missing."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return False
    on_device = paged.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    return on_device and _layers_table(paged) is not None and _kernel() is not None


@dataclass(frozen=True)
class ChunkPlan:
    """Where each block of some chunks goes in (or comes from) a chunk-major device buffer."""

    index: torch.Tensor  # [blocks] block ids, chunk after chunk (on the KV's device)
    offsets: torch.Tensor  # [blocks] word offset of the block's layer-0 page in the buffer
    layer_strides: torch.Tensor  # [blocks] words between two layers of the block's chunk
    chunk_words: tuple[int, ...]  # each chunk's size in the buffer
    num_words: int


def plan_chunks(paged: PagedKV, indexes: Sequence[torch.Tensor]) -> ChunkPlan:
    """A plan for chunks with these block ids (each chunk ``[layers, len(ids), page]``)."""
    page_words = paged.layout.page_bytes // WORD
    layers = paged.layout.num_layers
    offsets: list[int] = []
    strides: list[int] = []
    sizes: list[int] = []
    start = 0
    for index in indexes:
        n = index.numel()
        offsets += [start + k * page_words for k in range(n)]
        strides += [n * page_words] * n
        sizes.append(layers * n * page_words)
        start += sizes[-1]
    cat = torch.cat(list(indexes)) if len(indexes) > 1 else indexes[0]
    table = _to_device(offsets + strides, paged.device)
    return ChunkPlan(
        cat.to(dtype=torch.int64), table[: len(offsets)], table[len(offsets) :], tuple(sizes), start
    )


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A small int64 table on ``device``, copied without making the host wait: a copy from
    pageable memory would block until the stream's earlier work (a previous step's
    copy-out) is done. Pinned host blocks are cached and reused only after the copy."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class ChunkBuffer:
    """Chunks' pages in one chunk-major device buffer, with its plan. Make it on the stream
    that uses it (the caching allocator reuses its memory after that stream's work)."""

    def __init__(self, paged: PagedKV, indexes: Sequence[torch.Tensor]) -> None:
        self.plan = plan_chunks(paged, indexes)
        self.words = torch.empty(self.plan.num_words, dtype=torch.int64, device=paged.device)
        self._bytes = self.words.view(torch.uint8)
        page = paged.layout.page_bytes
        self._shapes = [(paged.layout.num_layers, i.numel(), page) for i in indexes]
        self._starts = [0]
        for words in self.plan.chunk_words:
            self._starts.append(self._starts[-1] + words * WORD)

    def chunk(self, i: int, layers: range | None = None) -> torch.Tensor:
        """Chunk ``i`` as ``[layers, blocks, page]`` bytes (a contiguous view)."""
        layers_n, n, page = self._shapes[i]
        view = self._bytes[self._starts[i] : self._starts[i + 1]].view(layers_n, n, page)
        return view if layers is None else view[layers.start : layers.stop]


def gather(paged: PagedKV, plan: ChunkPlan, buffer: torch.Tensor, layers: range) -> None:
    """Copy ``layers`` of the plan's blocks into ``buffer`` (int64, ``plan.num_words``)."""
    _launch(paged, plan, buffer, layers, to_buffer=True)


def scatter(paged: PagedKV, plan: ChunkPlan, buffer: torch.Tensor, layers: range) -> None:
    """Copy ``layers`` of the plan's chunks from ``buffer`` into their blocks."""
    _launch(paged, plan, buffer, layers, to_buffer=False)


def _launch(
    paged: PagedKV, plan: ChunkPlan, buffer: torch.Tensor, layers: range, to_buffer: bool
) -> None:
    kernel = _kernel()
    table = _layers_table(paged)
    if kernel is None or table is None:
        raise RuntimeError("kvstack: the paged KV kernels cannot run here (kernels_usable)")
    if buffer.dtype != torch.int64 or buffer.numel() < plan.num_words:
        raise ValueError("the chunk buffer must be int64 and hold the plan's words")
    if not len(layers) or not plan.index.numel():
        return
    pointers, block_words = table
    page_words = paged.layout.page_bytes // WORD
    grid = (plan.index.numel(), len(layers), -(-page_words // BLOCK))
    kernel[grid](
        pointers, plan.index, plan.offsets, plan.layer_strides, buffer,
        layers.start, block_words, page_words, BLOCK=BLOCK, TO_BUFFER=to_buffer,
    )  # fmt: skip


_TABLES: weakref.WeakKeyDictionary[PagedKV, tuple[torch.Tensor, int] | None] = (
    weakref.WeakKeyDictionary()
)


def _layers_table(paged: PagedKV) -> tuple[torch.Tensor, int] | None:
    """Each layer's page array address, and the one block stride they share (in words)."""
    if paged in _TABLES:
        return _TABLES[paged]
    table: tuple[torch.Tensor, int] | None = None
    strides = {p.stride(0) for p in paged.pages}
    addresses = [p.data_ptr() for p in paged.pages]
    if (
        len(strides) == 1
        and paged.layout.page_bytes % WORD == 0
        and all(p.stride(1) == 1 for p in paged.pages)
        and all(a % WORD == 0 for a in addresses)
        and next(iter(strides)) % WORD == 0
    ):
        words = next(iter(strides)) // WORD
        table = (torch.tensor(addresses, dtype=torch.int64, device=paged.device), words)
    _TABLES[paged] = table
    return table


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, or None where Triton cannot be imported or set up."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from kvstack.integrations.vllm.paged_triton import copy_pages

        return copy_pages
    except Exception:  # an unusable Triton is the PyTorch path, not a failed engine
        log.warning("kvstack: Triton is installed but its kernels cannot be built", exc_info=True)
        return None
