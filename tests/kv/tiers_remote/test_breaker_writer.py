"""The circuit breaker's states (with a fake clock) and the background writer's bounds."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from kvstack.errors import ConfigError
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.remote.breaker import CircuitBreaker
from kvstack.kv.tiers.writer import BackgroundWriter, CancelOutcome, QueueState, WriteJob


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    breaker = CircuitBreaker("t", failure_threshold=2, reset_after_s=5, clock=clock)
    with caplog.at_level(logging.INFO):
        assert breaker.allow()
        breaker.failure("boom")
        breaker.success()  # not consecutive
        breaker.failure("boom")
        assert breaker.state == "closed"
        breaker.failure("boom")
        assert breaker.state == "open" and not breaker.allow() and breaker.refused == 1
        for _ in range(10):
            breaker.failure("boom")  # failures while open are not new incidents
        clock.now += 5
        assert breaker.state == "half-open"
        assert breaker.allow() and not breaker.allow()  # one trial at a time
        breaker.failure("still down")
        assert breaker.state == "open" and breaker.trips == 1  # same incident
        clock.now += 5
        assert breaker.allow()
        breaker.success()
        assert breaker.state == "closed" and breaker.allow()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("circuit breaker open" in m for m in messages) == 1
    assert sum("recovered after 10.0 s" in m for m in messages) == 1


def test_a_lost_trial_report_does_not_keep_the_breaker_open() -> None:
    clock = Clock()
    breaker = CircuitBreaker("t", failure_threshold=1, reset_after_s=1, clock=clock)
    breaker.failure("x")
    clock.now += 1
    assert breaker.allow()  # the trial's caller never reports back
    assert not breaker.allow()
    clock.now += 1
    assert breaker.allow()


def test_breaker_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="threshold"):
        CircuitBreaker("t", failure_threshold=0)
    with pytest.raises(ConfigError, match="reset time"):
        CircuitBreaker("t", reset_after_s=0)


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
