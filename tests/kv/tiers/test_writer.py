"""The background writer: bounds, batches, reads of queued chunks, cancellation, failures."""

from __future__ import annotations

import threading

import torch

from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.writer import BackgroundWriter, CancelOutcome, QueueState, WriteJob


def key(i: int) -> ChunkKey:
    return ChunkKey(i.to_bytes(16, "little"))


def test_writer_bounds_batches_and_serves_queued_chunks() -> None:
    gate = threading.Event()
    written: list[list[ChunkKey]] = []

    def write(jobs: list[WriteJob]) -> None:
        gate.wait()
        written.append([job.key for job in jobs])

    writer = BackgroundWriter("t", write, max_chunks=3, max_bytes=1 << 20, max_batch=2)
    chunk = torch.ones(16)
    assert writer.submit(key(0), chunk)
    assert writer.submit(key(1), chunk) and writer.submit(key(2), chunk)
    assert writer.submit(key(1), chunk)  # already queued: accepted, not duplicated
    assert not writer.submit(key(3), chunk)  # full
    assert writer.queued_chunk(key(2)) is chunk and writer.queued_chunk(key(3)) is None
    assert not writer.flush(timeout_s=0.05)
    gate.set()
    assert writer.flush(timeout_s=5)
    assert sorted(k for batch in written for k in batch) == [key(0), key(1), key(2)]
    assert all(len(batch) <= 2 for batch in written)
    assert writer.queued_chunk(key(0)) is None and writer.num_queued == 0
    big = torch.ones(1 << 18)  # 1 MiB
    assert writer.submit(key(4), big)  # one oversized chunk fits an empty queue
    writer.close()
    assert not writer.submit(key(5), chunk)  # closed


def test_writer_survives_a_failing_batch() -> None:
    calls: list[int] = []

    def write(jobs: list[WriteJob]) -> None:
        calls.append(len(jobs))
        if len(calls) == 1:
            raise RuntimeError("bug in one batch")

    writer = BackgroundWriter("t", write, max_chunks=8, max_batch=1)
    writer.submit(key(0), torch.ones(4))
    assert writer.flush(5)
    writer.submit(key(1), torch.ones(4))
    assert writer.flush(5) and calls == [1, 1]
    writer.close()


def test_a_chunk_cancelled_while_being_written_is_invisible_until_put_again() -> None:
    entered, gate = threading.Event(), threading.Event()

    def write(jobs: list[WriteJob]) -> None:
        entered.set()
        gate.wait(30)

    writer = BackgroundWriter("t", write, max_chunks=4, max_batch=1)
    chunk = torch.ones(4)
    assert writer.submit(key(0), chunk) and entered.wait(10)
    assert writer.submit(key(1), chunk)
    assert writer.cancel(key(1)) is CancelOutcome.DEQUEUED and not writer.pending(key(1))
    assert writer.cancel(key(0)) is CancelOutcome.WRITING
    assert writer.queued_chunk(key(0)) is None and writer.is_cancelled(key(0))
    assert writer.submit(key(0), chunk)  # put again while the first write is in flight
    assert writer.queued_chunk(key(0)) is chunk and not writer.is_cancelled(key(0))
    assert writer.cancel(key(2)) is CancelOutcome.ABSENT
    gate.set()
    assert writer.flush(timeout_s=5) and writer.state() == QueueState(0, 0, 0)
    writer.close()
