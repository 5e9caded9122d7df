"""The batched copies GPUs use (few transfers per request), checked byte for byte on CPU tensors
against the per-layer, per-chunk copies the CPU build keeps, and through the connector's own
save and load paths with the batched path forced."""

from __future__ import annotations

import pytest
import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm import sync_loads, transfers
from kvstack.integrations.vllm.saves import SaveQueue
from kvstack.integrations.vllm.streams import InlineStream, ThreadStream
from kvstack.integrations.vllm.sync_loads import SyncLoader
from kvstack.integrations.vllm.transfers import (
    gather_chunks,
    scatter_chunks,
    slabs,
    upload,
    write_layer,
)
from kvstack.kv.keys import ChunkKey
from tests.integrations.vllm.paged import BLOCKS, LAYERS, PAGE, PER_CHUNK, SHAPE, cache, paged_kv

# chunk block ids: scattered, one partial chunk (a single block), in a busy pool's order
CHUNKS = [[9, 2], [5], [14, 0], [7, 11]]


def random_paged() -> tuple[object, torch.Tensor]:
    paged, memory = paged_kv()
    memory.copy_(torch.randint(0, 256, memory.shape, dtype=torch.uint8))
    return paged, memory


def staging() -> list[torch.Tensor]:
    return [torch.zeros(LAYERS, len(ids), PAGE, dtype=torch.uint8) for ids in CHUNKS]


@pytest.mark.parametrize("layers", [range(LAYERS), [1], [0, 2], [2, 0, 1]])
@pytest.mark.parametrize("group_bytes", [1, transfers.GROUP_BYTES])
def test_batched_gather_copies_exactly_what_the_per_layer_gather_copies(
    layers: list[int], group_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfers, "GROUP_BYTES", group_bytes)  # 1: a group per chunk
    paged, memory = random_paged()
    indexes = [paged.block_index(ids) for ids in CHUNKS]  # type: ignore[attr-defined]
    plain, batched = staging(), staging()
    gather_chunks(paged, list(layers), indexes, plain, batched=False)  # type: ignore[arg-type]
    gather_chunks(paged, list(layers), indexes, batched, batched=True)  # type: ignore[arg-type]
    for ids, a, b in zip(CHUNKS, plain, batched, strict=True):
        assert torch.equal(a, b)
        for layer in range(LAYERS):
            want = memory[layer, ids] if layer in layers else torch.zeros_like(a[layer])
            assert torch.equal(b[layer], want)


@pytest.mark.parametrize("group_bytes", [1, transfers.GROUP_BYTES])
def test_batched_scatter_writes_exactly_the_staged_pages_and_nothing_else(
    group_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfers, "GROUP_BYTES", group_bytes)
    paged, memory = paged_kv()
    before = memory.clone()
    srcs = [torch.randint(0, 256, (LAYERS, len(ids), PAGE), dtype=torch.uint8) for ids in CHUNKS]
    indexes = [paged.block_index(ids) for ids in CHUNKS]
    scatter_chunks(paged, indexes, srcs, batched=True)
    written = {b for ids in CHUNKS for b in ids}
    for ids, src in zip(CHUNKS, srcs, strict=True):
        for layer in range(LAYERS):
            assert torch.equal(memory[layer, ids], src[layer])
    untouched = [b for b in range(BLOCKS) if b not in written]
    assert torch.equal(memory[:, untouched], before[:, untouched])


def test_layers_uploaded_in_slabs_are_written_one_layer_at_a_time() -> None:
    paged, memory = paged_kv()
    srcs = [torch.randint(0, 256, (LAYERS, len(ids), PAGE), dtype=torch.uint8) for ids in CHUNKS]
    indexes = [paged.block_index(ids) for ids in CHUNKS]
    assert slabs(LAYERS, 2) == [range(0, 1), range(1, 3)]
    assert slabs(2, 4) == [range(0, 1), range(1, 2)]
    stages = upload(paged, indexes, srcs, range(0, 1))
    write_layer(paged, 0, stages)
    write_layer(paged, 1, stages)  # not uploaded yet: nothing written
    assert torch.equal(memory[0, CHUNKS[0]], srcs[0][0])
    assert not memory[1].any()
    stages += upload(paged, indexes, srcs, range(1, 3))
    for layer in (1, 2):
        write_layer(paged, layer, stages)
    for ids, src in zip(CHUNKS, srcs, strict=True):
        assert torch.equal(memory[:, ids], src)


@pytest.mark.parametrize("pipelined", [False, True])
def test_the_connector_round_trips_through_the_batched_path(
    pipelined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SaveQueue's copy-out and SyncLoader's writes, with the GPU's batched copies forced."""
    monkeypatch.setattr(transfers, "batched_by_default", lambda paged: True)
    monkeypatch.setattr(sync_loads, "batched_by_default", lambda paged: True)
    paged, memory = random_paged()
    src_ids, dst_ids = [[9, 2], [5, 14]], [[0, 7], [11, 3]]
    assert len(src_ids[0]) == PER_CHUNK
    keys = [ChunkKey(bytes([i + 1]) * 16) for i in range(2)]
    kv = cache()
    stream = ThreadStream("test-copy") if pipelined else InlineStream()
    queue = SaveQueue(kv, SHAPE, 0, stream, True)
    loader = SyncLoader(kv, SHAPE, 0, stream, pipelined)
    try:
        chunks = [ChunkIO(i, (keys[i],), ids) for i, ids in enumerate(src_ids)]
        for layer in range(LAYERS) if pipelined else ():
            queue.layer(paged, 1, [RequestIO("save", chunks)], layer)
        queue.end(paged, 1, [RequestIO("save", chunks)])
        assert queue.flush()
        assert queue.take_counts().chunks == 2
        load = [ChunkIO(i, (keys[i],), ids) for i, ids in enumerate(dst_ids)]
        result = loader.start(paged, [RequestIO("load", load)])
        for layer in range(LAYERS):
            loader.wait_for_layer(layer)
        loader.finish()
        assert result.loaded_blocks == 4
        for src, dst in zip(src_ids, dst_ids, strict=True):
            assert torch.equal(memory[:, dst], memory[:, src])
    finally:
        queue.close()
        stream.close()
        kv.close()


@pytest.mark.parametrize("device_bytes", [0, transfers.STAGED_DEVICE_BYTES])
@pytest.mark.parametrize("pipelined", [False, True])
def test_a_layer_pipelined_copy_out_ends_with_every_layer_of_every_chunk(
    device_bytes: int, pipelined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LayerCopyOut with the GPU's batching forced: layers gathered on the "device" as they
    come (or, above the bound, straight to the host), every chunk whole after ``end``."""
    monkeypatch.setattr(transfers, "batched_by_default", lambda paged: True)
    monkeypatch.setattr(transfers, "STAGED_DEVICE_BYTES", device_bytes)
    paged, memory = random_paged()
    indexes = [paged.block_index(ids) for ids in CHUNKS]  # type: ignore[attr-defined]
    outs = staging()
    copy_out = transfers.LayerCopyOut(paged, indexes, outs)  # type: ignore[arg-type]
    assert copy_out.on_device == bool(device_bytes)
    done = [1] if pipelined else []
    for layer in done:
        copy_out.layer(layer)
    copy_out.end([layer for layer in range(LAYERS) if layer not in done])
    for ids, out in zip(CHUNKS, outs, strict=True):
        assert torch.equal(out, memory[:, ids])
