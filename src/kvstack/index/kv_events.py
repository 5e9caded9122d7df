"""vLLM's KV event structs, defined once: the simulator publishes them, the router decodes them.

Wire format (vLLM's ``ZmqEventPublisher``): each message on the PUB socket is three frames,
``(topic, seq, payload)``, ``seq`` an 8-byte big-endian counter from 0 and ``payload`` a msgpack
``KVEventBatch`` — an array ``[ts, events, data_parallel_rank]`` whose events are maps tagged by
class name. A replay (ROUTER) socket answers ``(b"", start_seq)`` with every buffered
``(b"", topic, seq, payload)`` from ``start_seq`` on, then ``(b"", b"", END_SEQ, b"")``.

The structs mirror ``vllm.distributed.kv_events`` field for field and in order, so vLLM's own
classes decode what the simulator sends (a test does exactly that) and these decode what vLLM
sends. Two departures, both so that engines of other vLLM versions stay readable:

- every field is encoded, None included, where vLLM omits fields at their default: vLLM's
  decoder reads either, and a field vLLM requires is never missing;
- ``lora_id``, ``medium`` and ``lora_name``, which vLLM requires, default to None, so batches
  from a vLLM that predates them still decode; fields a newer vLLM adds are ignored.

Block hashes are 64-bit integers from vLLM and the simulator, and 16-byte chunk keys from
kvstack's connector (its kvstack tiers, media ``CPU`` / ``DISK``).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "END_SEQ",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEvent",
    "KVEventBatch",
]

ExternalBlockHash = int | bytes
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay socket's end marker
MEDIUM_GPU = "GPU"


class KVCacheEvent(msgspec.Struct, gc=False, tag=True):
    """Base of the KV events (tagged by class name, as vLLM's)."""


class BlockStored(KVCacheEvent):
    """Full blocks an engine cached, chained on ``parent_block_hash``."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks an engine evicted from ``medium``."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The engine's device cache was reset."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, gc=False):
    """One engine step's cache changes: removals first, then stores."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None
