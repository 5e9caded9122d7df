"""The adapter cache manager: the router's one entry point for adapter residency.

Per engine it tracks adapters hot (loaded), warm (verified files on the host) or cold (only in
the artifact store), and per request decides, under the request class's cold-start budget:

    decision = await manager.ensure_hot(engine_url, resolution.adapter, "interactive")
    ... forward with model=decision.model, add decision.headers() ...
    decision.finish(ttft_s=..., ok=..., served_model=response_model)

Loads are single-flight per (engine, adapter): concurrent requests for a cold adapter share one
load. A request that arrives while the prediction for its adapter's tier exceeds its budget is
not made to wait: it falls back to the base model (when its tenant allows) or is refused with
Retry-After, and a prewarm starts either way. A remote prefill step (prefill/decode
disaggregation) uses the adapter only where it is hot already (:meth:`hold_for_prefill`).
In-flight requests keep their version: an adapter with requests in flight is never unloaded,
and a superseded version is unloaded once its last request finishes. Reconciliation and sweeps
live in :mod:`kvstack.lora.upkeep`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstack.errors import AdapterLoadError, LoRAError, VerificationError
from kvstack.lora.adapters import AdapterVersion, split_engine_name
from kvstack.lora.affinity import affinity_scores, rendezvous_order
from kvstack.lora.audit import AuditLog
from kvstack.lora.config import AdapterEngineSpec, LoRAConfig, RequestClassBudget
from kvstack.lora.decision import AdapterDecision
from kvstack.lora.driver import EngineDriver, HTTPEngineDriver
from kvstack.lora.facts_builder import FactsBuilder
from kvstack.lora.loader import AdapterLoader, EngineState
from kvstack.lora.metrics import LoRAMetrics
from kvstack.lora.policy import make_policy
from kvstack.lora.predict import LoadTimePredictor, reload_estimate
from kvstack.lora.residency import EngineCache, ResidencyTier
from kvstack.lora.resolver import AdapterResolution, Resolver
from kvstack.lora.rollback import AutoRollback
from kvstack.lora.rules import CacheRules
from kvstack.lora.serving import not_now, serve
from kvstack.lora.stats import StatsTable
from kvstack.lora.store import ArtifactStore
from kvstack.lora.verify import Verifier
from kvstack.lora.warmup import WarmupSchedule

__all__ = ["AdapterCacheManager", "EngineResidency"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineResidency:
    """One engine's adapters, for the router's LoRA affinity scorer."""

    url: str
    base_model: str
    hot: tuple[str, ...]
    warm: tuple[str, ...]  # warm but not hot
    loading: tuple[str, ...]
    free_hot_slots: int
    free_warm_slots: int


class AdapterCacheManager:
    def __init__(
        self,
        config: LoRAConfig,
        resolver: Resolver,
        store: ArtifactStore,
        verifier: Verifier,
        audit: AuditLog | None = None,
        driver: EngineDriver | None = None,
        clock: Callable[[], float] = time.time,
        metrics: LoRAMetrics | None = None,
        time_scale: float = 1.0,
    ) -> None:
        self.config = config
        # Simulated engines run faster than the wall clock: budgets (in the clock's seconds)
        # become wall-clock timeouts divided by this.
        self.time_scale = time_scale
        self.policy_config = config.adapter_cache_policy
        self.resolver = resolver
        self.rules = CacheRules(self.policy_config)
        self.clock = clock
        self.metrics = metrics or LoRAMetrics(config.metrics_top_k)
        self.predictor = LoadTimePredictor(config.load_time_prior_s)
        self.warmups = WarmupSchedule(config.scheduled_warmups, clock())
        self.facts = FactsBuilder(resolver, self.warmups, self.policy_config.qps_window_s)
        self.driver: EngineDriver = driver or HTTPEngineDriver()
        self.loader = AdapterLoader(
            config,
            store,
            verifier,
            self.driver,
            self.predictor,
            self.metrics,
            audit,
            clock,
            self.is_protected,
        )
        self.rollback = AutoRollback(resolver, audit, self.metrics, clock)
        self.engines: dict[str, EngineState] = {}
        self._homes: dict[str, list[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        for spec in config.engines:
            self.add_engine(spec)

    # -- engines --------------------------------------------------------------------------

    def add_engine(self, spec: AdapterEngineSpec) -> None:
        policy = self.policy_config
        warm_dir = Path(spec.warm_dir).expanduser()
        warm_dir.mkdir(parents=True, exist_ok=True)
        stats = StatsTable(policy.qps_window_s)
        cache = EngineCache(
            spec.gpu_slots or policy.gpu_slots_per_base_model,
            spec.host_slots or policy.host_slots_per_base_model,
            make_policy(policy, self.config.priority_weights),
            facts=lambda entry, now: self.facts.of(
                entry.adapter, entry, stats, now, self.home_rank(spec.url, entry.adapter)
            ),
            pinned=self.rules.pinned,
            reload_s=lambda entry, tier: reload_estimate(
                self.predictor, stats, spec.url, entry, tier
            ),
        )
        engine_dir = spec.engine_warm_dir or str(warm_dir)
        self.engines[spec.url] = EngineState(spec, cache, stats, warm_dir, engine_dir)
        self._homes.clear()

    def remove_engine(self, url: str) -> None:
        self.engines.pop(url, None)
        self._homes.clear()

    def home_rank(self, engine_url: str, adapter: AdapterVersion) -> int:
        """The engine's place in the adapter's rendezvous order among engines of its base model
        (0: its home); rules use it to pin an adapter on a few engines rather than all."""
        order = self._homes.get(adapter.engine_name)
        if order is None:
            if len(self._homes) > 100_000:
                self._homes.clear()
            urls = [u for u, e in self.engines.items() if e.spec.base_model == adapter.base_model]
            order = self._homes[adapter.engine_name] = rendezvous_order(adapter.engine_name, urls)
        return order.index(engine_url) if engine_url in order else len(order)

    def engine(self, url: str) -> EngineState:
        try:
            return self.engines[url]
        except KeyError:
            raise LoRAError(f"unknown engine {url!r}; known: {sorted(self.engines)}") from None

    # -- queries for the router -----------------------------------------------------------

    def residency(self, engine_url: str, adapter_name: str) -> ResidencyTier:
        """hot, warm or cold for ``adapter_id@version`` on an engine."""
        return self.engine(engine_url).cache.residency(adapter_name)

    def free_hot_slots(self, engine_url: str) -> int:
        return self.engine(engine_url).cache.free_hot_slots()

    def snapshot(self, engine_url: str) -> EngineResidency:
        eng = self.engine(engine_url)
        cache = eng.cache
        return EngineResidency(
            engine_url,
            eng.spec.base_model,
            hot=tuple(n for n in sorted(cache.entries) if cache.residency(n) is ResidencyTier.HOT),
            warm=tuple(
                n for n in sorted(cache.entries) if cache.residency(n) is ResidencyTier.WARM
            ),
            loading=tuple(sorted(eng.loads)),
            free_hot_slots=cache.free_hot_slots(),
            free_warm_slots=cache.free_warm_slots(),
        )

    def affinity(self, adapter_name: str, engine_urls: Sequence[str]) -> dict[str, float]:
        """Scores in [0, 1] for the router's LoRA affinity scorer, see
        :func:`kvstack.lora.affinity.affinity_scores` (hot > loading > warm > cold at home)."""
        known = [u for u in engine_urls if u in self.engines]
        caches = {u: self.engines[u].cache for u in known}
        loading = {u: adapter_name in self.engines[u].loads for u in known}
        return affinity_scores(adapter_name, engine_urls, caches, loading)

    def predicted_load_s(self, engine_url: str, adapter_name: str) -> float:
        return self.predictor.predict(engine_url, self.residency(engine_url, adapter_name).value)

    # -- the request path -----------------------------------------------------------------

    async def ensure_hot(
        self,
        engine_url: str,
        adapter: AdapterVersion | AdapterResolution,
        request_class: str = "interactive",
        budget_s: float | None = None,
    ) -> AdapterDecision:
        """Decide how a request for ``adapter`` is served on ``engine_url`` (see the module doc);
        waits for a load only when the prediction fits the budget. A released version that
        fails verification is rolled back (:mod:`kvstack.lora.rollback`) and the request is
        served by the version stable in its place, unless it pinned the failed one by name."""
        replaceable = not (
            isinstance(adapter, AdapterResolution) and split_engine_name(adapter.model)
        )
        if isinstance(adapter, AdapterResolution):
            adapter = adapter.adapter
        eng = self.engine(engine_url)
        klass = self._request_class(request_class)
        start = self._arrive(eng, adapter)
        self.metrics.request(adapter.adapter_id, start.value, self.is_protected(adapter))
        if start is ResidencyTier.HOT:
            return serve(self, eng, adapter, start, 0.0, 0.0)
        budget = budget_s if budget_s is not None else klass.cold_start_budget_s
        predicted = self.predictor.predict(engine_url, start.value)
        if budget is not None and predicted > budget:
            # The prewarm a refusal triggers counts against the background class's bound on
            # cold loads: under congestion, refusals must not pile more loads onto the store.
            self.prewarm_on(eng, adapter, "background")
            return not_now(self, eng, adapter, start, klass, "predicted_over_budget", predicted)
        return await self._wait_for_load(
            eng, adapter, start, klass, request_class, budget, predicted, replaceable
        )

    def hold_for_prefill(
        self, engine_url: str, adapter: AdapterVersion | AdapterResolution
    ) -> AdapterDecision | None:
        """A hold on ``adapter`` for a remote prefill step on ``engine_url`` when it is hot there
        (``finish`` releases it); else None, and a background load starts there. The step never
        waits for a load: the decode engine computes the prompt itself instead, and a later
        request for the adapter finds it hot on the prefill engine."""
        if isinstance(adapter, AdapterResolution):
            adapter = adapter.adapter
        eng = self.engine(engine_url)
        if self._arrive(eng, adapter) is ResidencyTier.HOT:
            return serve(self, eng, adapter, ResidencyTier.HOT, 0.0, 0.0)
        self.prewarm_on(eng, adapter, "background")
        return None

    def _arrive(self, eng: EngineState, adapter: AdapterVersion) -> ResidencyTier:
        """Count a request for ``adapter`` on the engine (its popularity there); its residency."""
        name = adapter.engine_name
        eng.stats.get(name).on_request(self.clock(), self.policy_config.qps_window_s)
        return eng.cache.residency(name)

    async def _wait_for_load(
        self,
        eng: EngineState,
        adapter: AdapterVersion,
        start: ResidencyTier,
        klass: RequestClassBudget,
        request_class: str,
        budget: float | None,
        predicted: float,
        replaceable: bool,
    ) -> AdapterDecision:
        name, began = adapter.engine_name, self.clock()
        failure: AdapterLoadError | VerificationError | None = None
        eng.cache.add_waiter(name, +1)
        try:
            task = self._load_task(eng, adapter, request_class)
            timeout = None if budget is None else budget / self.time_scale
            await asyncio.wait_for(asyncio.shield(task), timeout=timeout)
        except TimeoutError:
            return not_now(self, eng, adapter, start, klass, "load_exceeded_budget", predicted)
        except (AdapterLoadError, VerificationError) as exc:
            failure = exc
        finally:
            eng.cache.add_waiter(name, -1)
            eng.notify_released()
        if isinstance(failure, VerificationError):
            replacement = self.rollback.replacement(adapter) if replaceable else None
            if replacement is not None:  # rolled back: served by the version stable now
                return await self.ensure_hot(eng.spec.url, replacement, request_class, budget)
            return not_now(self, eng, adapter, start, klass, failure.reason, None)
        if failure is not None:
            return not_now(self, eng, adapter, start, klass, failure.reason, predicted)
        if eng.cache.residency(name) is not ResidencyTier.HOT:  # disabled or dropped meanwhile
            return not_now(self, eng, adapter, start, klass, "unloaded_while_waiting", predicted)
        return serve(self, eng, adapter, start, self.clock() - began, predicted)

    # -- loads ----------------------------------------------------------------------------

    def _load_task(
        self,
        eng: EngineState,
        adapter: AdapterVersion,
        request_class: str,
        to: ResidencyTier = ResidencyTier.HOT,
    ) -> asyncio.Task[None]:
        name = adapter.engine_name
        task = eng.loads.get(name)
        if task is not None and not task.done():
            return task
        klass = self._request_class(request_class)
        slot = eng.cold_slot(request_class, klass.max_concurrent_cold_loads)
        make = self.loader.make_hot if to is ResidencyTier.HOT else self.loader.make_warm
        task = asyncio.create_task(
            self._load(make(eng, adapter, slot), eng, adapter), name=f"lora-load:{name}"
        )
        eng.loads[name] = task
        task.add_done_callback(lambda t: _forget(eng.loads, name, t))
        return task

    async def _load(
        self, work: Coroutine[Any, Any, None], eng: EngineState, adapter: AdapterVersion
    ) -> None:
        """One load; a verification failure takes the version out of service first (once per
        load, however many requests wait for it)."""
        try:
            await work
        except VerificationError as exc:
            await self.rollback.take_out(adapter, exc, eng.spec.url)
            raise

    def prewarm_on(
        self,
        eng: EngineState,
        adapter: AdapterVersion,
        request_class: str = "background",
        to: ResidencyTier = ResidencyTier.HOT,
    ) -> asyncio.Task[None]:
        """Start (or join) a load without waiting; failures are audited and counted."""
        return self._load_task(eng, adapter, request_class, to)

    async def prewarm(
        self,
        adapter: AdapterVersion,
        engine_urls: Iterable[str] | None = None,
        to: ResidencyTier = ResidencyTier.HOT,
    ) -> dict[str, str]:
        """Load ``adapter`` on the given engines (default: all serving its base model) and wait;
        returns the outcome per engine ('ok' or the failure reason)."""
        urls = [
            u
            for u in (engine_urls or self.engines)
            if self.engine(u).spec.base_model == adapter.base_model
        ]
        tasks = [self.prewarm_on(self.engine(u), adapter, "background", to) for u in urls]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        outcomes = (getattr(r, "reason", repr(r)) if r is not None else "ok" for r in results)
        return dict(zip(urls, outcomes, strict=True))

    def is_protected(self, adapter: AdapterVersion) -> bool:
        """Canary and pinned adapters are always named in metrics."""
        release = self.resolver.release(adapter.adapter_id)
        if release is not None and release.canary_version == adapter.version:
            return True
        return self.rules.pinned(self.facts.of(adapter, None, None, self.clock()))

    def _request_class(self, name: str) -> RequestClassBudget:
        klass = self.config.request_classes.get(name)
        if klass is None:
            raise LoRAError(
                f"unknown request class {name!r}; known: {sorted(self.config.request_classes)}"
            )
        return klass

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for eng in self.engines.values():
            for task in eng.loads.values():
                task.cancel()
            await asyncio.gather(*eng.loads.values(), return_exceptions=True)
        self.loader.close()


def _forget(loads: dict[str, asyncio.Task[None]], name: str, task: asyncio.Task[None]) -> None:
    if loads.get(name) is task:
        del loads[name]
    if not task.cancelled():
        task.exception()  # retrieved: its failure was audited and counted by the loader
