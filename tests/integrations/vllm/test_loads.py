"""Asynchronous loads on CPU tensors: whole blocks or reported failures, never half, never late."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.loads import AsyncLoader, FinishedLoads
from kvstack.integrations.vllm.streams import Completion, InlineStream, ThreadStream
from kvstack.kv.cache import KVCache
from kvstack.kv.keys import ChunkKey
from tests.integrations.vllm.paged import (
    SHAPE,
    CountingCache,
    StalledCache,
    cache,
    chunk_of,
    paged_kv,
)

KEYS = [ChunkKey(bytes([i]) * 16) for i in range(4)]


def request(block_ids: Sequence[Sequence[int]], req_id: str = "r1") -> RequestIO:
    chunks = [ChunkIO(i, (KEYS[i],), list(ids)) for i, ids in enumerate(block_ids)]
    return RequestIO(req_id, chunks)


def wait_finished(loader: AsyncLoader, timeout_s: float = 10.0) -> FinishedLoads:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        finished = loader.take_finished()
        if finished.req_ids:
            return finished
        time.sleep(0.005)
    raise AssertionError("the load never finished")


@pytest.fixture
def kv() -> Iterator[KVCache]:
    store = cache()
    yield store
    store.close()


def make_loader(kv: KVCache, timeout_s: float = 10.0) -> tuple[AsyncLoader, torch.Tensor]:
    paged, memory = paged_kv()
    loader = AsyncLoader(kv, SHAPE, 0, lambda: paged, InlineStream(), 2, timeout_s, 1)
    return loader, memory


def test_a_load_reported_by_a_step_that_began_before_it_finished_counts_its_fetch(
    kv: KVCache,
) -> None:
    kv.put_chunks(KEYS[:1], [chunk_of(1)])
    loader, _ = make_loader(kv)
    step_began = time.monotonic()  # the step reads the clock, then the thread finishes
    loader.submit(request([[5, 9]]))
    deadline = time.monotonic() + 10
    while not (finished := loader.take_finished(now=step_began)).req_ids:
        assert time.monotonic() < deadline, "the load never finished"
        time.sleep(0.005)
    assert finished.seconds[0] >= finished.fetch_seconds[0] > 0


def test_an_async_load_writes_every_block_and_is_reported_once(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    loader, memory = make_loader(kv)
    loader.submit(request([[5, 9], [3, 4]]))
    finished = wait_finished(loader)
    assert finished.req_ids == {"r1"} and not finished.failed_blocks
    assert finished.loaded_blocks == 4 and len(finished.seconds) == 1
    assert len(finished.fetch_seconds) == 1 and finished.fetch_seconds[0] <= finished.seconds[0]
    assert torch.equal(memory[:, [5, 9]], chunk_of(1))
    assert torch.equal(memory[:, [3, 4]], chunk_of(2))
    assert loader.take_finished().req_ids == set() and loader.num_pending == 0
    loader.close()


def test_a_missing_chunk_fails_its_blocks_and_every_later_one(kv: KVCache) -> None:
    kv.put_chunks([KEYS[0], KEYS[2]], [chunk_of(1), chunk_of(3)])  # chunk 1 is missing
    loader, memory = make_loader(kv)
    loader.submit(request([[0, 1], [2, 3], [4, 5]]))
    finished = wait_finished(loader)
    assert finished.failed_blocks == {2, 3, 4, 5} and finished.failed_chunks == 2
    assert torch.equal(memory[:, [0, 1]], chunk_of(1))
    assert int(memory[:, [2, 3, 4, 5]].sum()) == 0  # nothing written past the first failure
    loader.close()


def test_a_timed_out_load_is_reported_and_never_written_afterwards(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    gate = StalledCache(kv, KEYS[1])
    paged, memory = paged_kv()
    loader = AsyncLoader(gate, SHAPE, 0, lambda: paged, InlineStream(), 1, 0.2, 1)  # type: ignore[arg-type]
    loader.submit(request([[0, 1], [2, 3]]))
    assert gate.entered.wait(5)  # chunk 0 written, the read of chunk 1 hangs
    finished = wait_finished(loader)
    assert finished.timeouts == 1 and finished.failed_blocks == {2, 3}
    assert finished.fetch_seconds == []  # the thread was not done: no fetch time to report
    gate.release.set()  # the tier answers after all
    time.sleep(0.2)
    assert torch.equal(memory[:, [0, 1]], chunk_of(1))
    assert int(memory[:, [2, 3]].sum()) == 0, "a late answer was written into recomputed blocks"
    assert loader.take_finished().req_ids == set()
    loader.close()


def test_an_empty_load_finishes_at_once(kv: KVCache) -> None:
    loader, _ = make_loader(kv)
    loader.submit(RequestIO("aborted", []))  # the request was aborted before its load began
    assert wait_finished(loader).req_ids == {"aborted"}
    loader.close()


def test_a_load_fetches_at_once_and_writes_only_once_let(kv: KVCache) -> None:
    """Started at the step's metadata, a load reads its chunks before the step begins but writes
    nothing into the paged blocks until its ``go`` is set."""
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    counting = CountingCache(kv)
    paged, memory = paged_kv()
    loader = AsyncLoader(counting, SHAPE, 0, lambda: paged, InlineStream(), 1, 10.0, 1)  # type: ignore[arg-type]
    go = threading.Event()
    loader.submit(request([[5, 9], [3, 4]]), go)
    assert counting.first.wait(5)  # fetching before the step
    time.sleep(0.1)
    assert int(memory.sum()) == 0, "a load wrote before it was let"
    assert loader.take_finished().req_ids == set()
    go.set()
    finished = wait_finished(loader)
    assert finished.req_ids == {"r1"} and not finished.failed_blocks and counting.read == 2
    assert torch.equal(memory[:, [5, 9]], chunk_of(1))
    assert torch.equal(memory[:, [3, 4]], chunk_of(2))
    loader.close()


def test_a_load_never_let_write_fails_at_its_deadline_and_writes_nothing(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:1], [chunk_of(1)])
    paged, memory = paged_kv()
    loader = AsyncLoader(kv, SHAPE, 0, lambda: paged, InlineStream(), 1, 0.2, 1)
    go = threading.Event()
    loader.submit(request([[0, 1]]), go)
    finished = wait_finished(loader)
    assert finished.failed_blocks == {0, 1} and finished.failed_chunks == 1
    go.set()  # too late: the job was reported failed, vLLM recomputes the blocks
    time.sleep(0.2)
    assert int(memory.sum()) == 0
    loader.close()


class _HeldStream:
    """A background copy stream whose writes each wait until released (a slow write)."""

    def __init__(self, fail: bool = False) -> None:
        self.stream = ThreadStream("held")
        self.started, self.release = threading.Semaphore(0), threading.Semaphore(0)
        self.fail = fail

    def submit(self, work: Callable[[], None]) -> Completion:
        def held() -> None:
            self.started.release()
            assert self.release.acquire(timeout=10)
            if self.fail:
                raise RuntimeError("injected write failure")
            work()

        return self.stream.submit(held)

    def close(self) -> None:
        self.stream.close()


def test_a_load_fetches_the_next_chunks_while_the_last_ones_are_written(kv: KVCache) -> None:
    """Double buffering: the read of batch 2 does not wait for batch 1's write, and nothing is
    counted loaded before its write is whole."""
    kv.put_chunks(KEYS[:3], [chunk_of(1), chunk_of(2), chunk_of(3)])
    counting, stream = CountingCache(kv), _HeldStream()
    paged, memory = paged_kv()
    loader = AsyncLoader(counting, SHAPE, 0, lambda: paged, stream, 1, 10.0, 1)  # type: ignore[arg-type]
    loader.submit(request([[0, 1], [2, 3], [4, 5]]))
    assert stream.started.acquire(timeout=5)  # chunk 0's write is held
    deadline = time.monotonic() + 5
    while counting.read < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert counting.read == 2, "the next chunk was not fetched while the last one was written"
    assert counting.read < 3  # its buffers are still being written: no third read yet
    assert loader.take_finished().req_ids == set()
    for _ in range(3):
        stream.release.release()
    finished = wait_finished(loader)
    assert not finished.failed_blocks and finished.loaded_blocks == 6
    for value, blocks in ((1, [0, 1]), (2, [2, 3]), (3, [4, 5])):
        assert torch.equal(memory[:, blocks], chunk_of(value))
    loader.close()  # closes its stream


def test_a_timed_out_load_counts_the_write_in_flight_once_it_lands(kv: KVCache) -> None:
    """At the deadline a write already started finishes before the blocks are reported: its
    chunk counts as loaded, and nothing is written after the report."""
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    gate, stream = StalledCache(kv, KEYS[1]), _HeldStream()
    paged, memory = paged_kv()
    loader = AsyncLoader(gate, SHAPE, 0, lambda: paged, stream, 1, 0.3, 1)  # type: ignore[arg-type]
    loader.submit(request([[0, 1], [2, 3]]))
    assert stream.started.acquire(timeout=5) and gate.entered.wait(5)
    threading.Timer(0.5, stream.release.release).start()  # chunk 0 lands after the deadline
    finished = wait_finished(loader)
    assert finished.timeouts == 1 and finished.loaded_blocks == 2
    assert finished.failed_blocks == {2, 3}
    assert torch.equal(memory[:, [0, 1]], chunk_of(1))
    gate.release.set()
    stream.release.release()
    time.sleep(0.2)
    assert int(memory[:, [2, 3]].sum()) == 0, "written after the load was reported"
    loader.close()  # closes its stream


def test_a_failed_write_fails_its_blocks_and_every_later_one(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    stream = _HeldStream(fail=True)
    paged, memory = paged_kv()
    loader = AsyncLoader(kv, SHAPE, 0, lambda: paged, stream, 1, 10.0, 1)
    loader.submit(request([[0, 1], [2, 3]]))
    for _ in range(2):
        stream.release.release()
    finished = wait_finished(loader)
    assert finished.failed_blocks == {0, 1, 2, 3} and finished.loaded_blocks == 0
    assert int(memory.sum()) == 0
    loader.close()  # closes its stream


# -- deferred writes: fetched off the step, written by the next step ----------------------------
def deferring_loader(
    kv: KVCache, defer_chunks: int, timeout_s: float = 10.0
) -> tuple[AsyncLoader, torch.Tensor]:
    paged, memory = paged_kv()
    loader = AsyncLoader(kv, SHAPE, 0, lambda: paged, InlineStream(), 1, timeout_s, 1, defer_chunks)
    return loader, memory


def test_a_deferred_load_only_fetches_and_hands_its_chunks_to_the_next_step(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    loader, memory = deferring_loader(kv, defer_chunks=2)
    loader.submit(request([[5, 9], [3, 4]]))
    finished = wait_finished(loader)
    assert finished.req_ids == {"r1"} and not finished.failed_blocks
    assert finished.loaded_blocks == 4
    assert int(memory.sum()) == 0, "a deferred load wrote into the paged blocks itself"
    [write] = finished.deferred
    assert write.req_id == "r1" and [c.block_ids for c in write.chunks] == [[5, 9], [3, 4]]
    assert torch.equal(write.staged[0], chunk_of(1)) and torch.equal(write.staged[1], chunk_of(2))
    assert loader.lent_buffers == 2
    write.release()
    assert loader.lent_buffers == 0
    loader.submit(request([[5, 9]], "r2"))  # the buffers are lent again, not made again
    again = wait_finished(loader).deferred[0]
    assert any(again.staged[0] is buf for buf in write.staged)
    again.release()
    loader.close()


def test_a_load_beyond_the_deferral_budget_writes_as_it_fetches(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    loader, memory = deferring_loader(kv, defer_chunks=1)
    loader.submit(request([[5, 9], [3, 4]]))  # two chunks: more than may wait for a step
    finished = wait_finished(loader)
    assert finished.deferred == [] and finished.loaded_blocks == 4
    assert torch.equal(memory[:, [5, 9]], chunk_of(1))
    assert torch.equal(memory[:, [3, 4]], chunk_of(2))
    loader.close()


def test_a_deferred_load_missing_a_chunk_hands_over_only_the_chunks_before_it(
    kv: KVCache,
) -> None:
    kv.put_chunks([KEYS[0], KEYS[2]], [chunk_of(1), chunk_of(3)])  # chunk 1 is missing
    loader, memory = deferring_loader(kv, defer_chunks=4)
    loader.submit(request([[0, 1], [2, 3], [4, 5]]))
    finished = wait_finished(loader)
    assert finished.failed_blocks == {2, 3, 4, 5} and finished.loaded_blocks == 2
    [write] = finished.deferred
    assert [c.block_ids for c in write.chunks] == [[0, 1]] and len(write.staged) == 1
    assert torch.equal(write.staged[0], chunk_of(1)) and int(memory.sum()) == 0
    write.release()
    assert loader.lent_buffers == 0
    loader.close()


def test_a_deferred_load_timed_out_hands_over_nothing_and_gets_its_buffers_back(
    kv: KVCache,
) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    gate = StalledCache(kv, KEYS[1])
    paged, memory = paged_kv()
    loader = AsyncLoader(gate, SHAPE, 0, lambda: paged, InlineStream(), 1, 0.2, 1, 4)  # type: ignore[arg-type]
    loader.submit(request([[0, 1], [2, 3]]))
    assert gate.entered.wait(5)  # chunk 0 fetched, the read of chunk 1 hangs
    finished = wait_finished(loader)
    assert finished.timeouts == 1 and finished.failed_blocks == {0, 1, 2, 3}
    assert finished.deferred == [] and finished.loaded_blocks == 0
    assert loader.lent_buffers == 2  # the thread still fills them
    gate.release.set()
    deadline = time.monotonic() + 5
    while loader.lent_buffers and time.monotonic() < deadline:
        time.sleep(0.005)
    assert loader.lent_buffers == 0 and int(memory.sum()) == 0
    assert loader.take_finished().req_ids == set()
    loader.close()


def stalled_load(kv: KVCache) -> tuple[AsyncLoader, StalledCache, torch.Tensor]:
    """A loader whose one load (chunk 0 into blocks 5 and 9) is reading a stalled tier."""
    kv.put_chunks(KEYS[:1], [chunk_of(1)])
    gate = StalledCache(kv, KEYS[0])
    paged, memory = paged_kv()
    loader = AsyncLoader(gate, SHAPE, 0, lambda: paged, InlineStream(), 1, 10.0, 1)  # type: ignore[arg-type]
    loader.submit(request([[5, 9]]))
    assert gate.entered.wait(5)
    return loader, gate, memory


def test_a_step_end_waits_for_a_load_predicted_to_finish_within_its_budget(kv: KVCache) -> None:
    loader, gate, memory = stalled_load(kv)
    assert loader.wait_near(5.0, 100.0) == (0, 0), "predicted to end long after the budget"
    threading.Timer(0.05, gate.release.set).start()
    began = time.monotonic()
    assert loader.wait_near(5.0, 0.01) == (1, 1)
    assert time.monotonic() - began < 4.0, "waited the whole budget for a load already done"
    finished = loader.take_finished()
    assert finished.req_ids == {"r1"} and torch.equal(memory[:, [5, 9]], chunk_of(1))
    loader.close()


def test_a_step_end_waits_for_a_load_once_and_no_longer_than_its_budget(kv: KVCache) -> None:
    loader, gate, _ = stalled_load(kv)
    began = time.monotonic()
    assert loader.wait_near(0.1, 0.0) == (1, 0)  # the tier stalls: the budget runs out
    assert time.monotonic() - began >= 0.1
    assert loader.wait_near(5.0, 0.0) == (0, 0), "a load is waited for once in its life"
    assert loader.take_finished().req_ids == set()
    gate.release.set()
    assert wait_finished(loader).req_ids == {"r1"}
    loader.close()
