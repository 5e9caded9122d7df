"""Synchronous loads: chunks the step's forward pass needs, written before their layer runs.

``start`` fetches every planned chunk from the tiers into staging buffers (these loads come
from the in-memory tier, or from a slower one where :mod:`.load_cost` found the step the cheaper
place; the others are asynchronous, :mod:`.loads`). Without pipelining it
then writes every layer's blocks at once. With pipelining it hands one write per layer to the
copy stream and returns, so that the write of layer ``i + 1`` overlaps the computation of layer
``i``; ``wait_for_layer(i)`` orders layer ``i``'s attention after its write (a host wait on the
CPU build, a stream dependency on GPUs), and ``finish`` (end of the step) waits for all of them
before the staging buffers are reused.

Chunks that cannot be fetched are reported, with every chunk after them in the request, as
failed blocks for vLLM to recompute in the same step.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass, field

import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.layout import PagedKV
from kvstack.integrations.vllm.load_cost import LoadSample
from kvstack.integrations.vllm.paged_kernels import ChunkBuffer, kernels_usable
from kvstack.integrations.vllm.paged_kernels import scatter as kernel_scatter
from kvstack.integrations.vllm.streams import Completion, CopyStream
from kvstack.integrations.vllm.transfers import (
    STAGED_DEVICE_BYTES,
    DeviceStage,
    batched_by_default,
    scatter_chunks,
    slabs,
    upload,
    write_layer,
)
from kvstack.kv.cache import KVCache
from kvstack.kv.keys import ChunkKey

__all__ = [
    "PIPELINE_SLABS",
    "StagedChunk",
    "SyncLoadResult",
    "SyncLoader",
    "staged_chunk",
    "submit_layer_writes",
]

PIPELINE_SLABS = 4  # layer 0 waits for a quarter of the step's loads to cross, not all


@dataclass
class SyncLoadResult:
    loaded_blocks: int = 0
    failed_blocks: set[int] = field(default_factory=set)
    failed_chunks: int = 0
    failed_req_ids: list[str] = field(default_factory=list)
    samples: list[LoadSample] = field(default_factory=list)  # each its share of the time


@dataclass
class StagedChunk:
    index: torch.Tensor  # block ids on the KV's device
    pages: torch.Tensor  # [layers, len(index), page] in a staging buffer


def staged_chunk(paged: PagedKV, chunk: ChunkIO, buffer: torch.Tensor) -> StagedChunk:
    """``chunk``'s block ids and its pages in ``buffer`` (``[layers, per_chunk, page]``)."""
    end = chunk.first_block + len(chunk.block_ids)
    return StagedChunk(paged.block_index(chunk.block_ids), buffer[:, chunk.first_block : end])


class SyncLoader:
    def __init__(
        self,
        cache: KVCache,
        chunk_shape: tuple[int, int, int],
        rank: int,
        stream: CopyStream,
        pipelined: bool,
        keep_chunks: int = sys.maxsize,
    ) -> None:
        self._cache, self._shape, self._rank = cache, chunk_shape, rank
        self._stream, self.pipelined = stream, pipelined
        self._staging: list[torch.Tensor] = []
        self._keep = keep_chunks  # staging buffers kept from one step to the next
        self._layers: list[Completion] = []
        self._pin = torch.cuda.is_available()

    def start(self, paged: PagedKV, requests: list[RequestIO]) -> SyncLoadResult:
        """Fetch the chunks and write them (or start writing them, layer by layer)."""
        self.finish()  # the staging buffers are about to be refilled
        start = time.perf_counter()
        result = SyncLoadResult()
        staged: list[StagedChunk] = []
        buffers = self._buffers(sum(len(r.chunks) for r in requests))
        loaded: list[tuple[str, int]] = []
        for request in requests:
            mine, buffers = buffers[: len(request.chunks)], buffers[len(request.chunks) :]
            ok = self._fetch(paged, request, mine, result)
            staged += ok
            loaded.append((request.req_id, len(ok)))
        self.write(paged, staged)
        seconds, total = time.perf_counter() - start, sum(n for _, n in loaded)
        result.samples = [LoadSample(r, n, seconds * n / total, True) for r, n in loaded if n]
        return result

    def write(self, paged: PagedKV, staged: list[StagedChunk]) -> None:
        """Write ``staged`` (fetched already) into their blocks: layer by layer beside the
        forward pass where pipelined (:meth:`wait_for_layer` orders each layer's attention
        after its write), else at once. Any earlier write ends first."""
        self.finish()
        if self.pipelined:
            self._layers = submit_layer_writes(self._stream, paged, staged)
        else:
            scatter_chunks(paged, [s.index for s in staged], [s.pages for s in staged])

    def _fetch(
        self,
        paged: PagedKV,
        request: RequestIO,
        buffers: list[torch.Tensor],
        result: SyncLoadResult,
    ) -> list[StagedChunk]:
        keys = [ChunkKey(c.keys[self._rank]) for c in request.chunks]
        loaded = self._cache.get_chunks_into(keys, buffers)
        ok: list[ChunkIO] = request.chunks[:loaded]
        failed = request.chunks[loaded:]
        result.loaded_blocks += sum(len(c.block_ids) for c in ok)
        if failed:
            result.failed_blocks.update(b for c in failed for b in c.block_ids)
            result.failed_chunks += len(failed)
            result.failed_req_ids.append(request.req_id)
        return [staged_chunk(paged, c, buf) for c, buf in zip(ok, buffers, strict=False)]

    def wait_for_layer(self, layer: int) -> None:
        if layer < len(self._layers):
            self._layers[layer].before_compute()

    def finish(self) -> None:
        """Every started write is done (the staging buffers may be reused). Buffers beyond
        ``keep_chunks``, which a step with more chunks to load took, are let go."""
        for done in self._layers:
            done.wait()
        self._layers = []
        del self._staging[self._keep :]

    @property
    def staging_buffers(self) -> int:
        return len(self._staging)

    def _buffers(self, count: int) -> list[torch.Tensor]:
        while len(self._staging) < count:
            self._staging.append(torch.empty(self._shape, dtype=torch.uint8, pin_memory=self._pin))
        return self._staging[:count]


def _write_layer(paged: PagedKV, layer: int, staged: list[StagedChunk]) -> None:
    for item in staged:
        paged.scatter_layer(layer, item.index, item.pages[layer])


def submit_layer_writes(
    stream: CopyStream, paged: PagedKV, staged: list[StagedChunk]
) -> list[Completion]:
    """One write per layer on the copy stream. On GPUs the chunks cross the link in
    :data:`PIPELINE_SLABS` slabs of layers, one transfer per chunk and slab (submitted
    with the slab's first layer), and each layer is then one ``index_copy_`` on the
    device (:mod:`.transfers`); above :data:`STAGED_DEVICE_BYTES` a step's chunks cross
    a layer at a time instead, so the device holds no more than that."""
    layers = range(paged.layout.num_layers)
    nbytes = sum(s.pages.numel() for s in staged)
    if not staged or not batched_by_default(paged) or nbytes > STAGED_DEVICE_BYTES:
        return [
            stream.submit(functools.partial(_write_layer, paged, layer, staged)) for layer in layers
        ]
    indexes, pages = [s.index for s in staged], [s.pages for s in staged]
    starts = {slab.start: slab for slab in slabs(len(layers), PIPELINE_SLABS)}
    if kernels_usable(paged):
        return _submit_kernel_slabs(stream, paged, indexes, pages, starts)
    stages: list[DeviceStage] = []

    def write(layer: int, slab: range | None) -> None:
        if slab is not None:
            stages.extend(upload(paged, indexes, pages, slab))
        write_layer(paged, layer, stages)

    return [stream.submit(functools.partial(write, layer, starts.get(layer))) for layer in layers]


def _submit_kernel_slabs(
    stream: CopyStream,
    paged: PagedKV,
    indexes: list[torch.Tensor],
    pages: list[torch.Tensor],
    starts: dict[int, range],
) -> list[Completion]:
    """The kernels' way (:mod:`.paged_kernels`): at each slab's first layer, every chunk's
    layers of that slab cross in one transfer and one kernel writes them; the slab's other
    layers wait for that same completion (a submission per layer would cost more than the
    write itself)."""
    held: list[ChunkBuffer] = []  # made on the stream, at the first slab

    def write(slab: range) -> None:
        if not held:
            held.append(ChunkBuffer(paged, indexes))
        chunks = held[0]
        for i, src in enumerate(pages):
            chunks.chunk(i, slab).copy_(src[slab.start : slab.stop], non_blocking=True)
        kernel_scatter(paged, chunks.plan, chunks.words, slab)

    done: list[Completion] = []
    for layer in range(paged.layout.num_layers):
        slab = starts.get(layer)
        done.append(stream.submit(functools.partial(write, slab)) if slab else done[-1])
    return done
