"""One arm of the adapter-cache benchmark: a cache manager with one eviction policy driving a
simulated fleet through the same request stream.

Per request the bench router resolves the adapter (stable, or the new version after the
mid-run rollout), picks an engine with the manager's affinity scores (hot > warm > the
adapter's rendezvous home) among engines not more than ``slack`` requests busier than the
least busy, asks ``ensure_hot`` under the request's class budget, streams the completion and
records TTFT in simulated seconds. Every arm sees identical arrivals, engines and store timing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvstack.bench.lora.records import ArmResult, RequestRecord
from kvstack.bench.lora.setup import CountingDriver, ModelledStore
from kvstack.bench.workloads.lora_zipf import LoRAZipfAdapter, LoRAZipfArrival
from kvstack.lora.affinity import pick_engine
from kvstack.lora.config import AdapterEngineSpec, LoRAConfig
from kvstack.lora.decision import Action, AdapterDecision
from kvstack.lora.driver import HTTPEngineDriver
from kvstack.lora.manager import AdapterCacheManager
from kvstack.lora.plane import ControlPlane
from kvstack.lora.resolver import Resolver
from kvstack.lora.upkeep import Upkeep, run_warmups, sync_releases

__all__ = ["ArmSetup", "run_arm"]


@dataclass
class ArmSetup:
    arm: str
    config: LoRAConfig
    plane: ControlPlane
    store: ModelledStore
    urls: list[str]
    warm_root: Any  # Path
    time_scale: float
    slack: int
    rollout: list[str]  # adapters that publish version 2 half way through
    warmup_fraction: float


def _clock(scale: float) -> Any:
    t0 = time.monotonic()
    return lambda: (time.monotonic() - t0) * scale


async def run_arm(
    s: ArmSetup, adapters: list[LoRAZipfAdapter], arrivals: list[LoRAZipfArrival]
) -> ArmResult:
    engines = [
        AdapterEngineSpec(
            url=u,
            base_model="bench-base",
            served_model_name="base",
            warm_dir=str(s.warm_root / f"{s.arm}-{i}"),
            max_lora_rank=64,
        )
        for i, u in enumerate(s.urls)
    ]
    config = s.config.model_copy(update={"engines": engines})
    resolver = Resolver(s.plane.registry, config)
    resolver.refresh()
    driver = CountingDriver(HTTPEngineDriver())
    manager = AdapterCacheManager(
        config,
        resolver,
        s.store,
        s.plane.verifier,
        s.plane.audit,
        driver,
        _clock(s.time_scale),
        time_scale=s.time_scale,
    )
    result = ArmResult(s.arm)
    run_warmups(manager)  # scheduled warmups at startup (the same for every arm)
    await asyncio.gather(
        *(t for e in manager.engines.values() for t in e.loads.values()), return_exceptions=True
    )
    upkeep = Upkeep(manager, refresh_registry=False)
    upkeep.start()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        bench = _Bench(s, manager, http, adapters, result)
        started = time.monotonic()
        await bench.drive(arrivals)
        result.wall_s = time.monotonic() - started
    await upkeep.stop()
    result.cold_loads = s.store.num_fetches - bench.fetches_at_warmup
    result.engine_loads = driver.num_loads - bench.loads_at_warmup
    result.invariants = dict(manager.metrics.invariants)
    await manager.aclose()
    await driver.inner.aclose()  # type: ignore[attr-defined]
    return result


class _Bench:
    def __init__(
        self,
        s: ArmSetup,
        manager: AdapterCacheManager,
        http: aiohttp.ClientSession,
        adapters: list[LoRAZipfAdapter],
        result: ArmResult,
    ) -> None:
        self.s, self.m, self.http, self.adapters, self.result = s, manager, http, adapters, result
        self.in_flight = dict.fromkeys(s.urls, 0)
        self.fetches_at_warmup = 0
        self.loads_at_warmup = 0
        self.warm = False

    async def drive(self, arrivals: list[LoRAZipfArrival]) -> None:
        t0, tasks = time.monotonic(), []
        warmup_at, rollout_at = int(len(arrivals) * self.s.warmup_fraction), len(arrivals) // 2
        for i, arrival in enumerate(arrivals):
            delay = t0 + arrival.t_s / self.s.time_scale - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if i == warmup_at:
                self._mark_warm()
            if i == rollout_at:
                await self._rollout()
            tasks.append(asyncio.create_task(self.one(arrival, self.warm)))
        await asyncio.gather(*tasks)

    def _mark_warm(self) -> None:
        self.warm = True
        self.fetches_at_warmup = self.s.store.num_fetches
        self.loads_at_warmup = self.m.driver.num_loads  # type: ignore[attr-defined]

    async def _rollout(self) -> None:
        for adapter_id in self.s.rollout:
            await asyncio.to_thread(self.s.plane.promote, adapter_id, "2", "bench")
        await self.m.resolver.refresh_async()
        sync_releases(self.m)

    async def one(self, arrival: LoRAZipfArrival, warm: bool) -> None:
        """One request; ``warm``: it arrived after the warmup (whenever its task first runs)."""
        adapter = self.adapters[arrival.adapter]
        resolution = self.m.resolver.resolve(adapter.adapter_id, f"user-{arrival.user}")
        assert resolution is not None
        started = self.m.clock()
        url = self._pick(resolution.engine_name)
        klass = "interactive" if arrival.interactive else "background"
        self.in_flight[url] += 1
        try:
            decision = await self.m.ensure_hot(url, resolution, klass)
            ttft, served = await self._stream(decision, arrival.interactive, started)
        finally:
            self.in_flight[url] -= 1
        wrong = served is not None and decision.action is Action.SERVE and served != decision.model
        decision.finish(ttft_s=ttft, ok=ttft is not None, served_model=served)
        self.result.records.append(
            RequestRecord(
                adapter.tier,
                arrival.interactive,
                decision.start,
                decision.action.value,
                decision.reason,
                ttft,
                warm,
                wrong,
            )
        )

    def _pick(self, name: str) -> str:
        scores = self.m.affinity(name, list(self.in_flight))
        return pick_engine(scores, self.in_flight, self.s.slack)

    async def _stream(
        self, d: AdapterDecision, interactive: bool, started: float
    ) -> tuple[float | None, str | None]:
        if d.action is Action.REJECT:
            return None, None
        body = {
            "model": d.model,
            "prompt": "summarise the ticket history for this customer",
            "max_tokens": 8 if interactive else 32,
            "stream": True,
            "ignore_eos": True,
        }
        ttft, served = None, None
        async with self.http.post(f"{d.engine_url}/v1/completions", json=body) as r:
            if r.status != 200:
                return None, None
            async for raw in r.content:
                line = raw.decode()
                if ttft is None and line.startswith("data: {"):
                    ttft = self.m.clock() - started
                    served = _model_of(line)
        return ttft, served


def _model_of(line: str) -> str | None:
    import json

    try:
        model = json.loads(line[len("data: ") :]).get("model")
    except ValueError:
        return None
    return model if isinstance(model, str) else None
