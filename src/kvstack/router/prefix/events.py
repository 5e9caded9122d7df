"""vLLM's KV event wire format, decoded without importing vLLM.

Each ZMQ message is ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian counter, ``payload``
a msgpack ``KVEventBatch`` — an array ``[ts, events, data_parallel_rank]`` whose events are maps
tagged by class name (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``). The structs below
declare only the fields the router reads; fields a newer vLLM adds are ignored. Block hashes
are 64-bit integers from vLLM (and the simulator) and 16-byte chunk keys from kvstack's
connector (its kvstack tiers, media ``CPU`` / ``DISK``).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "decode_batch",
]

BlockHash = int | bytes
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay socket's end marker


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    extra_keys: list[Any] | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[BlockHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one payload; raises msgspec.DecodeError / ValidationError on a foreign format."""
    return _decoder.decode(payload)
