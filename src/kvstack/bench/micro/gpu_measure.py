"""The timed pieces of the GPU check (:mod:`kvstack.bench.micro.gpu_check`), one request at a time.

Each function runs the connector's own worker-side code on a :class:`PagedAllocation`, or
PyTorch's own copy of the same bytes, and returns seconds (host clock, after the device has
finished the work):

- :func:`connector_d2h`: every layer's pages of the request's blocks gathered into pinned host
  staging on the copy-out stream (``LayerCopyOut``, as ``SaveQueue`` runs it: every layer at
  the end of a step, or, ``per_layer``, one submission per layer as layer pipelining makes
  them, then the end);
- :func:`connector_h2d`: staged chunks scattered into other blocks on the load stream
  (``write_chunks``, what ``AsyncLoader`` runs; ``per_layer``: ``submit_layer_writes``, what
  a layer-pipelined ``SyncLoader`` runs);
- :func:`torch_copy`: one pinned ``copy_(non_blocking=True)`` of as many bytes on a side stream;
- :func:`round_trip`: a request stored through ``SaveQueue`` into a ``KVCache`` and loaded back
  into other blocks with ``SyncLoader``; the result says whether every byte came back.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvstack.bench.micro.paged_layouts import PagedAllocation
from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.layout import PagedKV
from kvstack.integrations.vllm.loads import BATCH_CHUNKS, write_chunks
from kvstack.integrations.vllm.saves import SaveQueue
from kvstack.integrations.vllm.streams import CopyStream, make_stream
from kvstack.integrations.vllm.sync_loads import StagedChunk, SyncLoader, submit_layer_writes
from kvstack.integrations.vllm.transfers import LayerCopyOut
from kvstack.kv.cache import KVCache
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch

__all__ = [
    "PagedTransfer",
    "RoundTrip",
    "clear_blocks",
    "connector_d2h",
    "connector_h2d",
    "copy_out_work",
    "layer_load_work",
    "load_work",
    "pages_equal",
    "round_trip",
    "sync",
    "timed",
    "torch_copy",
    "with_index",
]


@dataclass
class PagedTransfer:
    """One request's blocks and the host staging the connector copies them through."""

    paged: PagedKV
    src_chunks: list[list[int]]  # block ids per chunk, where the request's KV is
    dst_chunks: list[list[int]]  # other blocks, where a load writes it
    staging: list[torch.Tensor]  # [layers, blocks_per_chunk, page] per chunk, pinned on GPUs

    @property
    def num_bytes(self) -> int:
        return sum(s.numel() for s in self.staging)

    @classmethod
    def plan(cls, alloc: PagedAllocation, num_chunks: int, blocks_per_chunk: int) -> PagedTransfer:
        """Source blocks interleaved with destination blocks, as a busy block pool hands out."""
        paged = alloc.paged
        if 2 * num_chunks * blocks_per_chunk > paged.num_blocks:
            raise ValueError(f"{paged.num_blocks} blocks cannot hold two copies of the request")
        ids = list(range(2 * num_chunks * blocks_per_chunk))
        src, dst = ids[0::2], ids[1::2]
        per = blocks_per_chunk
        pin = paged.device.type == "cuda"
        shape = paged.layout.chunk_shape(per)
        return cls(
            paged,
            [src[i * per : (i + 1) * per] for i in range(num_chunks)],
            [dst[i * per : (i + 1) * per] for i in range(num_chunks)],
            [torch.empty(shape, dtype=torch.uint8, pin_memory=pin) for _ in range(num_chunks)],
        )


def with_index(device: torch.device) -> torch.device:
    """``cuda`` as ``cuda:N`` (the current device): ``torch.cuda.set_device``, which the copy
    streams call, refuses a CUDA device without an index."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_out_work(t: PagedTransfer) -> Callable[[], None]:
    """SaveQueue's copy-out of the request at the end of a step without layer pipelining
    (``LayerCopyOut.end`` of every layer)."""
    indexes = [t.paged.block_index(ids) for ids in t.src_chunks]
    layers = list(range(t.paged.layout.num_layers))

    def copy_out() -> None:
        LayerCopyOut(t.paged, indexes, t.staging).end(layers)

    return copy_out


def load_work(t: PagedTransfer, stream: CopyStream | None = None) -> Callable[[], None]:
    """AsyncLoader's writes of staged chunks into the destination blocks: ``write_chunks`` of
    :data:`BATCH_CHUNKS` chunks at a time, each submitted to ``stream`` and waited for before
    the next (``stream`` None: all on the caller's stream, no waits)."""
    chunks = [ChunkIO(i, (b"",), ids) for i, ids in enumerate(t.dst_chunks)]
    writes = [
        functools.partial(write_chunks, t.paged, chunks[i : i + BATCH_CHUNKS],
                          t.staging[i : i + BATCH_CHUNKS])
        for i in range(0, len(chunks), BATCH_CHUNKS)
    ]  # fmt: skip

    def load() -> None:
        for write in writes:
            if stream is None:
                write()
            else:
                stream.submit(write).wait()

    return load


def layer_load_work(t: PagedTransfer, stream: CopyStream) -> Callable[[], None]:
    """A layer-pipelined SyncLoader's writes (``submit_layer_writes``: one submission per
    layer), all waited for."""
    indexes = [t.paged.block_index(ids) for ids in t.dst_chunks]

    def load_by_layer() -> None:
        staged = [StagedChunk(i, s) for i, s in zip(indexes, t.staging, strict=True)]
        for done in submit_layer_writes(stream, t.paged, staged):
            done.wait()

    return load_by_layer


def connector_d2h(t: PagedTransfer, stream: CopyStream, per_layer: bool = False) -> float:
    if not per_layer:
        work = copy_out_work(t)
        return timed(t.paged.device, lambda: stream.submit(work).wait())
    indexes = [t.paged.block_index(ids) for ids in t.src_chunks]

    def by_layer() -> None:  # as SaveQueue submits it: one per save_kv_layer, then the end
        copy_out = LayerCopyOut(t.paged, indexes, t.staging)
        for layer in range(t.paged.layout.num_layers) if not copy_out.defers_layers else ():
            stream.submit(functools.partial(copy_out.layer, layer))
        stream.submit(functools.partial(copy_out.end, [])).wait()

    return timed(t.paged.device, by_layer)


def connector_h2d(t: PagedTransfer, stream: CopyStream, per_layer: bool = False) -> float:
    work = layer_load_work(t, stream) if per_layer else load_work(t, stream)
    return timed(t.paged.device, work)


def torch_copy(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream | None) -> float:
    """PyTorch's own copy of the same bytes: pinned, non-blocking, on a side stream."""
    if stream is None:
        return timed(src.device, lambda: dst.copy_(src))

    def copy() -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        stream.synchronize()

    return timed(src.device, copy)


def clear_blocks(paged: PagedKV, blocks: list[list[int]]) -> None:
    """Zero every layer's pages of ``blocks`` (so a load that writes nothing cannot pass)."""
    index = paged.block_index([x for ids in blocks for x in ids])
    for pages in paged.pages:
        pages.index_fill_(0, index, 0)


def pages_equal(paged: PagedKV, a: list[list[int]], b: list[list[int]]) -> bool:
    """Whether every layer's pages of blocks ``a`` hold exactly the bytes of blocks ``b``."""
    ia = paged.block_index([x for ids in a for x in ids])
    ib = paged.block_index([x for ids in b for x in ids])
    return all(torch.equal(p.index_select(0, ia), p.index_select(0, ib)) for p in paged.pages)


@dataclass
class RoundTrip:
    store_s: float
    retrieve_s: float
    stored_chunks: int
    loaded_blocks: int
    byte_identical: bool


def round_trip(t: PagedTransfer, cache: KVCache, tag: str) -> RoundTrip:
    """Store the request's chunks through the connector's save path, load them into the
    destination blocks through its load path, and compare the bytes."""
    device, shape = t.paged.device, t.paged.layout.chunk_shape(len(t.src_chunks[0]))
    keys = [_key(f"{tag}-{i}") for i in range(len(t.src_chunks))]
    clear_blocks(t.paged, t.dst_chunks)
    out_stream = make_stream(device, True, "kvstack-copy-out")
    saves = SaveQueue(cache, shape, 0, out_stream, True)
    loads = SyncLoader(cache, shape, 0, make_stream(device, False, "kvstack-layers"), False)
    try:
        save = RequestIO(f"{tag}-save", _chunks(keys, t.src_chunks))
        load = RequestIO(f"{tag}-load", _chunks(keys, t.dst_chunks))
        start = time.perf_counter()
        saves.end(t.paged, 1, [save])
        published = saves.flush() and cache.flush()  # in the tier, written out
        store_s = time.perf_counter() - start
        stored = saves.take_counts().chunks if published else 0
        start = time.perf_counter()
        result = loads.start(t.paged, [load])
        loads.finish()
        sync(device)
        retrieve_s = time.perf_counter() - start
    finally:
        saves.close()
        out_stream.close()
    same = pages_equal(t.paged, t.src_chunks, t.dst_chunks)
    return RoundTrip(store_s, retrieve_s, stored, result.loaded_blocks, same)


def _chunks(keys: list[ChunkKey], blocks: list[list[int]]) -> list[ChunkIO]:
    return [ChunkIO(i, (k,), ids) for i, (k, ids) in enumerate(zip(keys, blocks, strict=True))]


def _key(text: str) -> ChunkKey:
    return ChunkKey(hashlib.blake2b(text.encode(), digest_size=16).digest())


def timed(device: torch.device, work: Callable[[], object]) -> float:
    """Host seconds from an idle device to the end of ``work``'s device work."""
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start
