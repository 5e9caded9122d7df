"""Asynchronous loads: a request's chunks fetched and written into its blocks off the step.

vLLM parks a request whose load is asynchronous in ``WAITING_FOR_REMOTE_KVS`` and keeps
stepping the others. :class:`AsyncLoader` runs each such load as a job on its own threads
(off the engine's compute cores on vLLM's CPU build): it fetches a few chunks at a time from
the tiers into staging buffers and writes them into the request's blocks on the copy stream.
On a GPU that is a side stream, fed from pinned memory, and the thread fetches the next few
chunks into a second set of buffers while the last ones cross. On the CPU build the worker
gives it an inline stream: the write runs on the load thread, then the next fetch starts (see
the worker for the measurement). ``take_finished`` reports, once per job, that the request's
receive is over, and which blocks did not arrive: vLLM recomputes exactly those and everything
after them (``kv_load_failure_policy=recompute``).

A job starts when the worker is handed the step's metadata, before the step's forward pass,
not when vLLM calls ``start_load_kv``: vLLM 0.32 calls that after the forward where a step has
no synchronous loads (after its launch on a GPU, but after the whole pass on the CPU build, a
step later than the metadata). The fetch needs nothing from the step, so it starts at once; the
writes into the paged blocks wait for the job's ``go`` event, which the worker sets where
writing is safe (:meth:`.WorkerSide.prepare_step`).

Deferred writes (vLLM's CPU build, where scheduling is synchronous): a job whose chunks fit
the loader's deferral budget only fetches, into buffers it holds for the whole request, and is
reported finished once fetched. Its chunks are then written in the next step, which begins only
after that report: before that step's forward pass, layer by layer beside it
(:meth:`.WorkerSide.prepare_step`), as a synchronous load's are. Fetching and writing one after
the other on the spare core made the request wait for both; reading and writing at once there
slowed the running decodes. Within the step the write is hidden behind the forward pass, and
each layer's attention still runs only after that layer's write.

The load threads are threads of the worker's process, so they share the interpreter lock with
the engine's step: a thread back from a read waits for the lock while the step runs Python, and
taking it stops the step. ``kvstack bench fetch`` measures that without an engine (2 cores, 32
chunks of 3 MiB, a step holding the lock 4 ms of every 5). There a fetch on a load thread took
93.5 ms from the page cache and 144 ms from disk. The same fetch in a helper process, reading
into shared memory and polled once per step, took 25.3 ms and 67.3 ms, and cost the step's p99
at most 1.11x; Redis's batched get behaves alike, and a shorter switch interval does not change
the picture (``docs/benchmarks.md``). That is why an asynchronous load ends later than a
synchronous one here (the step waits for the latter with the lock released). With
``load_fetch=process`` the deferred jobs' tier reads run in such a helper
(:mod:`.fetch_process`): a job borrows slots of its shared memory instead of private buffers,
reads its leading chunks from the worker's ``cpu://`` tier on a load thread, sends the rest to
the helper, and is done when the step finds the helper's answer (:meth:`AsyncLoader._pump`).

A block is either written whole from a verified chunk or reported failed; never half. A job
that outlives ``timeout_s`` is abandoned under its lock: a write already started finishes
before the abandonment is reported, and nothing is written afterwards, even if the tier
answers later (the thread only fills its own staging buffers).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.layout import PagedKV
from kvstack.integrations.vllm.load_cost import LoadSample
from kvstack.integrations.vllm.streams import Completion, CopyStream
from kvstack.integrations.vllm.sync_loads import staged_chunk
from kvstack.integrations.vllm.transfers import scatter_chunks
from kvstack.kv.affinity import enter_background
from kvstack.kv.cache import KVCache
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.base import Tier

if TYPE_CHECKING:  # msgspec, which it needs, comes with vLLM (and the server extra), not kv
    from kvstack.integrations.vllm.fetch_process import FetchProcess

__all__ = ["BATCH_CHUNKS", "AsyncLoader", "DeferredWrite", "FinishedLoads", "write_chunks"]

log = logging.getLogger(__name__)
BATCH_CHUNKS = 4  # chunks a load thread fetches at a time, at most (staging_mib may say fewer)


@dataclass
class DeferredWrite:
    """A finished load's fetched chunks, to be written into their blocks in the next step;
    ``release`` hands the buffers back to the loader once the write is done."""

    req_id: str
    chunks: list[ChunkIO]
    staged: list[torch.Tensor]  # [layers, per_chunk, page] each, one per chunk
    release: Callable[[], None]


@dataclass
class FinishedLoads:
    """What :meth:`AsyncLoader.take_finished` found since its last call."""

    req_ids: set[str] = field(default_factory=set)
    failed_blocks: set[int] = field(default_factory=set)
    loaded_blocks: int = 0
    failed_chunks: int = 0
    timeouts: int = 0
    helper_chunks: int = 0  # chunks the fetch helper process read whole
    seconds: list[float] = field(default_factory=list)  # start to finish, per job
    fetch_seconds: list[float] = field(default_factory=list)  # start to the thread done
    samples: list[LoadSample] = field(default_factory=list)  # jobs that wrote something
    deferred: list[DeferredWrite] = field(default_factory=list)  # for the next step to write


@dataclass
class _Job:
    request: RequestIO
    keys: list[ChunkKey]
    started: float
    deadline: float
    go: threading.Event  # set once the job may write into the paged blocks
    lock: threading.Lock = field(default_factory=threading.Lock)
    written: int = 0  # leading chunks written whole into the paged blocks
    writing: tuple[Completion, int] | None = None  # the write in flight, of how many chunks
    write_failed: bool = False  # a write raised: nothing after it may count
    fetched_all: bool = False  # the thread is done with the job (success or not)
    done: threading.Event = field(default_factory=threading.Event)  # set with fetched_all
    waited: bool = False  # a step's end waited for it once (wait_near)
    fetch_seconds: float = 0.0  # start to the thread being done with it
    abandoned: bool = False  # reported (finished or timed out): nothing more may be written
    staged: list[torch.Tensor] | None = None  # a deferred job's buffers, one per chunk
    release: Callable[[], None] | None = None  # gives a deferred job's buffers back
    handed_over: bool = False  # a deferred job's buffers went to the step (or back)
    slots: list[int] | None = None  # a deferred job's slots in the fetch helper's memory


def write_chunks(paged: PagedKV, chunks: list[ChunkIO], staged: list[torch.Tensor]) -> None:
    """Write the blocks ``chunks`` load from their staged pages (``[layers, per_chunk, page]``
    each): on GPUs one transfer per chunk and one write per layer (:mod:`.transfers`)."""
    items = [staged_chunk(paged, c, buf) for c, buf in zip(chunks, staged, strict=True)]
    scatter_chunks(paged, [s.index for s in items], [s.pages for s in items])


class AsyncLoader:
    def __init__(
        self,
        cache: KVCache,
        chunk_shape: tuple[int, int, int],
        rank: int,
        paged: Callable[[], PagedKV],
        stream: CopyStream,
        threads: int,
        timeout_s: float,
        batch_chunks: int = BATCH_CHUNKS,
        defer_chunks: int = 0,
        fetcher: FetchProcess | None = None,
        memory: Tier | None = None,
    ) -> None:
        """``fetcher``: a helper process that fetches deferred jobs (:mod:`.fetch_process`);
        ``memory``: the worker's ``cpu://`` tier, read here for a job's leading chunks first,
        since the helper cannot."""
        self._cache, self._shape, self._rank = cache, chunk_shape, rank
        self._paged, self._stream = paged, stream
        self._timeout_s = timeout_s
        self._batch = batch_chunks
        self._pin = torch.cuda.is_available()
        # Deferred writes: chunk buffers, at most defer_chunks of them (0: none deferred)
        self._defer_chunks = defer_chunks
        self._spare: list[torch.Tensor] = []
        self._lent = 0
        self._spare_lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._jobs_lock = threading.Lock()
        self._local = threading.local()
        self._fetcher, self._memory = fetcher, memory
        self._remote: dict[int, _Job] = {}  # jobs sent to the helper, by job number
        self._next_job = 0
        self._helper_chunks = 0  # read by the helper, not yet in a FinishedLoads
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="kvstack-load", initializer=enter_background
        )

    def submit(self, request: RequestIO, go: threading.Event | None = None) -> None:
        """Start ``request``'s load: fetching at once, writing once ``go`` is set (at once
        without one). A job whose ``go`` is not set by its deadline writes nothing and is
        reported failed, so vLLM recomputes it."""
        now = time.monotonic()
        keys = [ChunkKey(c.keys[self._rank]) for c in request.chunks]
        if go is None:
            go = threading.Event()
            go.set()
        job = _Job(request, keys, now, now + self._timeout_s, go)
        self._lend(job, len(request.chunks))
        with self._jobs_lock:
            self._jobs[request.req_id] = job
        self._pool.submit(self._run_remote if job.slots is not None else self._run, job)

    def _lend(self, job: _Job, count: int) -> None:
        """``count`` chunk buffers for a deferred job (slots of the helper's memory where it
        fetches), or none (it writes as it fetches) where they would take the lent buffers
        past ``defer_chunks``."""
        fetcher = self._fetcher
        if fetcher is not None and fetcher.alive:
            slots = fetcher.lend(count)
            if slots is not None:
                job.slots, job.staged = slots, fetcher.views(slots)
                job.release = functools.partial(fetcher.give_back, slots)
            return
        taken = self._lend_buffers(count)
        if taken is not None:
            job.staged, job.release = taken, functools.partial(self._give_back, taken)

    def _lend_buffers(self, count: int) -> list[torch.Tensor] | None:
        with self._spare_lock:
            if count == 0 or self._lent + count > self._defer_chunks:
                return None
            self._lent += count
            taken = self._spare[len(self._spare) - min(count, len(self._spare)) :]
            del self._spare[len(self._spare) - len(taken) :]
        while len(taken) < count:
            taken.append(torch.empty(self._shape, dtype=torch.uint8, pin_memory=self._pin))
        return taken

    def _give_back(self, buffers: list[torch.Tensor]) -> None:
        with self._spare_lock:
            self._lent -= len(buffers)
            self._spare += buffers

    @property
    def lent_buffers(self) -> int:
        """Chunk buffers held by deferred jobs and their writes."""
        with self._spare_lock:
            lent = self._lent
        return lent + (self._fetcher.lent_slots if self._fetcher is not None else 0)

    @property
    def num_pending(self) -> int:
        with self._jobs_lock:
            return len(self._jobs)

    # -- on a load thread ------------------------------------------------------------------
    def _run(self, job: _Job, skip: int = 0) -> None:
        try:
            if job.staged is not None:
                self._fetch(job, job.staged, skip)
            else:
                self._fetch_and_write(job)
        except Exception:  # a broken load is a recompute, never a dead thread or a bad block
            log.exception("kvstack: asynchronous load of request %s failed", job.request.req_id)
        finally:
            self._finish(job)

    def _run_remote(self, job: _Job) -> None:
        """A job fetched by the helper process: the leading chunks the worker's ``cpu://``
        tier holds are copied here, the rest are sent to the helper (or, where it is gone,
        fetched on this thread)."""
        staged, slots = job.staged or [], job.slots or []
        if job.abandoned:  # timed out before a thread was free: nothing to fetch
            self._finish(job)
            return
        held = 0
        try:
            if self._memory is not None and job.keys:
                hits = self._memory.get_many_into(job.keys, staged)
                held = next((i for i, hit in enumerate(hits) if not hit), len(hits))
        except Exception:  # the helper then reads them from the slower tiers
            log.exception("kvstack: reading request %s from the cpu tier failed",
                          job.request.req_id)  # fmt: skip
        with job.lock:
            job.written = held
        if held == len(job.keys):
            self._finish(job)
            return
        with self._jobs_lock:
            number, self._next_job = self._next_job, self._next_job + 1
            self._remote[number] = job
        fetcher = self._fetcher
        keys = [bytes(k) for k in job.keys[held:]]
        if fetcher is not None and fetcher.submit(number, keys, slots[held:]):
            return
        with self._jobs_lock:
            # Not ours any more where the step found the helper dead first and failed the job.
            ours = self._remote.pop(number, None) is not None
        if ours:
            self._run(job, skip=held)  # the helper is gone: this thread fetches

    def _finish(self, job: _Job, loaded: int = 0) -> None:
        """The job's fetch is over, ``loaded`` more chunks of it fetched whole. One reported
        as timed out meanwhile has nothing written: its buffers, filled until now, go back."""
        with job.lock:
            job.written += loaded
            job.fetched_all = True
            job.fetch_seconds = time.monotonic() - job.started
            job.done.set()
            give_back = job.staged is not None and job.abandoned and not job.handed_over
            job.handed_over = job.handed_over or give_back
        if give_back and job.release is not None:
            job.release()

    def _pump(self, timeout_s: float = 0.0) -> None:
        """Take the helper's answers; if it died, fail what it still had (recomputed)."""
        fetcher = self._fetcher
        if fetcher is None:
            return
        for reply in fetcher.poll(timeout_s):
            with self._jobs_lock:
                job = self._remote.pop(reply.job, None)
            if job is not None:
                self._helper_chunks += reply.loaded
                self._finish(job, reply.loaded)
        if not fetcher.alive:
            with self._jobs_lock:
                lost, self._remote = list(self._remote.values()), {}
            for job in lost:  # no reply will come: nothing more of them is fetched
                self._finish(job)

    def take_tier_counts(self) -> dict[str, float]:
        """The helper process's tier counter increments since the last call."""
        return self._fetcher.take_tier_counts() if self._fetcher is not None else {}

    def _fetch(self, job: _Job, staged: list[torch.Tensor], skip: int = 0) -> None:
        """A deferred job: fetch every chunk (after the ``skip`` already fetched) into its own
        buffers; the step writes them."""
        for start in range(skip, len(job.keys), self._batch):
            if job.abandoned:
                return
            keys = job.keys[start : start + self._batch]
            loaded = self._cache.get_chunks_into(keys, staged[start : start + len(keys)])
            with job.lock:
                job.written += loaded  # fetched whole: the step writes them
            if loaded < len(keys):
                return

    def _fetch_and_write(self, job: _Job) -> None:
        chunks = job.request.chunks
        try:
            for n, start in enumerate(range(0, len(chunks), self._batch)):
                if job.abandoned:
                    return
                batch = chunks[start : start + self._batch]
                keys = job.keys[start : start + self._batch]
                # Two sets of buffers: this batch fills one while the last one's write runs.
                buffers = self._buffers(n % 2, len(batch))
                loaded = self._cache.get_chunks_into(keys, buffers)
                if not job.go.wait(max(job.deadline - time.monotonic(), 0.0)):
                    return  # the step that may write never came: reported failed at the deadline
                paged = self._paged()
                # The last write, whole, before this one (its buffers are refilled next). Waited
                # for outside the lock, which the step takes to check on the job.
                if (writing := job.writing) is not None:
                    with contextlib.suppress(Exception):  # reported by _settle
                        writing[0].wait()
                with job.lock:
                    if not _settle(job) or job.abandoned:
                        return
                    if loaded:
                        ok, staged = batch[:loaded], buffers[:loaded]
                        write = functools.partial(write_chunks, paged, ok, staged)
                        job.writing = (self._stream.submit(write), loaded)
                if loaded < len(batch):
                    return
        finally:
            with job.lock:
                _settle(job)

    def _buffers(self, slot: int, count: int) -> list[torch.Tensor]:
        """This thread's staging buffers of set ``slot`` (0 or 1; a timed-out fetch may still
        be filling them)."""
        sets: list[list[torch.Tensor]] = getattr(self._local, "staging", [[], []])
        staging = sets[slot]
        while len(staging) < count:
            staging.append(torch.empty(self._shape, dtype=torch.uint8, pin_memory=self._pin))
        self._local.staging = sets
        return staging[:count]

    # -- on the step -----------------------------------------------------------------------
    def wait_near(self, budget_s: float, seconds_per_chunk: float) -> tuple[int, int]:
        """Wait up to ``budget_s`` for the jobs predicted (their start plus their chunks times
        ``seconds_per_chunk``) to be done within it, each job once in its life
        (:mod:`.finish_wait`). Returns (jobs waited for, of them done)."""
        end = time.monotonic() + budget_s
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        near = []
        for job in jobs:
            predicted = job.started + len(job.keys) * seconds_per_chunk
            if not job.waited and not job.done.is_set() and predicted <= end:
                job.waited = True
                near.append(job)
        remote = [job for job in near if job.slots is not None]
        while self._fetcher is not None and self._fetcher.alive and remote:
            # the helper's answers arrive only when taken
            if (left := end - time.monotonic()) <= 0:
                break
            self._pump(left)
            remote = [job for job in remote if not job.done.is_set()]
        for job in near:
            job.done.wait(max(end - time.monotonic(), 0.0))
        return len(near), sum(job.done.is_set() for job in near)

    def take_finished(self, now: float | None = None) -> FinishedLoads:
        """Jobs that finished or timed out since the last call (each reported once)."""
        self._pump()
        now = time.monotonic() if now is None else now
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        out = FinishedLoads(helper_chunks=self._helper_chunks)
        self._helper_chunks = 0
        for job in jobs:
            with job.lock:
                if not job.fetched_all and now < job.deadline:
                    continue
                timed_out = not job.fetched_all
                _settle(job)  # a write in flight lands (or fails) before the blocks are reported
                job.abandoned = True
                if job.staged is not None and timed_out:
                    job.written = 0  # still fetching: the thread gives its buffers back
                elif job.staged is not None:
                    job.handed_over = True
                    out.deferred.append(self._deferred(job))
                written = job.written
                # A thread may have finished after ``now`` was read: not before its own fetch.
                seconds = max(now - job.started, job.fetch_seconds)
                if not timed_out:
                    out.fetch_seconds.append(job.fetch_seconds)
                if not timed_out and written:
                    out.samples.append(
                        LoadSample(job.request.req_id, written, job.fetch_seconds, False)
                    )
            self._report(job, written, timed_out, seconds, out)
        with self._jobs_lock:
            for req_id in out.req_ids:
                self._jobs.pop(req_id, None)
        return out

    def _deferred(self, job: _Job) -> DeferredWrite:
        staged = job.staged or []
        return DeferredWrite(
            job.request.req_id,
            job.request.chunks[: job.written],
            staged[: job.written],
            job.release or (lambda: None),
        )

    def _report(
        self, job: _Job, written: int, timed_out: bool, seconds: float, out: FinishedLoads
    ) -> None:
        chunks = job.request.chunks
        failed = chunks[written:]
        out.req_ids.add(job.request.req_id)
        out.seconds.append(seconds)
        out.failed_blocks.update(b for c in failed for b in c.block_ids)
        out.loaded_blocks += sum(len(c.block_ids) for c in chunks[:written])
        out.failed_chunks += len(failed)
        out.timeouts += int(timed_out)
        if failed:
            log.warning(
                "kvstack: %d of %d chunks of request %s did not load (%s); vLLM recomputes them",
                len(failed), len(chunks), job.request.req_id,
                f"timed out after {self._timeout_s:g} s" if timed_out else "missing or corrupt",
            )  # fmt: skip

    def close(self) -> None:
        with self._jobs_lock:
            for job in self._jobs.values():
                job.abandoned = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._fetcher is not None:
            self._fetcher.close()
        self._stream.close()  # after the jobs: each waited for its last write


def _settle(job: _Job) -> bool:
    """Under ``job.lock``: wait for the job's write in flight and count it once it is whole.
    False once a write has failed (its blocks and every later one are then recomputed)."""
    if job.writing is not None:
        done, count = job.writing
        job.writing = None
        try:
            done.wait()
        except Exception:
            log.exception("kvstack: writing a load of request %s failed", job.request.req_id)
            job.write_failed = True
        else:
            job.written += count  # no write is submitted after a failed one
    return not job.write_failed
