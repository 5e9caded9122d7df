"""vLLM KV events from the simulated engine: vLLM's structs on vLLM's ZMQ framing.

The publisher sends one :class:`~kvstack.index.kv_events.KVEventBatch` per engine step that
changed the cache, on a PUB socket (``(topic, seq, payload)``), and keeps the last batches for
a ROUTER replay socket; :mod:`kvstack.index.kv_events` holds the structs and the framing.

One difference in timing: vLLM registers (and reports) a block when it schedules the step that
computes it; the simulator reports it when that step ends, one step later. Within a batch,
removals come before stores, as evictions happen when a step's blocks are allocated.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kvstack.index.kv_events import (
    END_SEQ,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from kvstack.sim.blocks import PoolEvent
from kvstack.sim.hashing import external_hash
from kvstack.sim.scheduler import StoredBlocks

__all__ = ["KVEventPublisher", "to_vllm_events"]

log = logging.getLogger(__name__)


def to_vllm_events(
    stored: list[StoredBlocks], pool_events: list[PoolEvent], block_size: int
) -> list[KVEvent]:
    """The step's cache changes as vLLM events: removals (evictions happen at allocation,
    before the step runs) first, then the blocks stored at its end."""
    events: list[KVEvent] = []
    for kind, block_hash in pool_events:
        if kind == "cleared":
            events.append(AllBlocksCleared())
        elif block_hash is not None:
            events.append(BlockRemoved([external_hash(block_hash)], MEDIUM_GPU, group_idx=0))
    for s in stored:
        adapter = s.request.adapter
        name = adapter.name if adapter else None
        first = s.first_block
        extra: list[tuple[Any, ...] | None] = [
            _event_extra_keys(name, s.request.cache_salt, i)
            for i in range(first, first + len(s.block_hashes))
        ]
        events.append(
            BlockStored(
                block_hashes=[external_hash(h) for h in s.block_hashes],
                parent_block_hash=None
                if s.parent_block_hash is None
                else external_hash(s.parent_block_hash),
                token_ids=s.token_ids,
                block_size=block_size,
                lora_id=adapter.int_id if adapter else None,
                medium=MEDIUM_GPU,
                lora_name=adapter.name if adapter else None,
                extra_keys=extra,
                group_idx=0,
                kv_cache_spec_kind="full_attention",
            )
        )
    return events


def _event_extra_keys(
    lora_name: str | None, salt: str | None, index: int
) -> tuple[Any, ...] | None:
    """vLLM publishes extra keys untagged: the LoRA name, then the salt on block 0."""
    keys: list[Any] = []
    if lora_name is not None:
        keys.append(lora_name)
    if salt and index == 0:
        keys.append(salt)
    return tuple(keys) if keys else None


class KVEventPublisher:
    """PUB socket plus an optional ROUTER replay socket, driven from the event loop."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10000,
        data_parallel_rank: int = 0,
    ) -> None:
        # PUB sends never block (NOBLOCK, drops at the high-water mark): a plain socket;
        # the replay socket is awaited in the event loop.
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.set_hwm(100_000)
        _bind_or_connect(self._pub, endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if replay_endpoint:
            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
        self._topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._rank = data_parallel_rank
        self._encoder = msgspec.msgpack.Encoder()
        self.endpoint = endpoint

    def publish(self, events: list[KVEvent]) -> None:
        if not events:
            return
        payload = self._encoder.encode(KVEventBatch(time.time(), events, self._rank))
        seq = self._seq
        self._seq += 1
        try:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)
        except zmq.Again:  # high-water mark: subscribers are behind; replay can fill the gap
            log.warning("KV event batch %d dropped at the high-water mark", seq)
        self._buffer.append((seq, payload))

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled."""
        if self._replay is None:
            return
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV event replay request with %d frames", len(frames))
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await self._replay.send_multipart(
                        (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                    )
            await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


def _bind_or_connect(sock: zmq.Socket[bytes], endpoint: str) -> None:
    """Bind wildcard and ipc/inproc endpoints, connect to the rest (vLLM's rule)."""
    if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
