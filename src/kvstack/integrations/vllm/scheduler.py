"""The scheduler side of the connector: lookups, load and save planning, per-request state.

Call order per engine step (vLLM's scheduler): ``on_new_request`` when a request arrives;
``get_num_new_matched_tokens`` while it waits (maybe several times; no external effects here —
only a cached lookup); ``update_state_after_alloc`` once blocks are allocated; then
``build_connector_meta`` for the step, which turns pending loads and newly computed full prompt
chunks into :class:`KVStackMetadata` for the workers; ``request_finished`` drops the state.
Loads are synchronous (done by the worker before the forward pass), so no blocks are ever held
past a step and preempted or aborted requests leave nothing behind.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvstack.integrations.plan import RequestIO, RequestTracker, block_aligned_hit
from kvstack.integrations.vllm.lookup import LookupClient, lookup_endpoint
from kvstack.integrations.vllm.stats import KVStackStats
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import Namespace, chunk_keys

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

__all__ = ["KVStackMetadata", "SchedulerSide", "namespace_digest"]

log = logging.getLogger(__name__)
LOOKUP_REUSE_S = 1.0  # a waiting request re-asks at most this often


@dataclass
class KVStackMetadata(KVConnectorMetadata):
    loads: list[RequestIO] = field(default_factory=list)
    saves: list[RequestIO] = field(default_factory=list)


def namespace_digest(kv: KVConfig, rank: int, adapter: str, salt: str) -> bytes:
    """Exactly the namespace :class:`kvstack.kv.KVCache` derives for the same config."""
    ns = Namespace(
        kv.model, kv.kv_dtype or "auto", kv.layout_version, rank, kv.tp_size, adapter, salt
    )
    return ns.digest()


@dataclass
class _Lookup:
    chunks: int
    at: float
    counted: bool = False


class SchedulerSide:
    def __init__(
        self,
        kv: KVConfig,
        block_size: int,
        engine_id: str,
        lookup_timeout_s: float,
        can_load: bool,
        can_save: bool,
        with_tokens: bool,
    ) -> None:
        self.kv = kv
        self.block_size = block_size
        self.can_load, self.can_save, self.with_tokens = can_load, can_save, with_tokens
        endpoints = [lookup_endpoint(engine_id, rank) for rank in range(kv.tp_size)]
        self.client = LookupClient(endpoints, lookup_timeout_s)
        self.trackers: dict[str, RequestTracker] = {}
        self.local_hits: dict[str, int] = {}
        self.lookups: dict[str, _Lookup] = {}
        self.stats = KVStackStats()
        self._reported_tracked = -1

    # -- request lifecycle -----------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        prompt = list(request.prompt_token_ids or [])
        adapter = request.lora_request.lora_name if request.lora_request else ""
        salt = request.cache_salt or ""
        keys = [
            chunk_keys(prompt, namespace_digest(self.kv, rank, adapter, salt), self.kv.chunk_size)
            for rank in range(self.kv.tp_size)
        ]
        self.trackers[request.request_id] = RequestTracker(
            request.request_id, prompt, keys, self.kv.chunk_size, self.block_size, adapter or None
        )

    def request_finished(self, request: Request) -> None:
        self.trackers.pop(request.request_id, None)
        self.local_hits.pop(request.request_id, None)
        self.lookups.pop(request.request_id, None)

    # -- lookups ---------------------------------------------------------------------------
    def num_new_matched_tokens(self, request: Request, num_computed: int) -> int:
        tracker = self.trackers.get(request.request_id)
        if not self.can_load or tracker is None or not tracker.num_full_chunks:
            return 0
        lookup = self._lookup(tracker)
        tracker.mark_stored(lookup.chunks)
        hit = block_aligned_hit(
            lookup.chunks * self.kv.chunk_size, len(tracker.prompt), self.block_size
        )
        external = max(hit - num_computed, 0)
        if not lookup.counted:
            lookup.counted = True
            self.stats.add("lookup_tokens", max(len(tracker.prompt) - num_computed, 0))
            self.stats.add("hit_tokens", external)
        self.local_hits[request.request_id] = num_computed
        return external

    def _lookup(self, tracker: RequestTracker) -> _Lookup:
        now = time.monotonic()
        cached = self.lookups.get(tracker.req_id)
        if cached is None or now - cached.at > LOOKUP_REUSE_S:
            chunks = self.client.prefix(tracker.keys)
            cached = _Lookup(chunks, now, cached.counted if cached else False)
            self.lookups[tracker.req_id] = cached
        return cached

    def after_alloc(self, request: Request, block_ids: list[int], num_external: int) -> None:
        tracker = self.trackers.get(request.request_id)
        if tracker is None:
            return
        tracker.set_blocks(block_ids, replace=True)
        if num_external > 0:
            tracker.set_load(self.local_hits.get(request.request_id, 0), num_external)
        self.lookups.pop(request.request_id, None)  # a later re-schedule asks afresh

    # -- per-step metadata -----------------------------------------------------------------
    def build_meta(self, out: SchedulerOutput) -> KVStackMetadata:
        meta = KVStackMetadata()
        if out.preempted_req_ids:
            self.stats.add("preempted_requests", len(out.preempted_req_ids))
        for new in out.scheduled_new_reqs:
            tracker = self.trackers.get(new.req_id)
            if tracker is not None:
                tracker.set_blocks(new.block_ids[0], replace=True)
                computed = new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0)
                self._plan(tracker, computed, meta)
        cached = out.scheduled_cached_reqs
        if cached.resumed_req_ids:
            self.stats.add("resumed_requests", len(cached.resumed_req_ids))
        for i, req_id in enumerate(cached.req_ids):
            tracker = self.trackers.get(req_id)
            if tracker is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                tracker.set_blocks(new_ids[0], replace=req_id in cached.resumed_req_ids)
            computed = cached.num_computed_tokens[i] + out.num_scheduled_tokens.get(req_id, 0)
            self._plan(tracker, computed, meta)
        return meta

    def _plan(
        self, tracker: RequestTracker, computed_after_step: int, meta: KVStackMetadata
    ) -> None:
        loads = tracker.take_loads()
        if loads is not None:
            meta.loads.append(loads)
        if self.can_save:
            saves = tracker.take_saves(computed_after_step, self.with_tokens)
            if saves is not None:
                meta.saves.append(saves)

    def take_stats(self) -> KVStackStats | None:
        if len(self.trackers) != self._reported_tracked:
            self._reported_tracked = len(self.trackers)
            self.stats.set_gauge("tracked_requests", self._reported_tracked)
        if self.stats.is_empty():
            return None
        stats, self.stats = self.stats, KVStackStats()
        return stats

    def close(self) -> None:
        self.client.close()
