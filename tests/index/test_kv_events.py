"""vLLM's KV event structs, defined once: what the simulator sends vLLM reads, and what engines
of other vLLM versions send the router reads."""

from __future__ import annotations

import msgspec
import pytest

from kvstack.index.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def test_a_batch_from_a_vllm_without_lora_and_medium_fields_decodes() -> None:
    older = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
             "token_ids": [1, 2, 3, 4], "block_size": 4}  # fmt: skip
    newer = {"type": "BlockRemoved", "block_hashes": [b"k" * 16], "medium": "CPU", "new": 1}
    events = [older, newer, {"type": "AllBlocksCleared"}]
    batch = DECODER.decode(msgspec.msgpack.encode([1.5, events]))
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [7]
    assert (stored.lora_id, stored.medium, stored.lora_name) == (None, None, None)
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [b"k" * 16]
    assert isinstance(cleared, AllBlocksCleared) and batch.data_parallel_rank is None


def test_every_field_is_sent_and_vllm_decodes_it() -> None:
    vllm_events = pytest.importorskip("vllm.distributed.kv_events")
    ours = KVEventBatch(2.0, [BlockStored([1, 2], None, list(range(8)), 4), BlockRemoved([1])], 0)
    payload = msgspec.msgpack.encode(ours)
    fields = msgspec.msgpack.decode(payload)[1][0]
    assert {"lora_id", "medium", "lora_name"} <= fields.keys()  # vLLM requires them
    theirs = msgspec.msgpack.Decoder(vllm_events.KVEventBatch).decode(payload)
    stored, removed = theirs.events
    assert isinstance(stored, vllm_events.BlockStored) and stored.token_ids == list(range(8))
    assert stored.block_hashes == [1, 2] and stored.lora_name is None
    assert isinstance(removed, vllm_events.BlockRemoved) and removed.block_hashes == [1]
    assert DECODER.decode(payload) == ours


def test_vllm_batches_decode_field_for_field() -> None:
    vllm_events = pytest.importorskip("vllm.distributed.kv_events")
    stored = vllm_events.BlockStored(
        block_hashes=[3], parent_block_hash=2, token_ids=[5, 6], block_size=2, lora_id=1,
        medium="GPU", lora_name="a1", extra_keys=[("a1",)], group_idx=0,
    )  # fmt: skip
    payload = msgspec.msgpack.encode(vllm_events.KVEventBatch(3.0, [stored], 1))
    (ours,) = DECODER.decode(payload).events
    assert ours == BlockStored(
        [3], 2, [5, 6], 2, lora_id=1, medium="GPU", lora_name="a1", extra_keys=[("a1",)],
        group_idx=0,
    )  # fmt: skip
