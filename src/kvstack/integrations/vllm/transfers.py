"""Many chunks' pages between the engine's paged KV and host staging, in few operations.

The connector's unit is a chunk: ``[layers, blocks, page]`` bytes in host memory, taken from
blocks spread through each layer's page array. Copied a layer and a chunk at a time, a
request of ``C`` chunks costs ``C x L`` small copies. On vLLM's CPU build each is an
``index_select`` straight into (or ``index_copy_`` from) the host buffer, at memcpy speed, and
that stays the path there. On a GPU each is a kernel plus a transfer over the link with a fixed
cost of some microseconds: the first GPU check (``benchmarks/results/gpu/``, H200) measured
that path at 0.45x of PyTorch's own pinned copy of the same bytes for Llama-3-8B (1 MiB pieces)
and 0.06x for Llama-3-70B's share of a GPU at TP=8 in fp8 (64 KiB pieces).

On a GPU these functions instead gather one layer of every chunk with one ``index_select``
into a device buffer, reorder it into chunk order on the device, and cross the link once per
chunk (or once per chunk and layer, when a single layer is copied for layer pipelining); loads
do the reverse, one transfer per chunk and one ``index_copy_`` per layer. Where Triton is
there (it ships with PyTorch's CUDA wheels), one kernel replaces the per-layer operators
(:mod:`.paged_kernels`). The device buffer is
bounded by :data:`GROUP_BYTES` (chunks are taken in groups): the connector runs inside vLLM's
memory budget and must not take much of the card beyond it. Everything is enqueued on the
caller's current stream, so temporaries are reused by the caching allocator only after the
copies that read them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from kvstack.integrations.vllm.layout import PagedKV
from kvstack.integrations.vllm.paged_kernels import ChunkBuffer, kernels_usable
from kvstack.integrations.vllm.paged_kernels import gather as kernel_gather
from kvstack.integrations.vllm.paged_kernels import scatter as kernel_scatter

__all__ = [
    "GROUP_BYTES",
    "STAGED_DEVICE_BYTES",
    "DeviceStage",
    "LayerCopyOut",
    "batched_by_default",
    "gather_chunks",
    "scatter_chunks",
    "slabs",
    "staging_chunks",
    "upload",
    "write_layer",
]

GROUP_BYTES = 64 << 20  # device memory a batched copy may hold at once
STAGED_DEVICE_BYTES = 512 << 20  # a step's layer-pipelined copies held on the GPU, at most


def staging_chunks(chunk_shape: tuple[int, int, int], budget_bytes: int, most: int) -> int:
    """How many chunk buffers of ``chunk_shape`` (bytes) fit in ``budget_bytes`` of host
    staging, at least one (a chunk must move) and at most ``most``."""
    chunk_bytes = chunk_shape[0] * chunk_shape[1] * chunk_shape[2]
    return max(1, min(most, budget_bytes // max(chunk_bytes, 1)))


def batched_by_default(paged: PagedKV) -> bool:
    return paged.device.type == "cuda"


def gather_chunks(
    paged: PagedKV,
    layers: Sequence[int],
    indexes: Sequence[torch.Tensor],
    outs: Sequence[torch.Tensor],
    batched: bool | None = None,
) -> None:
    """For each layer in ``layers`` and each chunk ``i``: ``outs[i][layer]`` gets that layer's
    pages of the blocks in ``indexes[i]`` (``outs[i]``: ``[num_layers, len(indexes[i]), page]``
    host memory, pinned on GPUs and kept until the caller's stream has run the copy)."""
    if not (batched_by_default(paged) if batched is None else batched):
        for layer in layers:
            for index, out in zip(indexes, outs, strict=True):
                paged.gather_layer(layer, index, out[layer])
        return
    for run in _runs(layers):
        for group in _groups(paged, len(run), indexes):
            _gather_group(paged, run, [indexes[i] for i in group], [outs[i] for i in group])


def _gather_group(
    paged: PagedKV, run: range, indexes: list[torch.Tensor], outs: list[torch.Tensor]
) -> None:
    index = torch.cat(indexes) if len(indexes) > 1 else indexes[0]
    rows = torch.empty(
        (len(run), index.numel(), paged.layout.page_bytes), dtype=torch.uint8, device=paged.device
    )
    for j, layer in enumerate(run):
        torch.index_select(paged.pages[layer], 0, index, out=rows[j])
    _send_chunks(rows, indexes, [out[run.start : run.stop] for out in outs])


def _send_chunks(rows: torch.Tensor, indexes: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    """Layer-major device ``rows`` (``[layers, blocks, page]``, the chunks' blocks in order)
    into each chunk's host ``out``: one transfer per chunk, so the link's fixed cost is paid
    once, not once per layer."""
    start = 0
    for chunk_index, out in zip(indexes, outs, strict=True):
        end = start + chunk_index.numel()
        piece = rows[:, start:end]
        out.copy_(piece if len(rows) == 1 else piece.contiguous(), non_blocking=True)
        start = end


class LayerCopyOut:
    """A step's copy-out of chunks, layer by layer as layer pipelining submits it, then the
    rest at the end of the step (each method runs on the copy stream, in order).

    On GPUs, while the step's chunks fit :data:`STAGED_DEVICE_BYTES`, each layer is gathered
    on the device as soon as it has run (one ``index_select``), and the chunks cross the link
    at the end, once each; one transfer per chunk and layer would pay the link's fixed cost
    ``layers`` times more often (measured on an H200 at 0.05x-0.14x of PyTorch's copy for
    Llama-3-70B's pages). Otherwise, and on CPUs, each layer goes straight to host memory."""

    def __init__(
        self, paged: PagedKV, indexes: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]
    ) -> None:
        self._paged, self._indexes, self._outs = paged, list(indexes), list(outs)
        per_layer = sum(i.numel() for i in indexes) * paged.layout.page_bytes
        self._on_device = batched_by_default(paged) and (
            per_layer * paged.layout.num_layers <= STAGED_DEVICE_BYTES
        )
        # [layers, blocks, page] and the chunks' block ids in order, made on the stream
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._kernels = self._on_device and kernels_usable(paged)

    @property
    def defers_layers(self) -> bool:
        """Whether :meth:`layer` does nothing and :meth:`end` copies every layer (with one
        kernel, :mod:`.paged_kernels`): the blocks stay as they are until the step ends, and
        one launch costs less than a launch per layer."""
        return self._kernels

    @property
    def on_device(self) -> bool:
        """Whether the chunks wait on the device for :meth:`end` to send them."""
        return self._on_device

    def layer(self, layer: int) -> None:
        if self._kernels:
            return
        if not self._on_device:
            gather_chunks(self._paged, [layer], self._indexes, self._outs)
            return
        rows, index = self._device_rows()
        torch.index_select(self._paged.pages[layer], 0, index, out=rows[layer])

    def end(self, layers: Sequence[int]) -> None:
        """Copy ``layers`` (those not copied yet), and on GPUs send every chunk over the link."""
        if not self._on_device:
            gather_chunks(self._paged, layers, self._indexes, self._outs)
            return
        if self._kernels:
            chunks = ChunkBuffer(self._paged, self._indexes)
            all_layers = range(self._paged.layout.num_layers)
            kernel_gather(self._paged, chunks.plan, chunks.words, all_layers)
            for i, out in enumerate(self._outs):
                out.copy_(chunks.chunk(i), non_blocking=True)
            return
        for layer in layers:
            self.layer(layer)
        _send_chunks(self._device_rows()[0], self._indexes, self._outs)
        self._rows = None  # back to the allocator, after the copies on this stream

    def _device_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rows is None:
            index = torch.cat(self._indexes) if len(self._indexes) > 1 else self._indexes[0]
            layout = self._paged.layout
            shape = (layout.num_layers, index.numel(), layout.page_bytes)
            rows = torch.empty(shape, dtype=torch.uint8, device=self._paged.device)
            self._rows = (rows, index)
        return self._rows


@dataclass
class DeviceStage:
    """Some layers of chunks' pages on the KV's device, ready to be written layer by layer."""

    index: torch.Tensor  # the chunks' block ids, in order
    layers: range
    rows: torch.Tensor  # [len(layers), len(index), page]


def upload(
    paged: PagedKV,
    indexes: Sequence[torch.Tensor],
    srcs: Sequence[torch.Tensor],
    layers: range | None = None,
) -> list[DeviceStage]:
    """Move ``layers`` (default: all) of staged chunks (``srcs[i]``: ``[num_layers,
    len(indexes[i]), page]``, host) to the device, one transfer per chunk, in groups of at
    most :data:`GROUP_BYTES`."""
    layers = range(paged.layout.num_layers) if layers is None else layers
    stages = []
    for group in _groups(paged, len(layers), indexes):
        chunk_indexes = [indexes[i] for i in group]
        index = torch.cat(chunk_indexes) if len(group) > 1 else chunk_indexes[0]
        rows = torch.empty(
            (len(layers), index.numel(), paged.layout.page_bytes),
            dtype=torch.uint8,
            device=paged.device,
        )
        start = 0
        for i in group:
            end = start + indexes[i].numel()
            rows[:, start:end].copy_(srcs[i][layers.start : layers.stop], non_blocking=True)
            start = end
        stages.append(DeviceStage(index, layers, rows))
    return stages


def write_layer(paged: PagedKV, layer: int, stages: Sequence[DeviceStage]) -> None:
    """Write layer ``layer`` of uploaded chunks into their blocks (one ``index_copy_`` per
    stage that holds the layer)."""
    for stage in stages:
        if layer in stage.layers:
            pages = stage.rows[layer - stage.layers.start]
            paged.pages[layer].index_copy_(0, stage.index, pages)


def slabs(num_layers: int, count: int) -> list[range]:
    """``num_layers`` layers in ``count`` consecutive slabs of nearly equal size."""
    count = max(1, min(count, num_layers))
    bounds = [num_layers * k // count for k in range(count + 1)]
    return [range(a, b) for a, b in itertools.pairwise(bounds)]


def scatter_chunks(
    paged: PagedKV,
    indexes: Sequence[torch.Tensor],
    srcs: Sequence[torch.Tensor],
    batched: bool | None = None,
) -> None:
    """Write every layer of staged chunks (``srcs[i]``: ``[num_layers, len(indexes[i]),
    page]``, host memory) into the blocks in ``indexes[i]``."""
    if not (batched_by_default(paged) if batched is None else batched):
        for layer in range(paged.layout.num_layers):
            for index, src in zip(indexes, srcs, strict=True):
                paged.scatter_layer(layer, index, src[layer])
        return
    kernels = kernels_usable(paged)
    for group in _groups(paged, paged.layout.num_layers, indexes):
        if kernels:
            chunks = ChunkBuffer(paged, [indexes[i] for i in group])
            for k, i in enumerate(group):
                chunks.chunk(k).copy_(srcs[i], non_blocking=True)
            all_layers = range(paged.layout.num_layers)
            kernel_scatter(paged, chunks.plan, chunks.words, all_layers)
            continue
        stages = upload(paged, [indexes[i] for i in group], [srcs[i] for i in group])
        for layer in range(paged.layout.num_layers):
            write_layer(paged, layer, stages)


def _runs(layers: Sequence[int]) -> Iterator[range]:
    """Consecutive layers as ranges (a copy of several layers of a chunk is one transfer only
    where they are adjacent in its staging)."""
    ordered = sorted(set(layers))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            yield range(ordered[start], ordered[i - 1] + 1)
            start = i


def _groups(paged: PagedKV, num_layers: int, indexes: Sequence[torch.Tensor]) -> Iterator[range]:
    """Chunks in order, as many per group as fit :data:`GROUP_BYTES` (at least one)."""
    per_block = num_layers * paged.layout.page_bytes
    start, held = 0, 0
    for i, index in enumerate(indexes):
        size = index.numel() * per_block
        if i > start and held + size > GROUP_BYTES:
            yield range(start, i)
            start, held = i, 0
        held += size
    if start < len(indexes):
        yield range(start, len(indexes))
