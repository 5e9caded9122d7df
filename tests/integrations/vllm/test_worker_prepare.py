"""The worker starts a step's asynchronous loads when it is handed the step's metadata, before
the forward pass: vLLM 0.32 calls ``start_load_kv`` only after the forward on steps without
synchronous loads, a whole step later on the CPU build. Writes into the paged blocks wait for
``start_load_kv`` unless the worker may write before the forward (``writes_at_bind``)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.settings import ConnectorSettings, TransferModes
from kvstack.integrations.vllm import worker as worker_module
from kvstack.integrations.vllm.scheduler import KVStackMetadata
from kvstack.integrations.vllm.worker import WorkerSide
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey
from tests.integrations.vllm.paged import (
    CHUNK,
    CountingCache,
    StalledCache,
    allocation,
    chunk_of,
    layout,
)

KEYS = [ChunkKey(bytes([i + 1]) * 16) for i in range(2)]


def make_worker(
    monkeypatch: pytest.MonkeyPatch, pipelining: bool = False, cpu_build: bool = False
) -> tuple[WorkerSide, torch.Tensor]:
    """A registered worker holding KEYS' two chunks. ``cpu_build``: as on vLLM's CPU build,
    loads may write at the metadata, so they write in the step after their fetch."""
    monkeypatch.setattr(worker_module, "_on_cpu_build", lambda: False)  # keep this affinity
    monkeypatch.setattr(worker_module, "_writes_before_forward", lambda config: cpu_build)
    kv = KVConfig(model="prepare-test", chunk_size=CHUNK, tiers=["cpu://?size=4MiB"])
    modes = TransferModes(copy_out_background=False, layer_pipelining=pipelining)
    engine = f"prepare-{os.getpid()}-{time.time_ns()}"
    worker = WorkerSide(kv, layout(), engine, ConnectorSettings(), modes, True)
    config, caches, memory = allocation()
    worker.register(config, caches)
    assert worker.writes_at_bind == cpu_build
    assert worker.cache.put_chunks(KEYS, [chunk_of(1), chunk_of(2)]) == 2
    return worker, memory


@pytest.fixture
def side(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[WorkerSide, torch.Tensor]]:
    worker, memory = make_worker(monkeypatch)
    yield worker, memory
    worker.close()


def metadata(step: int) -> KVStackMetadata:
    chunks = [ChunkIO(0, (KEYS[0],), [5, 9]), ChunkIO(1, (KEYS[1],), [3, 4])]
    return KVStackMetadata(step=step, async_loads=[RequestIO("r1", chunks)])


def received(worker: WorkerSide, timeout_s: float = 10.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, recv = worker.get_finished()
        if recv:
            return recv
        time.sleep(0.005)
    return set()


def test_a_gpu_style_worker_fetches_at_the_metadata_and_writes_after_start(
    side: tuple[WorkerSide, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, memory = side
    assert not worker.writes_at_bind  # the unrestricted default off vLLM's CPU build
    counting = CountingCache(worker.loader._cache)
    monkeypatch.setattr(worker.loader, "_cache", counting)
    meta = metadata(1)
    worker.prepare_step(meta)
    time.sleep(0.2)  # fetched by now; the step's forward pass would run here
    assert int(memory.sum()) == 0, "written before start_load_kv"
    worker.start_step(meta)
    assert received(worker) == {"r1"}
    assert torch.equal(memory[:, [5, 9]], chunk_of(1))
    assert torch.equal(memory[:, [3, 4]], chunk_of(2))
    assert counting.read == 2  # each chunk read once: start_step did not start the load again


def test_where_writes_are_safe_at_the_metadata_a_load_needs_no_start(
    side: tuple[WorkerSide, torch.Tensor],
) -> None:
    worker, memory = side
    worker.writes_at_bind = True  # after register: writes as it fetches, deferring nothing
    worker.prepare_step(metadata(1))
    assert received(worker) == {"r1"}  # before start_load_kv: a step earlier
    assert torch.equal(memory[:, [5, 9]], chunk_of(1))


@pytest.mark.parametrize("pipelining", [False, True])
def test_a_finished_load_is_written_by_the_next_step_before_its_layers_run(
    monkeypatch: pytest.MonkeyPatch, pipelining: bool
) -> None:
    worker, memory = make_worker(monkeypatch, pipelining, cpu_build=True)
    try:
        worker.prepare_step(metadata(1))
        worker.start_step(metadata(1))  # after the forward: step 1 has no synchronous loads
        assert received(worker) == {"r1"}
        assert int(memory.sum()) == 0, "written off the step: the request waited for it"
        assert worker.loader.lent_buffers == 2
        step2 = KVStackMetadata(step=2)
        worker.prepare_step(step2)  # the step that may run r1: its writes start first
        for name in worker.paged.layer_index:  # type: ignore[union-attr]
            worker.wait_for_layer(name)  # each layer's attention, after its write
            layer = worker.paged.layer_index[name]  # type: ignore[union-attr]
            assert torch.equal(memory[layer][[5, 9]], chunk_of(1)[layer])
            assert torch.equal(memory[layer][[3, 4]], chunk_of(2)[layer])
        worker.start_step(step2)
        worker.end_step(step2)
        assert worker.loader.lent_buffers == 0  # the buffers went back at the step's end
        assert worker.take_stats().data["deferred_write_chunks"] == 2  # type: ignore[union-attr]
    finally:
        worker.close()


def test_a_load_started_beside_deferred_writes_writes_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load started in the step that writes a finished load's chunks may have been given
    the same blocks (the finished request was aborted and its blocks freed): the later load's
    pages are the ones left."""
    worker, memory = make_worker(monkeypatch, pipelining=True, cpu_build=True)
    try:
        worker.prepare_step(metadata(1))
        worker.start_step(metadata(1))
        assert received(worker) == {"r1"}
        later = ChunkKey(b"\x07" * 16)
        assert worker.cache.put_chunks([later], [chunk_of(7)]) == 1
        step2 = KVStackMetadata(
            step=2, async_loads=[RequestIO("r2", [ChunkIO(0, (later,), [5, 9])])]
        )
        monkeypatch.setattr(worker.loader, "_defer_chunks", 0)  # r2 writes as it fetches
        worker.prepare_step(step2)
        time.sleep(0.1)  # r2 fetched by now, and not let write while r1's writes may run
        assert torch.equal(memory[:, [5, 9]], chunk_of(1))
        worker.start_step(step2)
        assert received(worker) == {"r2"}
        worker.end_step(step2)
        assert torch.equal(memory[:, [5, 9]], chunk_of(7))
        assert torch.equal(memory[:, [3, 4]], chunk_of(2))
    finally:
        worker.close()


def test_a_step_whose_metadata_was_not_prepared_starts_its_loads_at_start(
    side: tuple[WorkerSide, torch.Tensor],
) -> None:
    worker, memory = side
    worker.start_step(metadata(1))
    assert received(worker) == {"r1"}
    assert torch.equal(memory[:, [3, 4]], chunk_of(2))


@pytest.mark.parametrize("cap", [0.25, 0.0])
def test_a_step_reports_a_load_that_ends_within_its_bounded_wait(
    side: tuple[WorkerSide, torch.Tensor], monkeypatch: pytest.MonkeyPatch, cap: float
) -> None:
    worker, memory = side
    stalled = StalledCache(worker.loader._cache)
    monkeypatch.setattr(worker.loader, "_cache", stalled)
    worker.finish_wait.cap = cap
    worker.finish_wait.step_began(1, 0.0)  # steps of a second, one request stepping,
    worker.finish_wait.step_ended(1.0)
    worker.finish_wait.observe_fetch(1, 0.001)  # and loads of a millisecond a chunk
    meta = metadata(1)
    worker.prepare_step(meta)
    worker.start_step(meta)
    assert stalled.entered.wait(5)
    threading.Timer(0.05, stalled.release.set).start()  # ends a little after the step
    _, recv = worker.get_finished()
    if cap:
        assert recv == {"r1"}, "the step's end did not wait for a load about to end"
        assert torch.equal(memory[:, [3, 4]], chunk_of(2))
        stats = worker.take_stats()
        assert stats is not None
        assert stats.data["finish_waits"] == 1 and stats.data["finish_wait_caught"] == 1
    else:
        assert recv is None  # reported by a later step
        assert received(worker) == {"r1"}


def test_the_worker_times_its_steps_with_requests_stepping_and_its_loads_fetches(
    side: tuple[WorkerSide, torch.Tensor],
) -> None:
    worker, _ = side
    assert worker.finish_wait.cap == 0.0  # opt-in: nothing waits by default
    worker.finish_wait.cap = 0.25
    worker.prepare_step(KVStackMetadata(step=1, stepping=0))  # nothing computes: not timed
    worker.get_finished()
    assert worker.finish_wait.step_seconds is None
    worker.prepare_step(KVStackMetadata(step=2, stepping=3))
    time.sleep(0.02)  # the forward pass
    worker.get_finished()
    step = worker.finish_wait.step_seconds
    assert step is not None and step >= 0.02
    meta = metadata(3)
    worker.prepare_step(meta)
    worker.start_step(meta)
    assert received(worker) == {"r1"}
    per_chunk = worker.finish_wait.seconds_per_chunk
    assert per_chunk is not None and per_chunk > 0
    assert worker.finish_wait.budget() == pytest.approx(min(0.25 * step, step / 3))
