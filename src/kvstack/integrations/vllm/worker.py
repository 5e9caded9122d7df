"""The worker side of the connector: the KV cache tiers, block copies, the lookup server.

Per step (vLLM's model runner): ``start_load_kv`` before the forward pass loads the chunks the
scheduler planned, straight into the engine's paged KV; chunks that cannot be loaded (evicted,
corrupt, a tier down) are reported through ``get_block_ids_with_load_errors`` and vLLM
recomputes them. ``wait_for_save`` after the forward pass copies newly computed full chunks out
of the paged buffer and hands them to the cache; slow tiers write them in the background (or
before returning, in ``sync`` save mode). Nothing is held across steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvstack.cluster.config import IndexConfig
from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.events import ChunkInfo, EventCollector, KVStackKVEvents
from kvstack.integrations.vllm.layout import PagedKV, PagedLayout
from kvstack.integrations.vllm.lookup import LookupServer, lookup_endpoint
from kvstack.integrations.vllm.scheduler import KVStackMetadata
from kvstack.integrations.vllm.stats import TIER_COUNTERS, KVStackStats
from kvstack.kv.affinity import reserve_background_cpus, starting_background_threads
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey
from kvstack.security import SecurityConfig, load_keys

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvstack.kv.cache import KVCache

__all__ = ["WorkerSide"]

log = logging.getLogger(__name__)


class WorkerSide:
    def __init__(
        self,
        kv: KVConfig,
        layout: PagedLayout,
        engine_id: str,
        rank: int,
        sync_save: bool,
        events: bool,
        index: IndexConfig | None = None,
        security: SecurityConfig | None = None,
    ) -> None:
        self.layout = layout
        self.rank = rank
        self.sync_save = sync_save
        self.blocks_per_chunk = kv.chunk_size // layout.block_size
        if _on_cpu_build():
            # The worker is bound to the cores the model computes on: tier writers, lookups
            # and peer threads run on the others (the scheduler's), as NIXL's transfers do.
            reserve_background_cpus()
        with starting_background_threads():
            self._start(kv, engine_id, rank, events, index, security or SecurityConfig())

    def _start(
        self,
        kv: KVConfig,
        engine_id: str,
        rank: int,
        events: bool,
        index: IndexConfig | None,
        security: SecurityConfig,
    ) -> None:
        # Imported here, not at module level: vLLM's API server process imports this module to
        # find the connector class, and must not register the cache's (idle) metrics there.
        from kvstack.kv.cache import KVCache

        # With a cluster secret, chunks are sealed and checked at every shared tier boundary.
        self.cache: KVCache = KVCache(kv, keys=load_keys(security))
        self._tier_totals: dict[str, dict[str, float]] = {}
        self.paged: PagedKV | None = None
        self.failed_blocks: set[int] = set()
        self.stats = KVStackStats()
        self.events = EventCollector(kv.chunk_size) if events else None
        if self.events is not None:
            self.cache.add_listener(self.events.on_tier_event)
        self._staging: list[torch.Tensor] = []
        self.server = LookupServer(lookup_endpoint(engine_id, rank), self._contains_prefix)
        self.cluster = None
        if index is not None:
            from kvstack.cluster.attach import attach_cluster

            # Announces this engine's chunks to the index service and lends its tiers to peers,
            # when the index section enables either; otherwise a no-op.
            name = index.announce.instance_id or engine_id  # a configured name wins
            self.cluster = attach_cluster(
                self.cache, index, instance_id=name, rank=rank, security=security
            )

    def _contains_prefix(self, keys: Sequence[bytes]) -> int:
        return self.cache.contains_prefix([ChunkKey(k) for k in keys])

    def register(self, kv_cache_config: KVCacheConfig, kv_caches: dict[str, torch.Tensor]) -> None:
        self.paged = PagedKV(self.layout, kv_cache_config, kv_caches)
        log.info(
            "kvstack connector: %d layers, %d blocks of %d tokens, %d-byte pages, tiers %s",
            self.layout.num_layers,
            self.paged.num_blocks,
            self.layout.block_size,
            self.layout.page_bytes,
            [t.name for t in self.cache.tiers],
        )

    # -- loads -----------------------------------------------------------------------------
    def load(self, meta: KVStackMetadata) -> None:
        for request in meta.loads:
            start = time.perf_counter()
            loaded = self._load_request(request)
            self.stats.observe("load_seconds", time.perf_counter() - start)
            tokens = sum(len(c.block_ids) for c in request.chunks[:loaded]) * self.layout.block_size
            self.stats.add("load_tokens", tokens)
            self.stats.add("load_bytes", tokens // self.layout.block_size * self._block_bytes)

    def _load_request(self, request: RequestIO) -> int:
        assert self.paged is not None, "register_kv_caches was not called"
        chunks = request.chunks
        buffers = self._staging_buffers(len(chunks))
        keys = [ChunkKey(c.keys[self.rank]) for c in chunks]
        loaded = self.cache.get_chunks_into(keys, buffers)
        for chunk, buf in zip(chunks[:loaded], buffers, strict=False):
            end = chunk.first_block + len(chunk.block_ids)
            self.paged.scatter(chunk.block_ids, buf[:, chunk.first_block : end])
        if loaded < len(chunks):
            failed = chunks[loaded:]
            self.failed_blocks.update(b for c in failed for b in c.block_ids)
            self.stats.add("load_failed_chunks", len(failed))
            log.warning(
                "kvstack: %d of %d chunks of request %s could not be loaded; vLLM recomputes them",
                len(failed),
                len(chunks),
                request.req_id,
            )
        return loaded

    def _staging_buffers(self, count: int) -> list[torch.Tensor]:
        shape = self.layout.chunk_shape(self.blocks_per_chunk)
        pin = self.paged is not None and self.paged.device.type == "cuda"
        while len(self._staging) < count:
            self._staging.append(torch.empty(shape, dtype=torch.uint8, pin_memory=pin))
        return self._staging[:count]

    @property
    def _block_bytes(self) -> int:
        return self.layout.num_layers * self.layout.page_bytes

    def take_failed_blocks(self) -> set[int]:
        failed, self.failed_blocks = self.failed_blocks, set()
        return failed

    # -- saves -----------------------------------------------------------------------------
    def save(self, meta: KVStackMetadata) -> None:
        if not meta.saves:
            return
        start = time.perf_counter()
        for request in meta.saves:
            for chunk in request.chunks:
                self._save_chunk(chunk, request.lora_name)
        if self.sync_save:
            self.cache.flush()
        self.stats.observe("save_seconds", time.perf_counter() - start)

    def _save_chunk(self, chunk: ChunkIO, lora_name: str | None) -> None:
        assert self.paged is not None, "register_kv_caches was not called"
        key = ChunkKey(chunk.keys[self.rank])
        if self.cache.contains_prefix([key]):
            self.stats.add("save_skipped_chunks", 1)
            return
        if self.events is not None and chunk.tokens is not None:
            self.events.remember(key, ChunkInfo(chunk.tokens, chunk.parent, lora_name))
        shape = self.layout.chunk_shape(self.blocks_per_chunk)
        # Gather straight into the first tier's memory when it offers it (one copy, not two).
        target = self.cache.prepare_put(key, torch.uint8, shape)
        if target is not None:
            ok = False
            try:
                self.paged.gather(chunk.block_ids, target)
                ok = True
            finally:
                stored = self.cache.complete_put(key, ok)
        else:
            target = self._staging_buffers(1)[0]
            self.paged.gather(chunk.block_ids, target)
            stored = bool(self.cache.put_chunks([key], [target]))
        if stored:
            self.stats.add("save_chunks", 1)
            self.stats.add("save_bytes", target.numel())

    # -- reporting -------------------------------------------------------------------------
    def take_events(self) -> KVStackKVEvents | None:
        return None if self.events is None else self.events.take()

    def take_stats(self) -> KVStackStats | None:
        self._report_tiers()
        if self.stats.is_empty():
            return None
        stats, self.stats = self.stats, KVStackStats()
        return stats

    def _report_tiers(self) -> None:
        """Per-tier counter deltas and gauges (cheap: a snapshot per tier per step)."""
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
        if self.cluster is not None:
            self.cluster.close()
        self.server.close()
        self.cache.close()


def _on_cpu_build() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:  # unit tests drive the worker side without vLLM
        return False
    return bool(current_platform.is_cpu())
