"""The worker side of the connector: the KV cache tiers, block copies, the lookup server.

Per step (vLLM's model runner)::

    prepare_step(meta)         (at the metadata, before the forward) finished asynchronous
                               loads' fetched chunks start to be written, maybe layer by layer;
                               the step's asynchronous loads start fetching
    handle_preemptions(meta)   copy-outs of preempted requests' blocks end (they may be reused)
    start_load_kv(meta)        asynchronous loads start (:mod:`.loads`); loads the forward pass
                               needs are fetched and written, maybe layer by layer
                               (:mod:`.sync_loads`)
      wait_for_layer_load(l)   layer l's loaded blocks are written (layer pipelining)
      save_kv_layer(l)         layer l's pages of newly completed chunks are copied out
    wait_for_save(meta)        the rest of the copy-out (:mod:`.saves`); publishing to the tiers
                               happens on the save thread
    get_finished(ids)          receives that ended (done, failed or timed out), after an
                               opt-in bounded wait for a load about to end
                               (:mod:`.finish_wait`); finished requests whose copy-outs are
                               over, so vLLM frees their blocks
    get_block_ids_with_load_errors()   blocks that did not load: vLLM recomputes them

Chunks that cannot be loaded (evicted, corrupt, a tier down or too slow) are never used: their
blocks are reported and recomputed. Nothing on the step waits for a slow tier, beyond
the opt-in bounded wait at its end.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvstack.cluster.config import IndexConfig
from kvstack.integrations.plan import ChunkIO
from kvstack.integrations.settings import ConnectorSettings, TransferModes
from kvstack.integrations.vllm.events import ChunkInfo, EventCollector, KVStackKVEvents
from kvstack.integrations.vllm.finish_wait import FinishWait
from kvstack.integrations.vllm.layout import PagedKV, PagedLayout
from kvstack.integrations.vllm.load_cost import LoadSample
from kvstack.integrations.vllm.loads import (
    BATCH_CHUNKS,
    AsyncLoader,
    DeferredWrite,
    FinishedLoads,
)
from kvstack.integrations.vllm.lookup import LookupServer, PrefixAnswer, lookup_endpoint
from kvstack.integrations.vllm.saves import MAX_STAGED_CHUNKS, SaveQueue
from kvstack.integrations.vllm.scheduler import KVStackMetadata, KVStackWorkerMeta
from kvstack.integrations.vllm.stats import TIER_COUNTERS, KVStackStats
from kvstack.integrations.vllm.streams import make_stream
from kvstack.integrations.vllm.sync_loads import SyncLoader, staged_chunk
from kvstack.integrations.vllm.transfers import staging_chunks
from kvstack.kv.affinity import reserve_background_cpus, starting_background_threads
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.base import Tier
from kvstack.security import SecurityConfig, load_keys

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvstack.integrations.vllm.fetch_process import FetchProcess
    from kvstack.kv.cache import KVCache

__all__ = ["WorkerSide"]

log = logging.getLogger(__name__)


class WorkerSide:
    def __init__(
        self,
        kv: KVConfig,
        layout: PagedLayout,
        engine_id: str,
        settings: ConnectorSettings,
        modes: TransferModes,
        sync_save: bool,
        index: IndexConfig | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        self.layout, self.rank, self.settings, self.modes = layout, kv.tp_rank, settings, modes
        self.sync_save = sync_save
        self.shape = layout.chunk_shape(kv.chunk_size // layout.block_size)
        if _on_cpu_build():
            # The worker is bound to the cores the model computes on: tier writers, loads,
            # lookups and peer threads run on the others (the scheduler's), as NIXL's do.
            reserve_background_cpus()
        with starting_background_threads():
            self._start(kv, engine_id, index, security or SecurityConfig())

    def _start(
        self, kv: KVConfig, engine_id: str, index: IndexConfig | None, security: SecurityConfig
    ) -> None:
        # Imported here, not at module level: vLLM's API server process imports this module to
        # find the connector class, and must not register the cache's (idle) metrics there.
        from kvstack.kv.cache import KVCache

        self._kv, self._security = kv, security
        # With a cluster secret, chunks are sealed and checked at every shared tier boundary.
        self.cache: KVCache = KVCache(kv, keys=load_keys(security))
        self._memory_tier = _memory_tier(self.cache)
        self._tier_totals: dict[str, dict[str, float]] = {}
        self.paged: PagedKV | None = None
        self.failed_blocks: set[int] = set()
        self.held: set[str] = set()
        self.load_samples: list[LoadSample] = []  # for the scheduler (worker_meta)
        self.step = 0
        self._save_time = 0.0  # this step's per-layer copy-out time so far
        # Asynchronous loads started at the step's metadata (prepare_step): their requests and
        # the event that lets them write; start_step sets it where prepare_step did not.
        self._prepared: tuple[set[str], threading.Event] | None = None
        self.writes_at_bind = False  # set in register: may a load write before the forward?
        # Asynchronous loads fetched and reported finished, written in the next step (and
        # those being written in this one, whose buffers go back at its end).
        self._deferred: list[DeferredWrite] = []
        self._writing: list[DeferredWrite] = []
        self.stats = KVStackStats()
        self.finish_wait = FinishWait(self.settings.load_finish_wait)
        self.events = EventCollector(kv.chunk_size) if self.settings.kv_events else None
        if self.events is not None:
            self.cache.add_listener(self.events.on_tier_event)
        self.server = LookupServer(lookup_endpoint(engine_id, self.rank), self._contains_prefix)
        self.cluster = None
        if index is not None:
            from kvstack.cluster.attach import attach_cluster

            # Announces this engine's chunks to the index service and lends its tiers to peers,
            # when the index section enables either; otherwise a no-op.
            name = index.announce.instance_id or engine_id  # a configured name wins
            self.cluster = attach_cluster(
                self.cache, index, instance_id=name, rank=self.rank, security=security
            )

    def _contains_prefix(self, keys: Sequence[bytes]) -> PrefixAnswer:
        chunk_keys = [ChunkKey(k) for k in keys]
        found = self.cache.contains_prefix(chunk_keys)
        if not found or self._memory_tier is None:
            return PrefixAnswer(found, 0)
        held = self._memory_tier.contains_many(chunk_keys[:found])
        return PrefixAnswer(found, next((i for i, hit in enumerate(held) if not hit), found))

    def register(self, kv_cache_config: KVCacheConfig, kv_caches: dict[str, torch.Tensor]) -> None:
        if not self.layout.restorable:
            log.info("kvstack connector idle on this worker: %s", self.layout.unrestorable)
            return
        self.paged = paged = PagedKV(self.layout, kv_cache_config, kv_caches)
        device, modes = paged.device, self.modes
        # On vLLM's CPU build the scheduling is synchronous: when a step's metadata arrives the
        # previous step has finished computing, and this step's forward does not touch the
        # blocks of a request waiting for its load; nor does any zeroing of new blocks, which
        # vLLM does only for Mamba and mixed-precision caches. There an asynchronous load may
        # write as soon as it has fetched. On a GPU the previous step may still be running, so
        # writes wait for start_load_kv, ordered after the step's launch as vLLM orders them.
        self.writes_at_bind = _writes_before_forward(kv_cache_config)
        # Host staging, in chunks of this model: staging_mib for saves and as much for the
        # synchronous loads' buffers kept between steps; each load thread two sets of chunks
        # in an eighth of it.
        staging = self.settings.staging_mib << 20
        save_chunks = staging_chunks(self.shape, staging, MAX_STAGED_CHUNKS)
        kept_chunks = staging_chunks(self.shape, staging, sys.maxsize)
        fetch_chunks = staging_chunks(self.shape, staging // 16, BATCH_CHUNKS)
        # Where a load may write before the forward (synchronous scheduling), it writes in the
        # step after its fetch, beside the forward pass, while its chunks fit staging_mib more.
        defer_chunks = staging_chunks(self.shape, staging, sys.maxsize)
        if not self.writes_at_bind:
            defer_chunks = 0
        # A load thread writes on a GPU side stream while it fetches the next chunks. On the
        # CPU build it writes inline: a background write thread there would share the one
        # spare core of a 2-core host with the load and tier threads, and the interference
        # bench showed no gain from it (the spread between runs was larger than any change).
        with starting_background_threads():
            fetcher = self._fetch_process(defer_chunks)  # inherits the background CPUs
            self.loader = AsyncLoader(
                self.cache, self.shape, self.rank, lambda: paged,
                make_stream(device, False, "kvstack-load", follow_compute=False),
                self.settings.load_threads, self.settings.load_timeout_s,
                fetch_chunks, defer_chunks, fetcher, self._memory_tier,
            )  # fmt: skip
            self.sync_loader = SyncLoader(
                self.cache, self.shape, self.rank,
                make_stream(device, modes.layer_pipelining, "kvstack-layers"),
                modes.layer_pipelining, kept_chunks,
            )  # fmt: skip
            self.saves = SaveQueue(
                self.cache, self.shape, self.rank,
                make_stream(device, modes.layer_pipelining or modes.copy_out_background,
                            "kvstack-copy-out"),
                not modes.copy_out_background, self._remember_tokens, save_chunks,
            )  # fmt: skip
        log.info(
            "kvstack connector: %d layers, %d blocks of %d tokens, %d-byte pages, tiers %s, "
            "copy-out %s, layer pipelining %s, asynchronous loads write %s; staging at most %d "
            "chunks for saves, %d kept for loads, %d a fetch, %d fetched for the next step",
            self.layout.num_layers, paged.num_blocks, self.layout.block_size,
            self.layout.page_bytes, [t.name for t in self.cache.tiers],
            "in the background" if modes.copy_out_background else "on the step",
            "on" if modes.layer_pipelining else "off",
            "in the step after their fetch" if self.writes_at_bind else "from start_load_kv",
            save_chunks, kept_chunks, fetch_chunks, defer_chunks,
        )  # fmt: skip

    def _fetch_process(self, slots: int) -> FetchProcess | None:
        """The helper process of ``load_fetch=process`` (:mod:`.fetch_process`), or None:
        not asked for, no deferred loads (a GPU), or it could not start (logged; the load
        threads fetch)."""
        if self.settings.load_fetch != "process":
            return None
        from kvstack.integrations.vllm.fetch_process import FetchProcess, helper_tiers

        if slots == 0:
            log.info("kvstack connector: load_fetch=process applies where loads are written "
                     "in the step after their fetch (vLLM's CPU build); the load threads "
                     "fetch")  # fmt: skip
            return None
        tiers = helper_tiers(self._kv.tiers)
        try:
            return FetchProcess(
                self._kv, self._security, tiers, self.shape, slots,
                self.settings.load_threads, TIER_COUNTERS,
            )  # fmt: skip
        except Exception as exc:
            log.error("kvstack connector: the fetch helper process did not start (%s); the load "
                      "threads fetch", exc)  # fmt: skip
            return None

    def _remember_tokens(self, key: ChunkKey, chunk: ChunkIO, lora_name: str | None) -> None:
        if self.events is not None and chunk.tokens is not None:
            self.events.remember(key, ChunkInfo(chunk.tokens, chunk.parent, lora_name))

    # -- the step --------------------------------------------------------------------------
    def handle_preemptions(self, meta: KVStackMetadata) -> None:
        if meta.preempted and self.paged is not None:
            self.saves.wait_copies(meta.preempted)

    def prepare_step(self, meta: KVStackMetadata) -> None:
        """The step's metadata, before its forward pass: write the chunks of loads reported
        finished last step (before any attention reads them, :mod:`.loads`), and start the
        step's asynchronous loads now, a step earlier than ``start_load_kv`` on the CPU build."""
        self.finish_wait.step_began(meta.stepping, time.monotonic())
        if self.paged is None or not (self._deferred or meta.async_loads):
            return
        self.handle_preemptions(meta)  # a preempted request's copy-out before its blocks go
        writing = self._write_deferred()
        if not meta.async_loads:
            return
        go = threading.Event()
        if self.writes_at_bind and not writing:
            go.set()  # else at start_step, once the deferred writes are done
        for request in meta.async_loads:
            self.loader.submit(request, go)
        self._prepared = ({r.req_id for r in meta.async_loads}, go)

    def start_step(self, meta: KVStackMetadata) -> None:
        self.step = meta.step
        self.held.update(meta.held)
        if self.paged is None:
            return
        self.handle_preemptions(meta)
        started, go = self._prepared or (set(), None)
        self._prepared = None
        if self._writing and go is not None:
            # A load starting now may have been given blocks a finished, then aborted, request
            # left: it writes only after this step's deferred writes.
            self.sync_loader.finish()
        for request in meta.async_loads:
            if request.req_id not in started:
                self.loader.submit(request)
        if go is not None:
            go.set()
        if meta.loads:
            start = time.perf_counter()
            result = self.sync_loader.start(self.paged, meta.loads)
            self.failed_blocks |= result.failed_blocks
            self.load_samples += result.samples
            self.stats.observe("load_seconds", time.perf_counter() - start)
            self._count_loaded(result.loaded_blocks, result.failed_chunks)
            for req_id in result.failed_req_ids:
                log.warning("kvstack: chunks of request %s did not load; vLLM recomputes them",
                            req_id)  # fmt: skip

    def _write_deferred(self) -> bool:
        """Start writing the chunks of the loads reported finished at the end of the last
        step: the scheduler may run their requests in this step, or another request that
        hits their blocks in vLLM's prefix cache. False when there are none."""
        deferred, self._deferred = self._deferred, []
        if not deferred or self.paged is None:
            return False
        paged = self.paged
        staged = [
            staged_chunk(paged, c, buf)
            for write in deferred
            for c, buf in zip(write.chunks, write.staged, strict=True)
        ]
        self._writing += deferred
        self.stats.add("deferred_write_chunks", len(staged))
        self.sync_loader.write(paged, staged)
        return True

    def _end_deferred(self) -> None:
        """After ``sync_loader.finish``: the deferred writes are done; their buffers go back."""
        writing, self._writing = self._writing, []
        for write in writing:
            write.release()

    def wait_for_layer(self, layer_name: str) -> None:
        if self.paged is not None and self.modes.layer_pipelining:
            layer = self.paged.layer_index.get(layer_name)
            if layer is not None:
                self.sync_loader.wait_for_layer(layer)

    def save_layer(self, layer_name: str, meta: KVStackMetadata) -> None:
        if self.paged is None or not meta.saves or not self.modes.layer_pipelining:
            return
        layer = self.paged.layer_index.get(layer_name)
        if layer is not None:
            start = time.perf_counter()
            self.saves.layer(self.paged, meta.step, meta.saves, layer)
            self._save_time += time.perf_counter() - start

    def end_step(self, meta: KVStackMetadata) -> None:
        if self.paged is None:
            return
        self.sync_loader.finish()
        self._end_deferred()
        if meta.saves:
            start = time.perf_counter()
            self.saves.end(self.paged, meta.step, meta.saves)
            self.stats.observe("save_seconds", time.perf_counter() - start + self._save_time)
            self._save_time = 0.0
        if self.sync_save:
            self.saves.flush()
            self.cache.flush()

    def get_finished(self) -> tuple[set[str] | None, set[str] | None]:
        """(finished sends, finished receives) since the last call."""
        if self.paged is None:
            return None, None
        self._wait_for_near_loads()
        loads = self.loader.take_finished()
        for sample in loads.samples:
            self.finish_wait.observe_fetch(sample.chunks, sample.seconds)
        self._deferred += loads.deferred
        self._count_async(loads)
        sending = {req_id for req_id in self.held if not self.saves.copy_pending(req_id)}
        self.held -= sending
        return sending or None, loads.req_ids or None

    def _wait_for_near_loads(self) -> None:
        """At most ``finish_wait.budget()`` for the loads predicted to end within it."""
        now = time.monotonic()
        self.finish_wait.step_ended(now)
        if self.finish_wait.cap <= 0 or not self.loader.num_pending:
            return  # off (the default), or nothing to wait for: no medians on the step
        budget, per_chunk = self.finish_wait.budget(), self.finish_wait.seconds_per_chunk
        if budget <= 0 or per_chunk is None:
            return
        waited, done = self.loader.wait_near(budget, per_chunk)
        if waited:
            self.stats.add("finish_waits", waited)
            self.stats.add("finish_wait_caught", done)
            self.stats.observe("finish_wait_seconds", time.monotonic() - now)

    def _count_async(self, loads: FinishedLoads) -> None:
        self.failed_blocks |= loads.failed_blocks
        self.load_samples += loads.samples
        for seconds in loads.seconds:
            self.stats.observe("async_load_seconds", seconds)
        for seconds in loads.fetch_seconds:
            self.stats.observe("async_fetch_seconds", seconds)
        self._count_loaded(loads.loaded_blocks, loads.failed_chunks)
        self.stats.add("load_timeouts", loads.timeouts)
        self.stats.add("helper_fetched_chunks", loads.helper_chunks)

    def _count_loaded(self, blocks: int, failed_chunks: int) -> None:
        block_bytes = self.layout.num_layers * self.layout.page_bytes
        self.stats.add("load_tokens", blocks * self.layout.block_size)
        self.stats.add("load_bytes", blocks * block_bytes)
        self.stats.add("load_failed_chunks", failed_chunks)

    def take_failed_blocks(self) -> set[int]:
        failed, self.failed_blocks = self.failed_blocks, set()
        return failed

    def worker_meta(self) -> KVStackWorkerMeta | None:
        """Every step's report: copy-outs done, and the step and load timings that
        ``load_mode=auto`` chooses from (:mod:`.load_cost`)."""
        if self.paged is None:
            return None
        background = self.modes.copy_out_background
        copied = self.saves.copied_through(self.step) if background else self.step
        samples, self.load_samples = self.load_samples, []
        return KVStackWorkerMeta(copied, self.step, samples)

    # -- reporting -------------------------------------------------------------------------
    def take_events(self) -> KVStackKVEvents | None:
        return None if self.events is None else self.events.take()

    def take_stats(self) -> KVStackStats | None:
        self._report_tiers()
        if self.paged is not None:
            counts = self.saves.take_counts()
            self.stats.add("save_chunks", counts.chunks)
            self.stats.add("save_bytes", counts.bytes)
            self.stats.add("save_generated_chunks", counts.generated_chunks)
            self.stats.add("save_skipped_chunks", counts.skipped_chunks)
        if self.stats.is_empty():
            return None
        stats, self.stats = self.stats, KVStackStats()
        return stats

    def _report_tiers(self) -> None:
        """Per-tier counter deltas and gauges (cheap: a snapshot per tier per step), the
        fetch helper process's reads included."""
        if self.paged is not None:
            for name, delta in self.loader.take_tier_counts().items():
                self.stats.add(name, delta)
        for tier in self.cache.tiers:
            current = tier.stats()
            previous = self._tier_totals.setdefault(tier.name, {})
            for name in TIER_COUNTERS:
                value = float(getattr(current, name))
                delta = value - previous.get(name, 0.0)
                previous[name] = value
                if delta:
                    self.stats.add(f"tier:{tier.name}:{name}", delta)
            gauges = {"used_bytes": current.bytes_used, "entries": current.entries}
            for gauge, value in gauges.items():
                if previous.get(gauge) != value:
                    previous[gauge] = value
                    self.stats.set_gauge(f"tier:{tier.name}:{gauge}", value)

    def close(self) -> None:
        """vLLM's worker shutdown: the queued copy-outs and tier writes land first, within
        :func:`shutdown_budget_s`; what is still queued then is dropped (a later miss, never
        wrong KV) and the log says how much."""
        start = time.monotonic()
        budget = shutdown_budget_s(self.settings.shutdown_flush_s)
        queued = self._queued_writes()
        if queued:
            log.info("kvstack connector: writing %d queued chunks before exit (up to %.1f s)",
                     queued, budget)  # fmt: skip
        landed = True
        if self.paged is not None:
            self.loader.close()
            self.sync_loader.finish()
            self._end_deferred()
            landed = self.saves.flush(budget)
            self.saves.close()
        remaining = max(0.0, budget - (time.monotonic() - start))
        landed = self.cache.flush(remaining) and landed
        if queued:
            seconds = time.monotonic() - start
            if landed:
                log.info("kvstack connector: %d queued chunk writes landed before exit "
                         "(%.2f s)", queued, seconds)  # fmt: skip
            else:
                log.warning("kvstack connector: %d of %d queued chunk writes had not landed "
                            "after %.1f s at exit and are dropped (raise shutdown_flush_s and "
                            "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)",
                            self._queued_writes(), queued, seconds)  # fmt: skip
        if self.cluster is not None:
            self.cluster.close()
        self.server.close()
        # Out of budget, writes not started yet are dropped: closing waits only for writes
        # already under way, not another 30 s per tier, so vLLM need not kill the worker.
        self.cache.close(timeout_s=max(0.0, budget - (time.monotonic() - start)))

    @property
    def writes_behind(self) -> bool:
        """Whether some tier writes in the background (anything but the in-memory tier)."""
        return any(tier is not self._memory_tier for tier in self.cache.tiers)

    def _queued_writes(self) -> int:
        """Chunks handed to the save path and not yet in every tier they go to."""
        staged = self.saves.queued_chunks() if self.paged is not None else 0
        tiers = sum(int(t.stats().extra.get("queued_writes", 0)) for t in self.cache.tiers)
        return staged + tiers


def shutdown_budget_s(configured_s: float) -> float:
    """How long :meth:`WorkerSide.close` may flush: ``shutdown_flush_s``, but ending a second
    before vLLM's executor terminates a worker that has not exited
    (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``), so the outcome is still logged."""
    try:
        import vllm.envs as envs
    except ImportError:  # unit tests drive the worker side without vLLM
        return configured_s
    return max(0.0, min(configured_s, float(envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS) - 1.0))


def _memory_tier(cache: KVCache) -> Tier | None:
    from kvstack.kv.tiers.cpu.tier import CPUTier

    first = cache.tiers[0]
    return first if isinstance(first, CPUTier) else None


def _writes_before_forward(kv_cache_config: KVCacheConfig) -> bool:
    """Whether a load may write into the paged blocks as soon as a step's metadata arrives
    (see :meth:`WorkerSide.register`)."""
    return _on_cpu_build() and not getattr(kv_cache_config, "needs_kv_cache_zeroing", True)


def _on_cpu_build() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # unit tests drive the worker side without vLLM
        return False
    return bool(current_platform.is_cpu())
