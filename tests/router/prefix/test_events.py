"""KV events into the router's tree: block placement from tokens and parents, removals,
clears, format checks; and the ZMQ subscription (gaps, replay, loss) against the simulator's
real publisher on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from kvstack.index import kv_events
from kvstack.index.radix import Owner, RadixIndex, RadixNamespace
from kvstack.router.prefix.blocks import BlockTracker, EventFormatError
from kvstack.router.prefix.events import KVEventBatch, decode_batch
from kvstack.router.prefix.subscriber import EventStream
from kvstack.sim.events import KVEventPublisher
from kvstack.stack.ports import free_port
from tests.router.conftest import until

NS = RadixNamespace("m")
GPU, CPU = Owner("b", "gpu"), Owner("b", "cpu")


def wire(*events: Any) -> KVEventBatch:
    """Encode as the simulator publishes (vLLM's format) and decode as the router does."""
    return decode_batch(msgspec.msgpack.encode(kv_events.KVEventBatch(0.0, list(events))))


def stored(hashes: list[Any], parent: Any, tokens: list[int], medium: str = "GPU") -> Any:
    return kv_events.BlockStored(hashes, parent, tokens, 4, None, medium, None)


def tracker(page: int = 4) -> BlockTracker:
    return BlockTracker("b", RadixIndex(page_size=page), lambda: ["m"])


def test_blocks_are_placed_from_tokens_and_parents() -> None:
    t = tracker()
    t.apply(wire(stored([11, 12], None, list(range(8)))))
    t.apply(wire(stored([13], 12, [8, 9, 10, 11])))  # continues block 12
    t.apply(wire(stored([21], 11, [50, 51, 52, 53])))  # branches after block 11
    prompt = list(range(12))
    assert t.index.match(NS, prompt).tokens(GPU) == 12
    assert t.index.match(NS, [0, 1, 2, 3, 50, 51, 52, 53]).tokens(GPU) == 8
    t.apply(wire(kv_events.BlockRemoved([12], "GPU")))  # block 12 and what follows it go
    assert t.index.match(NS, prompt).tokens(GPU) == 4
    assert t.index.match(NS, [0, 1, 2, 3, 50, 51, 52, 53]).tokens(GPU) == 8
    t.index.check_integrity()


def test_kvstack_tiers_and_clears() -> None:
    t = tracker()
    key0, key1 = b"k" * 16, b"l" * 16  # kvstack chunk keys are bytes
    t.apply(wire(stored([key0, key1], None, list(range(8)), medium="CPU")))
    t.apply(wire(stored([1, 2], None, list(range(8)))))
    assert t.index.match(NS, list(range(8))).matched == {CPU: 8, GPU: 8}
    # The device cache was reset; kvstack's CPU tier wasn't.
    t.apply(wire(kv_events.AllBlocksCleared()))
    assert t.index.match(NS, list(range(8))).matched == {CPU: 8}
    t.index.check_integrity()


def test_orphans_are_counted_not_placed() -> None:
    t = tracker()
    t.apply(wire(stored([5], 4, [1, 2, 3, 4])))  # parent 4 was stored before we listened
    assert t.stats.orphans == 1 and t.index.num_tokens == 0


def test_format_problems_are_named() -> None:
    with pytest.raises(EventFormatError, match="page size"):
        tracker(page=16).apply(wire(stored([1], None, [1, 2, 3, 4])))
    with pytest.raises(EventFormatError, match="token ids are required"):
        short_tokens = kv_events.BlockStored([1, 2], None, [1, 2, 3, 4], 4, None, "GPU", None)
        tracker().apply(wire(short_tokens))


class Sink:
    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []
        self.log: list[tuple[str, object]] = []

    def started(self, backend_id: str, complete: bool) -> None:
        self.log.append(("started", complete))

    def batch(self, backend_id: str, batch: KVEventBatch) -> None:
        self.batches.append(batch)

    def lost(self, backend_id: str, reason: str) -> None:
        self.log.append(("lost", reason))

    def invalid(self, backend_id: str, reason: str) -> None:
        self.log.append(("invalid", reason))


def drop(publisher: KVEventPublisher, events: list[Any]) -> None:
    """A batch the subscriber never sees (kept for replay), as at a high-water mark."""
    payload = msgspec.msgpack.encode(kv_events.KVEventBatch(0.0, events))
    publisher._buffer.append((publisher._seq, payload))
    publisher._seq += 1


async def test_stream_replays_gaps_and_reports_losses() -> None:
    port, replay = free_port(), free_port()
    publisher = KVEventPublisher(f"tcp://*:{port}", f"tcp://127.0.0.1:{replay}")
    replay_task = asyncio.create_task(publisher.serve_replay())
    sink = Sink()
    stream = EventStream("b", f"tcp://127.0.0.1:{port}", sink, f"tcp://127.0.0.1:{replay}")
    task = asyncio.create_task(stream.run())
    try:
        # The subscription takes a moment to reach the publisher: batches sent before it
        # are missed, and the replay socket supplies them (history complete from seq 0).
        while not sink.batches:
            publisher.publish([stored([len(sink.batches)], None, [1, 2, 3, 4])])
            await asyncio.sleep(0.02)
        await until(lambda: ("started", True) in sink.log)
        before = len(sink.batches)
        drop(publisher, [stored([99], None, [9, 9, 9, 9])])
        publisher.publish([stored([100], None, [1, 1, 1, 1])])
        await until(lambda: len(sink.batches) == before + 2)  # the dropped one came by replay
        assert [e.block_hashes for e in sink.batches[-2].events] == [[99]]
        assert not any(kind == "lost" for kind, _ in sink.log)
        publisher._seq += 1  # a batch lost for good: not even in the replay buffer
        publisher.publish([stored([8], None, [8, 8, 8, 8])])
        await until(lambda: any(kind == "lost" for kind, _ in sink.log))
        assert stream.num_gaps == 2
    finally:
        task.cancel()
        replay_task.cancel()
        await asyncio.gather(task, replay_task, return_exceptions=True)
        publisher.close()


async def test_stream_without_replay_starts_incomplete_after_missing_the_start() -> None:
    port = free_port()
    publisher = KVEventPublisher(f"tcp://*:{port}")
    publisher._seq = 5  # the engine published before the router subscribed
    sink = Sink()
    task = asyncio.create_task(EventStream("b", f"tcp://127.0.0.1:{port}", sink).run())
    try:
        while not sink.batches:
            publisher.publish([stored([1], None, [1, 2, 3, 4])])
            await asyncio.sleep(0.02)
        assert sink.log[0] == ("started", False)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        publisher.close()
