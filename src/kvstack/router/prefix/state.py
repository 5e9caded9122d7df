"""``PrefixState``: the router's knowledge of which backend holds which prompt prefix.

One :class:`~kvstack.index.radix.RadixIndex` with these owners per backend:

- ``routed``: the router's own belief, learnt from its routing decisions (inserted at
  dispatch while the backend is in *approximate* mode); bounded by the engine's KV capacity
  (``vllm:cache_config_info``) and a TTL, so it forgets roughly as the engine evicts.
- ``inflight``: in *precise* mode, the prompts of requests running there now (locked until
  they end, then kept a few seconds): an engine holds the blocks of its running requests, and
  KV events for them may not have arrived yet — this keeps a burst of same-prefix requests
  together. (After a gap the routed belief starts over from the routing that follows.)
- ``gpu``, ``cpu``, ``disk`` (...): what the engine's KV events report (precise mode).

A backend is *precise* when its events are flowing with a complete history; an unrecoverable
gap (or an invalid event) drops what the events said and puts it in approximate mode until
events have rebuilt the picture for ``recover_after_s``. ``kvstack_router_prefix_precise``
says which mode each backend is in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvstack.index.radix import Owner, OwnerPolicy, PrefixMatch, RadixIndex
from kvstack.metrics import counter, gauge
from kvstack.router.fleet.backends import BackendPool, BackendView
from kvstack.router.prefix.blocks import BlockTracker
from kvstack.router.prefix.events import KVEventBatch
from kvstack.router.prefix.shared import SharedTierLookup
from kvstack.router.prefix.sources import EventStreams
from kvstack.router.prefix.view import PrefixView
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.router.scheduling.prompts import PromptRenderer
from kvstack.router.scheduling.tokenizers import PromptTokens

__all__ = ["PrefixState"]

log = logging.getLogger(__name__)
INFLIGHT_TTL_S = 3.0
DEFAULT_CAPACITY_TOKENS = 1 << 20
EVENT_TIERS = ("gpu", "cpu", "disk")

PRECISE = gauge(
    "kvstack_router_prefix_precise",
    "1 while a backend's prefix knowledge comes from its KV events, 0 in approximate mode",
    ["backend"],
)
EVENTS = counter(
    "kvstack_router_kv_events_total",
    "KV event outcomes per backend: batch, gap (lost), invalid, restart",
    ["backend", "kind"],
)
CHECKS = counter(
    "kvstack_router_prefix_checks_total",
    "Finished prompts found (match) or not (mismatch) in their backend's KV events",
    ["backend", "result"],
)
CHECK_MIN_TOKENS = 512  # two blocks of the largest common block size
CHECK_ALL_FIRST = 50  # check every prompt at first, then one in CHECK_EVERY
CHECK_EVERY = 16
MISMATCHES_TO_GIVE_UP = 20


@dataclass
class BackendMode:
    has_events: bool = False
    precise_from: float | None = None  # monotonic time from which events are trusted
    invalid: str = ""
    checks: int = 0
    matches: int = 0

    def precise(self, now: float) -> bool:
        return (
            self.has_events
            and not self.invalid
            and self.precise_from is not None
            and now >= self.precise_from
        )


class PrefixState:
    def __init__(self, config: PrefixConfig | None = None, pool: BackendPool | None = None):
        self.config = config or PrefixConfig()
        radix = self.config.index
        self.index = RadixIndex(page_size=radix.page_size, max_tokens=radix.max_tokens)
        self.renderer = PromptRenderer(self.config)
        self.shared = SharedTierLookup(self.config)
        self.pool = pool
        self.trackers: dict[str, BlockTracker] = {}
        self.modes: dict[str, BackendMode] = {}
        self.streams = EventStreams(self.config.events, self)
        self._capacity: dict[str, int | None] = {}
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.renderer.start()
        await self.shared.start()
        self.maintain()  # subscribe at once: events from the first requests must not be missed
        self._task = asyncio.create_task(self._maintain(), name="prefix-state")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.streams.close()
        await self.shared.close()

    async def prepare(self, request: RoutingRequest) -> None:
        """Render the prompt (long ones on a worker thread) and look up kvstack tiers."""
        backends = self.pool.states() if self.pool is not None else []
        await self.renderer.prepare(request, backends)
        hits = await self.shared.lookup(self.prompt(request, backends), backends)
        if hits:
            request.state.tier_hits = hits

    async def _maintain(self) -> None:
        while True:
            self.maintain()
            await asyncio.sleep(1.0)

    def maintain(self) -> None:
        """Follow the pool (subscriptions, forgotten backends), expire TTLs, refresh gauges."""
        if self.pool is not None:
            states = self.pool.states()
            for backend_id in self.streams.reconcile(states):
                self._forget(backend_id)
            for state in states:
                self.modes.setdefault(state.id, BackendMode()).has_events = state.id in self.streams
        self.index.expire()
        now = time.monotonic()
        for backend_id, mode in self.modes.items():
            PRECISE.labels(backend_id).set(int(mode.precise(now)))

    def _forget(self, backend_id: str) -> None:
        tracker = self.trackers.pop(backend_id, None)
        if tracker is not None:
            tracker.clear()
        for tier in ("routed", "inflight"):
            self.index.drop_owner(Owner(backend_id, tier))
        self.modes.pop(backend_id, None)
        try:
            PRECISE.remove(backend_id)
        except KeyError:
            pass

    def is_precise(self, backend_id: str) -> bool:
        mode = self.modes.get(backend_id)
        return mode is not None and mode.precise(time.monotonic())

    # -- questions -------------------------------------------------------------------------
    def prompt(self, request: RoutingRequest, backends: Sequence[BackendView]) -> PromptTokens:
        return self.renderer.render(request, backends)

    def view(self, request: RoutingRequest, backends: Sequence[BackendView]) -> PrefixView:
        """Each backend's matched prefix of the request, per tier (memoized per request)."""
        prompt = self.prompt(request, backends)
        match = request.state.prefix_match
        if match is None:
            match = self.index.match(prompt.namespace, prompt.tokens)
            request.state.prefix_match = match
        shared = request.state.tier_hits
        now = time.monotonic()
        tiers: dict[str, dict[str, int]] = {}
        fullness: dict[str, float] = {}
        precise = set()
        for b in backends:
            mode = self.modes.get(b.id)
            is_precise = prompt.exact and mode is not None and mode.precise(now)
            tiers[b.id] = _backend_tiers(match, b.id, is_precise, shared.get(b.id) or _NO_TIERS)
            fullness[b.id] = self.fullness(b, is_precise)
            if is_precise:
                precise.add(b.id)
        return PrefixView(len(prompt.tokens), prompt.exact, tiers, frozenset(precise), fullness)

    def fullness(self, backend: BackendView, precise: bool) -> float:
        """The share of the backend's KV capacity that holds cached prefixes, as its events
        (precise) or the router's routing (approximate) tell; 0 when its capacity is unknown.

        In precise mode the prompts in flight count too: their blocks reach the events only
        after their prefill, and a burst routed in between would otherwise see an engine as
        emptier than it is and pile onto it (the routed belief counts them at dispatch). The
        sum counts a prefix both in flight and stored twice: it errs towards spreading."""
        capacity = self._capacity.get(backend.id) or _engine_capacity(backend)
        if not capacity:
            return 0.0
        if precise:
            held = self.index.owned_tokens(Owner(backend.id, "gpu"))
            held += self.index.owned_tokens(Owner(backend.id, "inflight"))
        else:
            held = self.index.owned_tokens(Owner(backend.id, "routed"))
        return min(1.0, held / capacity)

    # -- RequestObserver: the routed belief -----------------------------------------------
    def on_dispatch(self, request: RoutingRequest, backend: BackendView) -> None:
        prompt = self.prompt(request, [backend])
        self._update_capacity(backend)
        # One insert per dispatch: the routed belief while approximate; in precise mode the
        # events are the belief and only the running prompts are added (until events cover them).
        precise = prompt.exact and self.is_precise(backend.id)
        owner = Owner(backend.id, "inflight" if precise else "routed")
        done = self.index.insert(prompt.namespace, prompt.tokens, owner, lock=True)
        locks = [] if done.lock is None else [(owner, done.lock)]
        request.state.radix_locks[backend.id] = locks

    def on_first_token(self, request: RoutingRequest, backend: BackendView, ttft_s: float) -> None:
        return None

    def on_finish(self, request: RoutingRequest, backend: BackendView, outcome: str) -> None:
        for owner, node in request.state.radix_locks.pop(backend.id, []):
            self.index.unlock(node, owner)
        if outcome == "ok":
            self._check_events(request, backend.id)

    def _check_events(self, request: RoutingRequest, backend_id: str) -> None:
        """Validate what precise mode relies on: a prompt the engine has just served must be
        in its KV events under the router's own token ids. If none of the first prompts ever
        is, the router tokenizes differently from the engine: approximate mode, said loudly."""
        prompt = request.state.prompt
        mode = self.modes.get(backend_id)
        if prompt is None or not prompt.exact or len(prompt.tokens) < CHECK_MIN_TOKENS:
            return
        if mode is None or not mode.precise(time.monotonic()):
            return
        mode.checks += 1
        if mode.checks > CHECK_ALL_FIRST and mode.checks % CHECK_EVERY:
            return
        held = self.index.match(prompt.namespace, prompt.tokens).tokens(Owner(backend_id, "gpu"))
        CHECKS.labels(backend_id, "match" if held else "mismatch").inc()
        mode.matches += bool(held)
        if not mode.matches and mode.checks >= MISMATCHES_TO_GIVE_UP:
            self.invalid(
                backend_id,
                f"none of {mode.checks} served prompts appeared in its KV events: the router "
                "tokenizes differently from the engine (set router.prefix.tokenizers to the "
                "engine's model)",
            )

    def _update_capacity(self, backend: BackendView) -> None:
        capacity = self.config.index.routed_capacity_tokens or _engine_capacity(backend)
        if backend.id in self._capacity and self._capacity[backend.id] == capacity:
            return
        self._capacity[backend.id] = capacity
        routed_ttl = self.config.index.routed_ttl_s
        cap = capacity or DEFAULT_CAPACITY_TOKENS
        self.index.set_policy(Owner(backend.id, "routed"), OwnerPolicy(cap, routed_ttl))
        self.index.set_policy(Owner(backend.id, "inflight"), OwnerPolicy(None, INFLIGHT_TTL_S))

    # -- EventSink: precise mode -----------------------------------------------------------
    def tracker(self, backend_id: str) -> BlockTracker:
        tracker = self.trackers.get(backend_id)
        if tracker is None:
            tracker = self.trackers[backend_id] = BlockTracker(
                backend_id, self.index, lambda: self._base_models(backend_id)
            )
        return tracker

    def _base_models(self, backend_id: str) -> list[str]:
        state = self.pool.get(backend_id) if self.pool is not None else None
        if state is None:
            return []
        return sorted(m for m in state.models if m not in state.adapters)

    def started(self, backend_id: str, complete: bool) -> None:
        mode = self.modes.setdefault(backend_id, BackendMode(has_events=True))
        wait_s = 0.0 if complete else self.config.events.recover_after_s
        mode.precise_from = time.monotonic() + wait_s
        if not complete:
            log.info("%s: KV events from mid-stream; approximate for %.0f s", backend_id, wait_s)

    def batch(self, backend_id: str, batch: KVEventBatch) -> None:
        self.tracker(backend_id).apply(batch)
        EVENTS.labels(backend_id, "batch").inc()

    def lost(self, backend_id: str, reason: str) -> None:
        log.warning(
            "%s: KV events lost (%s); approximate mode while they rebuild", backend_id, reason
        )
        EVENTS.labels(backend_id, "gap").inc()
        self.tracker(backend_id).clear()
        self.started(backend_id, complete=False)

    def invalid(self, backend_id: str, reason: str) -> None:
        log.error("%s: KV events unusable, approximate mode from now on: %s", backend_id, reason)
        EVENTS.labels(backend_id, "invalid").inc()
        self.tracker(backend_id).clear()
        self.modes.setdefault(backend_id, BackendMode(has_events=True)).invalid = reason


_NO_TIERS: dict[str, int] = {}  # read only


def _engine_capacity(backend: BackendView) -> int | None:
    """Tokens of KV the engine holds (``vllm:cache_config_info``), when scraped."""
    engine = backend.engine
    if engine is None or not engine.num_gpu_blocks or not engine.block_size:
        return None
    return engine.num_gpu_blocks * engine.block_size


def _backend_tiers(
    match: PrefixMatch, backend_id: str, precise: bool, index_tiers: dict[str, int]
) -> dict[str, int]:
    inflight = match.tokens(Owner(backend_id, "inflight"))
    if precise:
        tiers = {t: match.tokens(Owner(backend_id, t)) for t in EVENT_TIERS}
        tiers["gpu"] = max(tiers["gpu"], inflight)
    else:
        routed = max(match.tokens(Owner(backend_id, "routed")), inflight)
        if not index_tiers:  # the common case: the routed belief alone, no copy to filter
            return {"routed": routed} if routed else {}
        tiers = {"routed": routed}
    for tier, n in index_tiers.items():
        tiers[tier] = max(tiers.get(tier, 0), n)
    return {t: n for t, n in tiers.items() if n}
