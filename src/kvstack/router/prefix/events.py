"""vLLM's KV event wire format, decoded without importing vLLM.

Each ZMQ message is ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian counter, ``payload``
a msgpack ``KVEventBatch``. The structs are :mod:`kvstack.index.kv_events`' (the ones the
simulator publishes), re-exported here with the decoder the router's subscribers use; fields a
newer vLLM adds are ignored, and the fields an older one lacks read as None.
"""

from __future__ import annotations

import msgspec

from kvstack.index.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
    KVEventBatch,
)

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "decode_batch",
]

BlockHash = ExternalBlockHash  # the router's name: an engine's int or a connector's chunk key

_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one payload; raises msgspec.DecodeError / ValidationError on a foreign format."""
    return _decoder.decode(payload)
