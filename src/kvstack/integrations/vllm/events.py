"""kvstack tier events as vLLM KV events (``BlockStored`` / ``BlockRemoved``).

A kvstack chunk is reported as one block of ``chunk_size`` tokens whose hash is the chunk key,
with medium ``CPU`` (``cpu://``), ``DISK`` (``file://``) or the tier scheme in capitals for
shared tiers. Events from every worker rank are aggregated by vLLM; only events all ranks report
are published (a chunk is usable only when every rank holds its shard).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from vllm.distributed.kv_events import (
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
    KVEventAggregator,
)

from kvstack.kv.tiers import TierEvent

__all__ = ["ChunkInfo", "EventCollector", "KVStackKVEvents"]

MEDIUMS = {"cpu": "CPU", "file": "DISK"}
_MAX_INFO = 65536


@dataclass(frozen=True)
class ChunkInfo:
    tokens: list[int]
    parent: bytes | None
    lora_name: str | None


class KVStackKVEvents(KVConnectorKVEvents):
    def __init__(self, num_workers: int = 1) -> None:
        self._aggregator = KVEventAggregator(num_workers)

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._aggregator.add_events(events)

    def aggregate(self) -> KVStackKVEvents:
        common = self._aggregator.get_common_events()
        self._aggregator.clear_events()
        self._aggregator.add_events(common)
        self._aggregator.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._aggregator.increment_workers(count)

    def get_all_events(self) -> list[KVCacheEvent]:
        return self._aggregator.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._aggregator.get_number_of_workers()

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()


class EventCollector:
    """Turns tier events into vLLM events; tier events arrive from writer threads too."""

    def __init__(self, chunk_size: int) -> None:
        self._chunk_size = chunk_size
        self._lock = threading.Lock()
        self._events: list[KVCacheEvent] = []
        self._info: OrderedDict[bytes, ChunkInfo] = OrderedDict()

    def remember(self, key: bytes, info: ChunkInfo) -> None:
        with self._lock:
            self._info[key] = info
            while len(self._info) > _MAX_INFO:
                self._info.popitem(last=False)

    def on_tier_event(self, event: TierEvent) -> None:
        medium = MEDIUMS.get(event.tier.rstrip("0123456789"), event.tier.upper())
        with self._lock:
            if event.kind == "removed":
                self._events.append(BlockRemoved(block_hashes=[event.key], medium=medium))
                return
            info = self._info.get(event.key)
            if info is None:  # a promotion of a chunk this process never saw: no tokens to report
                return
            self._events.append(
                BlockStored(
                    block_hashes=[event.key],
                    parent_block_hash=info.parent,
                    token_ids=info.tokens,
                    block_size=self._chunk_size,
                    lora_id=None,
                    medium=medium,
                    lora_name=info.lora_name,
                )
            )

    def take(self) -> KVStackKVEvents | None:
        with self._lock:
            events, self._events = self._events, []
        if not events:
            return None
        batch = KVStackKVEvents(num_workers=1)
        batch.add_events(events)
        return batch
