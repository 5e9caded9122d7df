"""Copy-out and synchronous loads on CPU tensors, with and without layer pipelining.

The same code drives a GPU side stream; here the streams are the CPU build's: the step itself
(:class:`InlineStream`) or a background thread (:class:`ThreadStream`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.saves import SaveQueue, _StagingPool
from kvstack.integrations.vllm.streams import CopyStream, InlineStream, ThreadStream
from kvstack.integrations.vllm.sync_loads import SyncLoader
from kvstack.integrations.vllm.transfers import staging_chunks
from kvstack.kv.cache import KVCache
from kvstack.kv.keys import ChunkKey
from tests.integrations.vllm.paged import LAYERS, SHAPE, cache, chunk_of, paged_kv

KEYS = [ChunkKey(bytes([i + 1]) * 16) for i in range(4)]


@pytest.fixture
def kv() -> Iterator[KVCache]:
    store = cache()
    yield store
    store.close()


def saves(block_ids: list[list[int]], req_id: str = "r1", generated: bool = False) -> RequestIO:
    chunks = [ChunkIO(i, (KEYS[i],), ids, generated=generated) for i, ids in enumerate(block_ids)]
    return RequestIO(req_id, chunks)


def stored(kv: KVCache, key: ChunkKey) -> torch.Tensor:
    out = torch.empty(SHAPE, dtype=torch.uint8)
    assert kv.get_chunks_into([key], [out]) == 1, "chunk not stored"
    return out


def test_streams_run_in_order_and_report_completion() -> None:
    seen: list[int] = []
    assert InlineStream().submit(lambda: seen.append(0)).done() and seen == [0]
    gate = threading.Event()
    stream = ThreadStream("test")

    def first() -> None:
        gate.wait(5)
        seen.append(1)

    earlier = stream.submit(first)
    later = stream.submit(lambda: seen.append(2))
    assert not later.done()
    gate.set()
    assert later.wait(5) and earlier.done() and seen == [0, 1, 2]

    def broken() -> None:
        raise ZeroDivisionError("a copy failed")

    failed = stream.submit(broken)
    with pytest.raises(ZeroDivisionError):
        failed.wait(5)
    stream.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["all-layers", "layer-by-layer"])
@pytest.mark.parametrize("background", [False, True], ids=["on-step", "background"])
def test_saved_chunks_hold_exactly_the_pages(
    kv: KVCache, pipelined: bool, background: bool
) -> None:
    paged, memory = paged_kv()
    memory[:, [2, 3]] = chunk_of(4)
    memory[:, [8, 9]] = chunk_of(7)
    stream: CopyStream = ThreadStream("copy") if background or pipelined else InlineStream()
    queue = SaveQueue(kv, SHAPE, 0, stream, wait_on_step=not background)
    plan = [saves([[2, 3], [8, 9]], generated=True)]
    if pipelined:
        for layer in range(LAYERS):
            queue.layer(paged, 1, plan, layer)
    queue.end(paged, 1, plan)
    if not background:
        assert not queue.copy_pending("r1")
        memory.zero_()  # the step is over: the pages may change, the copies are done
    assert queue.flush(10)
    assert torch.equal(stored(kv, KEYS[0]), chunk_of(4))
    assert torch.equal(stored(kv, KEYS[1]), chunk_of(7))
    counts = queue.take_counts()
    assert (counts.chunks, counts.generated_chunks, counts.skipped_chunks) == (2, 2, 0)
    queue.close()
    stream.close()


def test_a_background_copy_out_holds_blocks_until_it_is_over(kv: KVCache) -> None:
    paged, memory = paged_kv()
    memory[:, [0, 1]] = chunk_of(3)
    gate = threading.Event()
    stream = ThreadStream("copy")
    stream.submit(lambda: gate.wait(5) and None)  # an earlier copy keeps the thread busy
    queue = SaveQueue(kv, SHAPE, 0, stream, wait_on_step=False)
    queue.end(paged, 7, [saves([[0, 1]], req_id="finished")])
    assert queue.copy_pending("finished") and not queue.copy_pending("other")
    assert queue.copied_through(7) == 6  # step 7's copy-out is still running
    gate.set()
    queue.wait_copies({"finished"})  # what handle_preemptions does before blocks are reused
    assert not queue.copy_pending("finished") and queue.copied_through(8) == 8
    memory.zero_()
    assert queue.flush(10)
    assert torch.equal(stored(kv, KEYS[0]), chunk_of(3))
    queue.close()
    stream.close()


def test_a_chunk_the_first_tier_holds_is_not_copied_again(kv: KVCache) -> None:
    kv.put_chunks([KEYS[0]], [chunk_of(1)])
    paged, memory = paged_kv()
    memory[:, [4, 5]] = chunk_of(9)
    queue = SaveQueue(kv, SHAPE, 0, InlineStream(), wait_on_step=True)
    queue.end(paged, 1, [saves([[4, 5]])])
    assert queue.flush(10)
    assert torch.equal(stored(kv, KEYS[0]), chunk_of(1))
    assert queue.take_counts().skipped_chunks == 1
    queue.close()


def test_a_staged_save_reaches_a_tier_without_two_phase_puts(tmp_path: object) -> None:
    kv = cache([f"file://{tmp_path}?size=16MiB"])
    paged, memory = paged_kv()
    memory[:, [6, 7]] = chunk_of(5)
    queue = SaveQueue(kv, SHAPE, 0, InlineStream(), wait_on_step=True)
    queue.end(paged, 1, [saves([[6, 7]])])
    memory.zero_()  # the staging buffer is the step's copy
    assert queue.flush(10) and kv.flush(10)
    assert torch.equal(stored(kv, KEYS[0]), chunk_of(5))
    queue.close()
    kv.close()


def test_the_staging_budget_counts_chunks_of_the_models_shape() -> None:
    seventy_b = (80, 16, 2 * 16 * 8 * 128 * 2)  # fp16 Llama-3-70B, 256-token chunks: 80 MiB
    assert staging_chunks(seventy_b, 2048 << 20, 256) == 25
    assert staging_chunks(seventy_b, (2048 << 20) // 16, 4) == 1  # an async load thread's set
    assert staging_chunks(seventy_b, 1 << 20, 4) == 1  # a chunk moves, whatever the budget
    assert staging_chunks(SHAPE, 2048 << 20, 256) == 256


def test_the_staging_pool_waits_for_a_buffer_the_save_thread_gives_back() -> None:
    pool = _StagingPool(SHAPE, False, 1)
    first = pool.acquire()
    got: list[torch.Tensor] = []
    taker = threading.Thread(target=lambda: got.append(pool.acquire()))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive() and pool.allocated == 1, "took a buffer beyond the budget"
    pool.release(first)
    taker.join(5)
    assert got and got[0] is first and pool.allocated == 1


def within(seconds: float, work: Callable[[], object]) -> None:
    """Run ``work`` on a thread; fail (instead of hanging the suite) if it is not done in time."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: (work(), done.set()), daemon=True)
    thread.start()
    assert done.wait(seconds), "still waiting: the step would never get its staging buffer"


def test_a_step_holding_every_buffer_takes_one_more_and_lets_it_go() -> None:
    pool = _StagingPool(SHAPE, False, 1)
    held = [pool.acquire()]
    within(5, lambda: held.append(pool.acquire(held_by_caller=1)))  # waiting: forever
    assert pool.allocated == 2
    for buffer in held:
        pool.release(buffer)
    assert pool.allocated == 1


def test_a_step_with_more_chunks_than_the_staging_budget_saves_them_all(tmp_path: object) -> None:
    kv = cache([f"file://{tmp_path}?size=16MiB"])  # no two-phase puts: every save is staged
    paged, memory = paged_kv()
    memory[:, [0, 1]], memory[:, [2, 3]], memory[:, [4, 5]] = chunk_of(1), chunk_of(2), chunk_of(3)
    queue = SaveQueue(kv, SHAPE, 0, InlineStream(), wait_on_step=True, max_staged=1)
    within(10, lambda: queue.end(paged, 1, [saves([[0, 1], [2, 3], [4, 5]])]))
    memory[:, [6, 7]] = chunk_of(4)
    queue.end(paged, 2, [RequestIO("r2", [ChunkIO(0, (KEYS[3],), [6, 7])])])
    assert queue.flush(10) and kv.flush(10)
    for key, value in zip(KEYS, (1, 2, 3, 4), strict=True):
        assert torch.equal(stored(kv, key), chunk_of(value))
    assert queue.staging_buffers == 1, "the buffers beyond the budget were kept"
    queue.close()
    kv.close()


def test_sync_loads_keep_no_more_staging_than_asked_between_steps(kv: KVCache) -> None:
    kv.put_chunks(KEYS[:3], [chunk_of(1), chunk_of(2), chunk_of(3)])
    paged, memory = paged_kv()
    loader = SyncLoader(kv, SHAPE, 0, InlineStream(), False, keep_chunks=1)
    chunks = [ChunkIO(i, (KEYS[i],), [2 * i, 2 * i + 1]) for i in range(3)]
    assert loader.start(paged, [RequestIO("r1", chunks)]).loaded_blocks == 6
    loader.finish()
    assert loader.staging_buffers == 1
    for i in range(3):
        assert torch.equal(memory[:, [2 * i, 2 * i + 1]], chunk_of(i + 1))


@pytest.mark.parametrize("pipelined", [False, True], ids=["all-layers", "layer-by-layer"])
def test_sync_loads_write_every_layer_before_it_is_used(kv: KVCache, pipelined: bool) -> None:
    kv.put_chunks(KEYS[:2], [chunk_of(1), chunk_of(2)])
    paged, memory = paged_kv()
    stream: CopyStream = ThreadStream("layers") if pipelined else InlineStream()
    loader = SyncLoader(kv, SHAPE, 0, stream, pipelined)
    plan = RequestIO("r1", [ChunkIO(0, (KEYS[0],), [10, 11]), ChunkIO(1, (KEYS[1],), [3], 1)])
    result = loader.start(paged, [plan])
    assert result.loaded_blocks == 3 and not result.failed_blocks
    for layer in range(LAYERS):
        loader.wait_for_layer(layer)  # the layer's attention may read its blocks now
        assert torch.equal(memory[layer, [10, 11]], chunk_of(1)[layer])
        assert torch.equal(memory[layer, 3], chunk_of(2)[layer, 1])
    loader.finish()
    stream.close()


def test_a_sync_load_reports_the_chunks_it_could_not_fetch(kv: KVCache) -> None:
    kv.put_chunks([KEYS[0]], [chunk_of(1)])
    paged, memory = paged_kv()
    loader = SyncLoader(kv, SHAPE, 0, InlineStream(), False)
    plan = RequestIO("r1", [ChunkIO(0, (KEYS[0],), [0, 1]), ChunkIO(1, (KEYS[1],), [2, 3])])
    result = loader.start(paged, [plan])
    assert result.failed_blocks == {2, 3} and result.failed_req_ids == ["r1"]
    assert int(memory[:, [2, 3]].sum()) == 0


def test_a_thread_stream_writes_inference_tensors_as_the_step_that_submitted_it() -> None:
    # vLLM steps in inference mode; the pipelined copy-out writes its staging tensors from the
    # stream's own thread, where inference mode is off unless the stream carries it over.
    stream = ThreadStream("test-copy")
    try:
        with torch.inference_mode():
            pages = torch.arange(32.0).reshape(8, 4)
            out = torch.empty(2, 4)
            index = torch.tensor([5, 1])
            done = stream.submit(lambda: torch.index_select(pages, 0, index, out=out))
            assert done.wait(10)
        assert out.tolist() == [pages[5].tolist(), pages[1].tolist()]
    finally:
        stream.close()
