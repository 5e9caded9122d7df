"""In-process discrete-event comparison of the adapter cache policies, in virtual time.

It drives the manager's own cache core — :class:`~kvstack.lora.residency.EngineCache`, the
eviction policies, never-evict rules, facts, request stats, load-time predictor and affinity
scores — with modelled times in place of I/O, so that hundreds of thousands of requests run in
seconds and the caches reach their steady state (the simulator-backed arms cannot on a small
machine). What it leaves out: HTTP, the engines' own scheduling, budgets and rollouts.

Model: a request picks an engine by affinity (slack on requests in flight); a hot adapter
serves at once; a warm one waits for a hot slot and an engine load; a cold one also waits for
a warm slot and a fetch (latency + size / bandwidth + hashing), one fetch at a time per host.
A request holds its adapter from its start until its last token. Loads are single-flight.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kvstack.bench.lora.records import ArmResult, RequestRecord
from kvstack.bench.lora.setup import BYTES_PER_RANK
from kvstack.bench.workloads.lora_zipf import LoRAZipfAdapter, LoRAZipfArrival
from kvstack.lora.adapters import AdapterVersion, Release, Status
from kvstack.lora.affinity import affinity_scores, pick_engine, rendezvous_order
from kvstack.lora.config import LoRAConfig
from kvstack.lora.facts_builder import FactsBuilder
from kvstack.lora.policy import make_policy
from kvstack.lora.predict import LoadTimePredictor, reload_estimate
from kvstack.lora.residency import EngineCache, Entry, ResidencyTier, State
from kvstack.lora.resolver import Resolver
from kvstack.lora.rules import CacheRules
from kvstack.lora.stats import StatsTable
from kvstack.lora.warmup import WarmupSchedule

__all__ = ["DesTiming", "run_des"]


@dataclass(frozen=True)
class DesTiming:
    engine_load_s: float = 0.25
    store_latency_s: float = 0.05
    store_bytes_per_s: float = 100e6
    verify_bytes_per_s: float = 1e9
    prefill_s: float = 0.03
    decode_s_per_token: float = 0.008


@dataclass
class _Req:
    arrival: LoRAZipfArrival
    adapter: AdapterVersion
    tier: str
    start: ResidencyTier = ResidencyTier.COLD
    after_warmup: bool = False


@dataclass
class _Engine:
    url: str
    cache: EngineCache
    stats: StatsTable
    in_flight: int = 0
    host_free_at: float = 0.0
    joiners: dict[str, list[_Req]] = field(default_factory=dict)  # loads under way
    blocked: list[tuple[str, Callable[[], bool]]] = field(default_factory=list)


class _Des:
    def __init__(
        self,
        arm: str,
        config: LoRAConfig,
        adapters: list[LoRAZipfAdapter],
        engines: int,
        timing: DesTiming,
        slack: int,
    ) -> None:
        self.config, self.timing, self.slack = config, timing, slack
        self.versions = [_version(a) for a in adapters]
        self.resolver = Resolver(None, config)
        self.resolver.load_snapshot(
            (
                {v.adapter_id: Release(v.adapter_id, stable_version="1") for v in self.versions},
                {(v.adapter_id, v.version): v for v in self.versions},
            )
        )
        self.now = 0.0
        self.warmups = WarmupSchedule(config.scheduled_warmups, 0.0)
        self.facts = FactsBuilder(
            self.resolver,
            self.warmups,
            config.adapter_cache_policy.qps_window_s,
        )
        self.rules = CacheRules(config.adapter_cache_policy)
        self.predictor = LoadTimePredictor(config.load_time_prior_s)
        self.urls = [f"des://{i}" for i in range(engines)]
        self._homes: dict[str, list[str]] = {}
        self.engines = [self._engine(url) for url in self.urls]
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.result = ArmResult(arm)
        self.counting = False

    def _engine(self, url: str) -> _Engine:
        p = self.config.adapter_cache_policy
        stats = StatsTable(p.qps_window_s)
        cache = EngineCache(
            p.gpu_slots_per_base_model,
            p.host_slots_per_base_model,
            make_policy(p, self.config.priority_weights),
            facts=lambda entry, now: self.facts.of(
                entry.adapter, entry, stats, now, self.home_rank(url, entry.adapter.engine_name)
            ),
            pinned=self.rules.pinned,
            reload_s=lambda entry, tier: reload_estimate(self.predictor, stats, url, entry, tier),
        )
        return _Engine(url, cache, stats)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self._seq), fn))

    def run(
        self, arrivals: list[LoRAZipfArrival], adapters: list[LoRAZipfAdapter], warmup: int
    ) -> None:
        self._scheduled_warmups()
        for i, arrival in enumerate(arrivals):
            req = _Req(arrival, self.versions[arrival.adapter], adapters[arrival.adapter].tier)
            self.at(arrival.t_s, functools.partial(self.arrive, req, i >= warmup))
        while self.events:
            self.now, _, fn = heapq.heappop(self.events)
            fn()

    def home_rank(self, url: str, name: str) -> int:
        order = self._homes.get(name)
        if order is None:
            order = self._homes[name] = rendezvous_order(name, self.urls)
        return order.index(url)

    def _scheduled_warmups(self) -> None:
        """The startup warmups, as the manager runs them: to the warm tier where selected."""
        for rule in self.warmups.due(0.0):
            for eng in self.engines:
                for v in self.versions:
                    rank = self.home_rank(eng.url, v.engine_name)
                    fields = self.facts.of(v, None, eng.stats, 0.0, rank).as_fields()
                    if (
                        not rule(fields)
                        or eng.cache.residency(v.engine_name) is not ResidencyTier.COLD
                    ):
                        continue
                    if eng.cache.begin_materialise(v, v.engine_name, 0.0) is not None:
                        eng.cache.set_state(v.engine_name, State.WARM)

    # -- a request ------------------------------------------------------------------------

    def arrive(self, req: _Req, after_warmup: bool) -> None:
        if after_warmup and not self.counting:
            self.counting = True
            self.result.cold_loads = self.result.engine_loads = 0
        req.after_warmup = after_warmup
        eng = self._pick(req.adapter.engine_name)
        eng.in_flight += 1
        name = req.adapter.engine_name
        eng.stats.get(name).on_request(self.now, self.config.adapter_cache_policy.qps_window_s)
        req.start = eng.cache.residency(name)
        if name in eng.joiners:
            eng.joiners[name].append(req)
        elif req.start is ResidencyTier.HOT:
            self.serve(eng, req)
        else:
            eng.joiners[name] = [req]
            eng.cache.add_waiter(name, +1)
            self._load(eng, req.adapter)

    def serve(self, eng: _Engine, req: _Req) -> None:
        entry = eng.cache.entries[req.adapter.engine_name]
        entry.in_flight += 1
        ttft = self.now - req.arrival.t_s + self.timing.prefill_s
        tokens = 8 if req.arrival.interactive else 32
        self.result.records.append(
            RequestRecord(
                req.tier,
                req.arrival.interactive,
                req.start.value,
                "serve",
                "",
                ttft,
                req.after_warmup,
                False,
            )
        )
        self.at(
            self.now + self.timing.prefill_s + tokens * self.timing.decode_s_per_token,
            lambda: self.finish(eng, entry),
        )

    def finish(self, eng: _Engine, entry: Entry) -> None:
        entry.in_flight -= 1
        eng.in_flight -= 1
        self._retry_blocked(eng)

    def _retry_blocked(self, eng: _Engine) -> None:
        """Like the manager's slot waiters: every release retries the blocked loads in order."""
        blocked, eng.blocked = eng.blocked, []
        for name, retry in blocked:
            if not retry():
                eng.blocked.append((name, retry))

    # -- loads ----------------------------------------------------------------------------

    def _load(self, eng: _Engine, v: AdapterVersion) -> None:
        if eng.cache.residency(v.engine_name) is ResidencyTier.COLD:
            self._until(eng, v.engine_name, lambda: self._try_materialise(eng, v))
        else:
            self._until(eng, v.engine_name, lambda: self._try_hot(eng, v))

    def _until(self, eng: _Engine, name: str, attempt: Callable[[], bool]) -> None:
        if not attempt():
            eng.blocked.append((name, attempt))

    def _try_materialise(self, eng: _Engine, v: AdapterVersion) -> bool:
        victims = eng.cache.begin_materialise(v, v.engine_name, self.now)
        if victims is None:
            return False
        for victim in victims:
            if self.rules.pinned(self.facts.of(victim.adapter, victim, eng.stats, self.now)):
                pinned = self.result.invariants.get("pinned_eviction", 0)
                self.result.invariants["pinned_eviction"] = pinned + 1
        t = self.timing
        start = max(self.now, eng.host_free_at)
        size = v.size_bytes
        done = start + t.store_latency_s + size / t.store_bytes_per_s + size / t.verify_bytes_per_s
        eng.host_free_at = done
        self.result.cold_loads += 1

        def fetched() -> None:
            eng.cache.set_state(v.engine_name, State.WARM)
            # The work, as the manager records it: fetch, verify and engine load, not the queue.
            eng.stats.get(v.engine_name).load_s["cold"] = done - start + t.engine_load_s
            self._until(eng, v.engine_name, lambda: self._try_hot(eng, v))

        self.at(done, fetched)
        return True

    def _try_hot(self, eng: _Engine, v: AdapterVersion) -> bool:
        victims = eng.cache.begin_hot(v.engine_name, self.now)
        if victims is None:
            return False
        self.result.engine_loads += 1

        def loaded() -> None:
            name = v.engine_name
            eng.cache.set_state(name, State.HOT)
            eng.stats.get(name).on_load(self.now)
            eng.stats.get(name).load_s.setdefault("warm", self.timing.engine_load_s)
            eng.cache.add_waiter(name, -1)
            for req in eng.joiners.pop(name, []):
                self.serve(eng, req)
            self._retry_blocked(eng)

        self.at(self.now + self.timing.engine_load_s, loaded)
        return True

    def _pick(self, name: str) -> _Engine:
        caches = {e.url: e.cache for e in self.engines}
        loading = {e.url: name in e.joiners for e in self.engines}
        scores = affinity_scores(name, self.urls, caches, loading)
        url = pick_engine(scores, {e.url: e.in_flight for e in self.engines}, self.slack)
        return self.engines[self.urls.index(url)]


def _version(a: LoRAZipfAdapter) -> AdapterVersion:
    return AdapterVersion(
        adapter_id=a.adapter_id,
        version="1",
        base_model="bench-base",
        rank=a.rank,
        alpha=2.0 * a.rank,
        artifact_uri="",
        sha256="",
        size_bytes=a.rank * BYTES_PER_RANK,
        tenant_id=f"tenant-{a.tier}",
        priority_tier=a.tier,
        target_modules=("q_proj", "v_proj"),
        status=Status.ACTIVE,
    )


def run_des(
    arm: str,
    config: LoRAConfig,
    adapters: list[LoRAZipfAdapter],
    arrivals: list[LoRAZipfArrival],
    engines: int,
    warmup: int,
    timing: DesTiming,
    slack: int,
) -> ArmResult:
    import time

    des = _Des(arm, config, adapters, engines, timing, slack)
    started = time.monotonic()
    des.run(arrivals, adapters, warmup)
    des.result.wall_s = time.monotonic() - started
    des.result.invariants.setdefault("pinned_eviction", 0)
    return des.result
