"""The paged KV kernels (:mod:`kvstack.integrations.vllm.paged_kernels`) in Triton's
interpreter on CPU tensors, through the connector's own copy paths with the GPU's batching
forced. Run by ``test_paged_kernels.py`` in a process with ``TRITON_INTERPRET=1`` (Triton reads
it when its kernels are defined); not collected on its own."""

from __future__ import annotations

import os

import pytest
import torch

from kvstack.bench.micro.paged_layouts import LAYOUTS, PagedShape, build_paged
from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm import paged_kernels, sync_loads, transfers
from kvstack.integrations.vllm.saves import SaveQueue
from kvstack.integrations.vllm.streams import InlineStream, ThreadStream
from kvstack.integrations.vllm.sync_loads import StagedChunk, SyncLoader, submit_layer_writes
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey

assert os.environ.get("TRITON_INTERPRET") == "1", "run by test_paged_kernels.py"

SHAPE = PagedShape("tiny", 5, 2, 8, 4, torch.bfloat16)
CHUNKS = [[9, 2], [5], [14, 0]]  # scattered, one partial chunk
DESTS = [[1, 4], [6], [7, 8]]


DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


@pytest.fixture(params=[(lay, dt) for lay in LAYOUTS for dt in DTYPES],
                ids=lambda p: f"{p[0]}-{str(p[1])[6:]}")  # fmt: skip
def paged(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(transfers, "batched_by_default", lambda paged: True)
    monkeypatch.setattr(sync_loads, "batched_by_default", lambda paged: True)
    layout, dtype = request.param
    alloc = build_paged(SHAPE._replace(dtype=dtype), layout, 20, torch.device("cpu"), seed=3)
    assert paged_kernels.kernels_usable(alloc.paged)
    return alloc.paged


def staging(paged, chunks: list[list[int]]) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    page = paged.layout.page_bytes
    return [torch.zeros(SHAPE.num_layers, len(c), page, dtype=torch.uint8) for c in chunks]


def pages_of(paged, blocks: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return torch.stack([p[blocks] for p in paged.pages])


def test_one_kernel_gathers_every_layer_of_every_chunk(paged) -> None:  # type: ignore[no-untyped-def]
    indexes = [paged.block_index(c) for c in CHUNKS]
    outs = staging(paged, CHUNKS)
    copy_out = transfers.LayerCopyOut(paged, indexes, outs)
    assert copy_out.defers_layers
    copy_out.layer(0)  # deferred: nothing copied yet
    assert not any(o.any() for o in outs)
    copy_out.end([1, 2, 3, 4])
    for c, out in zip(CHUNKS, outs, strict=True):
        assert torch.equal(out, pages_of(paged, c))


def test_one_kernel_writes_every_layer_and_nothing_else(paged) -> None:  # type: ignore[no-untyped-def]
    srcs = [torch.randint_like(s, 0, 256) for s in staging(paged, DESTS)]
    before = [p.clone() for p in paged.pages]
    transfers.scatter_chunks(paged, [paged.block_index(c) for c in DESTS], srcs)
    written = {b for c in DESTS for b in c}
    for c, src in zip(DESTS, srcs, strict=True):
        assert torch.equal(pages_of(paged, c), src)
    rest = [b for b in range(20) if b not in written]
    for p, b in zip(paged.pages, before, strict=True):
        assert torch.equal(p[rest], b[rest])


def test_layer_pipelined_writes_land_by_slab(paged) -> None:  # type: ignore[no-untyped-def]
    srcs = [pages_of(paged, c).clone() for c in CHUNKS]
    staged = [StagedChunk(paged.block_index(d), s) for d, s in zip(DESTS, srcs, strict=True)]
    stream = ThreadStream("test-layers")
    try:
        done = submit_layer_writes(stream, paged, staged)
        assert len(done) == SHAPE.num_layers
        for d in done:
            d.wait()
    finally:
        stream.close()
    for c, d in zip(CHUNKS, DESTS, strict=True):
        assert torch.equal(pages_of(paged, d), pages_of(paged, c))


def test_a_wrong_plan_moves_the_wrong_bytes(paged) -> None:  # type: ignore[no-untyped-def]
    """The byte comparisons above can fail: a plan shifted by one block gathers other pages."""
    plan = paged_kernels.plan_chunks(paged, [paged.block_index([b + 1 for b in CHUNKS[0]])])
    buffer = paged_kernels.ChunkBuffer(paged, [paged.block_index(CHUNKS[0])])
    paged_kernels.gather(paged, plan, buffer.words, range(SHAPE.num_layers))
    assert not torch.equal(buffer.chunk(0), pages_of(paged, CHUNKS[0]))


def test_the_connector_round_trips_through_the_kernels(paged) -> None:  # type: ignore[no-untyped-def]
    page_chunk = (SHAPE.num_layers, 2, paged.layout.page_bytes)
    kv = KVCache(KVConfig(model="test", chunk_size=8, tiers=["cpu://?size=4MiB"]))
    keys = [ChunkKey(bytes([i + 1]) * 16) for i in range(2)]
    src, dst = [[9, 2], [5, 14]], [[0, 7], [11, 3]]
    queue = SaveQueue(kv, page_chunk, 0, InlineStream(), True)
    stream = ThreadStream("test-load")
    loader = SyncLoader(kv, page_chunk, 0, stream, True)
    try:
        saves = [ChunkIO(i, (keys[i],), ids) for i, ids in enumerate(src)]
        for layer in range(SHAPE.num_layers):
            queue.layer(paged, 1, [RequestIO("save", saves)], layer)
        queue.end(paged, 1, [RequestIO("save", saves)])
        assert queue.flush() and queue.take_counts().chunks == 2
        loads = [ChunkIO(i, (keys[i],), ids) for i, ids in enumerate(dst)]
        assert loader.start(paged, [RequestIO("load", loads)]).loaded_blocks == 4
        loader.finish()
    finally:
        queue.close()
        stream.close()
        kv.close()
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(pages_of(paged, d), pages_of(paged, s))


def test_the_kernels_can_be_turned_off(paged, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KVSTACK_PAGED_KERNELS", "0")
    assert not paged_kernels.kernels_usable(paged)
    copy_out = transfers.LayerCopyOut(
        paged, [paged.block_index(CHUNKS[0])], staging(paged, CHUNKS[:1])
    )
    assert not copy_out.defers_layers  # the PyTorch path, layer by layer
