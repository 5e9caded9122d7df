"""The scheduler side of the connector: lookups, load and save planning, per-request state.

Call order (vLLM's scheduler)::

    on_new_request(r)                  a tracker over r's live token list (prompt, then output)
    get_num_new_matched_tokens(r, n)   cached lookup -> (tokens to load, load_async); no effects
    update_state_after_alloc(r, ...)   block table; the load is planned (async: sent next step)
    build_connector_meta(out)          per step: loads to start, sync loads, saves of full
                                       chunks the step completes (prompt or generated),
                                       preempted requests, finished requests now held
    update_connector_output(o)         copy-outs over, sends done, blocks that failed to load
    request_finished(r) -> hold        True while a background copy-out of r's blocks runs

A load is asynchronous (``load_async``) unless every chunk it needs is in the in-memory tier:
the request then waits in vLLM's ``WAITING_FOR_REMOTE_KVS`` while the others keep stepping,
and the worker reports the finished receive (and any failed blocks) through ``get_finished``.
``load_mode`` sets that choice per engine; with ``request_load_mode`` a request may set its own.
A preempted request resumes through the same lookup, now over its prompt and generated tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvstack.integrations.plan import RequestIO, RequestTracker, block_aligned_hit
from kvstack.integrations.settings import ConnectorSettings, LoadMode
from kvstack.integrations.vllm.load_cost import LoadCost, LoadSample
from kvstack.integrations.vllm.lookup import LookupClient, PrefixAnswer, lookup_endpoint
from kvstack.integrations.vllm.stats import KVStackStats
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import Namespace

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KVStackMetadata", "KVStackWorkerMeta", "SchedulerSide", "namespace_digest"]

log = logging.getLogger(__name__)
LOOKUP_REUSE_S = 1.0  # a waiting request re-asks at most this often
LOAD_MODES: tuple[str, ...] = get_args(LoadMode)
_warned_modes: set[str] = set()  # bad per-request load modes already logged (bounded below)


def requested_load_mode(params: object) -> str | None:
    """A request's own load mode, ``kv_transfer_params: {"kvstack": {"load_mode": M}}``; None
    where it asks none. A value that is not one of :data:`LOAD_MODES` is ignored (the engine
    cannot answer the request with an error from here), logged once per value."""
    ours = params.get("kvstack") if isinstance(params, dict) else None
    mode = ours.get("load_mode") if isinstance(ours, dict) else None
    if mode is None or mode in LOAD_MODES:
        return mode
    shown = repr(mode)[:40]
    if shown not in _warned_modes and len(_warned_modes) < 64:
        _warned_modes.add(shown)
        log.warning(
            "kv_transfer_params.kvstack.load_mode=%s is not one of %s: ignored",
            shown, ", ".join(LOAD_MODES),
        )  # fmt: skip
    return None


@dataclass
class KVStackMetadata(KVConnectorMetadata):
    step: int = 0
    loads: list[RequestIO] = field(default_factory=list)  # before this step's forward pass
    async_loads: list[RequestIO] = field(default_factory=list)  # started now, done later
    saves: list[RequestIO] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)  # their copy-outs end before the forward
    held: list[str] = field(default_factory=list)  # finished; blocks freed once copied out
    stepping: int = 0  # requests with tokens scheduled in this step


@dataclass
class KVStackWorkerMeta(KVConnectorWorkerMetadata):
    copied_through_step: int  # every copy-out of this step and earlier ones is over
    step: int = 0  # the step this report ends
    load_samples: list[LoadSample] = field(default_factory=list)  # loads finished since

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVStackWorkerMeta:
        """Every rank's report in one: the oldest copy-out, the slowest rank's load."""
        theirs = getattr(other, "copied_through_step", self.copied_through_step)
        slowest: dict[str, LoadSample] = {}
        for sample in [*self.load_samples, *getattr(other, "load_samples", [])]:
            if sample.req_id not in slowest or sample.seconds > slowest[sample.req_id].seconds:
                slowest[sample.req_id] = sample
        samples = list(slowest.values())
        step = max(self.step, getattr(other, "step", self.step))
        return KVStackWorkerMeta(min(self.copied_through_step, theirs), step, samples)


def namespace_digest(kv: KVConfig, rank: int, adapter: str, salt: str) -> bytes:
    """Exactly the namespace :class:`kvstack.kv.KVCache` derives for the same config."""
    ns = Namespace(
        kv.model, kv.kv_dtype or "auto", kv.layout_version, rank, kv.tp_size, adapter, salt
    )
    return ns.digest()


@dataclass
class _Lookup:
    num_keys: int
    answer: PrefixAnswer | None  # None while the workers have not answered
    at: float  # when it was asked; once answered, when the answer came
    counted: bool = False
    lookup_id: int = -1


@dataclass
class _PlannedLoad:
    start: int
    asynchronous: bool


class SchedulerSide:
    def __init__(
        self,
        kv: KVConfig,
        block_size: int,
        engine_id: str,
        settings: ConnectorSettings,
        roles: tuple[bool, bool],  # (can_load, can_save)
        copy_out_background: bool,
        unrestorable: str = "",
    ) -> None:
        self.kv, self.block_size, self.settings = kv, block_size, settings
        self.can_load, self.can_save = roles
        self.with_tokens = settings.kv_events
        self.copy_out_background = copy_out_background
        self.enabled = not unrestorable and (self.can_load or self.can_save)
        if unrestorable:
            log.warning("kvstack stores nothing and serves no hit for this model: %s", unrestorable)
        endpoints = [lookup_endpoint(engine_id, rank) for rank in range(kv.tp_size)]
        self.client = LookupClient(endpoints, settings.lookup_timeout_s)
        self.trackers: dict[str, RequestTracker] = {}
        self.lookups: dict[str, _Lookup] = {}
        self.planned: dict[str, _PlannedLoad] = {}
        self.starting: dict[str, RequestIO] = {}  # async loads for the next metadata
        self.last_save_step: dict[str, int] = {}
        self.hold_since: dict[str, float] = {}
        self.new_held: list[str] = []
        self.step = 0
        self.copied_through = 0
        self.stats = KVStackStats()
        self._reported_tracked = -1
        self.cost = LoadCost()  # load_mode=auto's measurements
        self.slow_loads: set[str] = set()  # requests loading from slower tiers, to be timed
        self.stepping = 0  # requests in the latest step with work
        self.load_modes: dict[str, str] = {}  # requests' own load modes (request_load_mode)
        self.loading: set[str] = set()  # asynchronous loads planned and not yet reported done
        self._last_step: tuple[float, set[str], bool] | None = None  # (at, scheduled, loading)

    # -- request lifecycle -----------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        if not self.enabled or request.prompt_token_ids is None:
            return  # prompt embeddings have no token ids to key
        adapter = request.lora_request.lora_name if request.lora_request else ""
        salt = request.cache_salt or ""
        seeds = [namespace_digest(self.kv, r, adapter, salt) for r in range(self.kv.tp_size)]
        self.trackers[request.request_id] = RequestTracker(
            request.request_id, request.all_token_ids, request.num_prompt_tokens, seeds,
            self.kv.chunk_size, self.block_size, adapter or None, self.settings.save_generated,
        )  # fmt: skip
        if self.settings.request_load_mode:
            mode = requested_load_mode(getattr(request, "kv_transfer_params", None))
            if mode is not None:
                self.load_modes[request.request_id] = mode

    def request_finished(self, request: Request) -> bool:
        """Forget the request; True when its blocks must wait for a running copy-out."""
        req_id = request.request_id
        self.trackers.pop(req_id, None)
        self._forget_lookup(req_id)
        self.planned.pop(req_id, None)
        self.slow_loads.discard(req_id)
        self.load_modes.pop(req_id, None)
        self.loading.discard(req_id)
        if req_id in self.starting:  # aborted before its load started: start nothing
            self.starting[req_id] = RequestIO(req_id, [])
        last_save = self.last_save_step.pop(req_id, 0)
        if not self.copy_out_background or last_save <= self.copied_through:
            return False
        self.new_held.append(req_id)
        self.hold_since[req_id] = time.monotonic()
        self.stats.add("held_requests", 1)
        return True

    # -- lookups ---------------------------------------------------------------------------
    def num_new_matched_tokens(
        self, request: Request, num_computed: int
    ) -> tuple[int | None, bool]:
        """(tokens to load, asynchronously?); (None, False) while the workers' answer is still
        on its way: vLLM then leaves the request waiting and asks again next step."""
        tracker = self.trackers.get(request.request_id)
        if not self.can_load or tracker is None or not tracker.num_full_chunks:
            return 0, False
        lookup = self._lookup(tracker)
        if lookup.answer is None:
            self.stats.add("lookup_deferrals", 1)
            return None, False
        tracker.mark_stored(lookup.answer.chunks)
        hit = block_aligned_hit(
            lookup.answer.chunks * self.kv.chunk_size, tracker.num_tokens, self.block_size
        )
        external = max(hit - num_computed, 0)
        if not lookup.counted:
            lookup.counted = True
            self.stats.add("lookup_tokens", max(tracker.num_tokens - num_computed, 0))
            self.stats.add("hit_tokens", external)
        if external == 0:
            return 0, False
        asynchronous = self._asynchronous(request.request_id, lookup.answer, hit, num_computed)
        self.planned[request.request_id] = _PlannedLoad(num_computed, asynchronous)
        return external, asynchronous

    def _asynchronous(
        self, req_id: str, answer: PrefixAnswer, hit_tokens: int, num_computed: int
    ) -> bool:
        mode = self.load_modes.get(req_id, self.settings.load_mode)
        if mode != "auto":
            return mode == "async"
        needed = -(-hit_tokens // self.kv.chunk_size)
        if answer.in_memory >= needed:
            return False
        self.slow_loads.add(req_id)  # its load's timing feeds the cost model
        loading = needed - num_computed // self.kv.chunk_size
        if self.cost.within_step(loading, self.stepping):
            self.stats.add("cost_sync_loads", 1)
            return False
        return True

    def _lookup(self, tracker: RequestTracker) -> _Lookup:
        now = time.monotonic()
        cached = self.lookups.get(tracker.req_id)
        if cached is not None and cached.answer is None:  # asked in an earlier step
            return self._answered(cached)
        keys = tracker.lookup_keys()
        if cached is None or cached.num_keys != len(keys[0]) or now - cached.at > LOOKUP_REUSE_S:
            counted = cached is not None and cached.counted and cached.num_keys == len(keys[0])
            cached = _Lookup(len(keys[0]), None, now, counted, self.client.start(keys))
            self.lookups[tracker.req_id] = cached
            return self._answered(cached)
        return cached

    def _answered(self, lookup: _Lookup) -> _Lookup:
        lookup.answer = self.client.poll(lookup.lookup_id)
        if lookup.answer is not None:
            asked, lookup.at = lookup.at, time.monotonic()  # reused from its answer on
            self.stats.observe("lookup_seconds", lookup.at - asked)
        return lookup

    def _forget_lookup(self, req_id: str) -> None:
        lookup = self.lookups.pop(req_id, None)
        if lookup is not None and lookup.answer is None:
            self.client.cancel(lookup.lookup_id)

    def after_alloc(self, request: Request, block_ids: list[int], num_external: int) -> None:
        req_id = request.request_id
        tracker = self.trackers.get(req_id)
        planned = self.planned.pop(req_id, None)
        self._forget_lookup(req_id)  # a later re-schedule asks afresh
        if tracker is None:
            return
        tracker.set_blocks(block_ids, replace=True)
        if num_external <= 0 or planned is None:
            return
        tracker.set_load(planned.start, num_external)
        if planned.asynchronous:
            loads = tracker.take_loads()
            if loads is not None:
                self.starting[req_id] = loads
        self.stats.add("async_loads" if planned.asynchronous else "sync_loads", 1)
        if planned.asynchronous:
            self.loading.add(req_id)
        if request.num_preemptions > 0:
            self.stats.add("preemption_recoveries", 1)
            self.stats.add("preemption_recovered_tokens", num_external)

    # -- per-step metadata -----------------------------------------------------------------
    def build_meta(self, out: SchedulerOutput) -> KVStackMetadata:
        self.step += 1
        self.stepping = len(out.num_scheduled_tokens)
        self._time_step(out)
        if self.stepping:
            self.cost.step_scheduled(self.step, time.monotonic())
        meta = KVStackMetadata(
            self.step, preempted=set(out.preempted_req_ids or ()), stepping=self.stepping
        )
        meta.async_loads, self.starting = list(self.starting.values()), {}
        meta.held, self.new_held = self.new_held, []
        if meta.preempted:
            self.stats.add("preempted_requests", len(meta.preempted))
        spec = out.scheduled_spec_decode_tokens
        for new in out.scheduled_new_reqs:
            tracker = self.trackers.get(new.req_id)
            if tracker is not None:
                tracker.set_blocks(new.block_ids[0], replace=True)
                after = self._computed_after(tracker, new.num_computed_tokens, out, spec)
                self._take(tracker, after, meta)
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
            after = self._computed_after(tracker, cached.num_computed_tokens[i], out, spec)
            self._take(tracker, after, meta)
        return meta

    def _time_step(self, out: SchedulerOutput) -> None:
        """The time since the last step, where a request ran in both: a decode's inter-token
        latency (a long prompt's chunk to chunk), split by whether an asynchronous load was in
        flight at the last step's start (planned, not yet reported done). vLLM's own ITL
        histogram cannot tell those steps apart; these let an operator, and the interference
        bench, see what loading off the step costs the requests beside it."""
        now, scheduled = time.monotonic(), set(out.num_scheduled_tokens)
        last, self._last_step = self._last_step, (now, scheduled, bool(self.loading))
        if last is not None and not last[1].isdisjoint(scheduled):
            name = "loading_step_interval_seconds" if last[2] else "step_interval_seconds"
            self.stats.observe(name, now - last[0])

    def _computed_after(
        self,
        tracker: RequestTracker,
        before: int,
        out: SchedulerOutput,
        spec: dict[str, list[int]],
    ) -> int:
        """Tokens with KV once the step has run; draft tokens may still be rejected, so their
        KV is not the request's yet."""
        scheduled = out.num_scheduled_tokens.get(tracker.req_id, 0)
        after = before + scheduled - len(spec.get(tracker.req_id, ()))
        again = tracker.note_computed(before, after)
        if again:
            self.stats.add("recomputed_tokens", again)
        return after

    def _take(self, tracker: RequestTracker, after: int, meta: KVStackMetadata) -> None:
        loads = tracker.take_loads()
        if loads is not None:
            meta.loads.append(loads)
        if self.can_save:
            saves = tracker.take_saves(after, self.with_tokens)
            if saves is not None:
                meta.saves.append(saves)
                self.last_save_step[tracker.req_id] = self.step

    # -- worker reports --------------------------------------------------------------------
    def on_worker_output(self, output: KVConnectorOutput) -> None:
        worker = output.kv_connector_worker_meta
        now = time.monotonic()
        if isinstance(worker, KVStackWorkerMeta):
            self.copied_through = max(self.copied_through, worker.copied_through_step)
            self.cost.step_reported(worker.step, now)
            for sample in worker.load_samples:
                if sample.req_id in self.slow_loads:
                    self.slow_loads.discard(sample.req_id)
                    self.cost.observe_load(sample.chunks, sample.seconds, sample.within_step)
        self.loading.difference_update(output.finished_recving or ())
        for req_id in output.finished_sending or ():
            since = self.hold_since.pop(req_id, None)
            if since is not None:
                self.stats.observe("hold_seconds", now - since)
        if output.invalid_block_ids:
            for tracker in self.trackers.values():
                chunks = tracker.chunks_of_blocks(output.invalid_block_ids)
                if chunks:  # not stored after all: save them once recomputed
                    tracker.forget_stored_from(chunks[0])

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
