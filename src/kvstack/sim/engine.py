"""SimEngine: the scheduler driven in scaled real time, plus metrics, KV events and tiers.

The loop plans a step, sleeps until the step's simulated end, applies it, then publishes the
step's KV events and wakes the HTTP handlers of requests that got tokens. Step ends are
scheduled back to back in simulated time, so timer jitter does not accumulate, and a loop that
wakes up to ``catch_up_wall_s`` late (a GC pause, a moment without CPU) catches up by running
the next steps without sleeping. Later than that (the CPU is saturated) the next step starts
late and the delay is counted in ``kvstack_sim_step_lag_seconds_total``: a benchmark whose
engines lag measures this machine, not the modelled one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import Counter

from kvstack.sim.blocks import BlockPool
from kvstack.sim.clock import ScaledClock
from kvstack.sim.config import SimConfig
from kvstack.sim.events import KVEventPublisher, to_vllm_events
from kvstack.sim.hashing import none_hash
from kvstack.sim.lora import LoRASlots
from kvstack.sim.metrics import SimEngineMetrics
from kvstack.sim.request import SimRequest
from kvstack.sim.scheduler import ScheduledStep, Scheduler, StepOutcome
from kvstack.sim.tier import TierLink
from kvstack.sim.tokenizer import SimTokenizer

__all__ = ["SimEngine"]

log = logging.getLogger(__name__)


class SimEngine:
    def __init__(
        self,
        config: SimConfig,
        engine_index: int = 0,
        tier: TierLink | None = None,
        tokenizer: SimTokenizer | None = None,
    ) -> None:
        self.config = config
        self.clock = ScaledClock(config.time_scale)
        self.tokenizer = tokenizer or SimTokenizer(config.vocab_size)
        self.pool = BlockPool(config.num_blocks)
        self.loras = LoRASlots(
            config.max_loras, config.cpu_lora_capacity, config.lora_load_s, config.lora_activate_s
        )
        self.scheduler = Scheduler(config, self.pool, self.loras, none_hash(config.hash_seed))
        self.metrics = SimEngineMetrics(config, engine_index)
        self._lag = Counter(
            "kvstack_sim_step_lag_seconds",
            "Wall seconds by which engine steps started late (CPU saturation)",
            registry=self.metrics.registry,
        )
        self.tier = tier
        self.publisher: KVEventPublisher | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.num_steps = 0
        self.lag_wall_s = 0.0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the step loop (and the KV event publisher) in the running event loop."""
        c = self.config
        if c.kv_events_endpoint:
            self.publisher = KVEventPublisher(
                c.kv_events_endpoint,
                c.kv_events_replay_endpoint,
                c.kv_events_topic,
                c.kv_events_buffer_steps,
            )
            self._replay_task = asyncio.get_running_loop().create_task(
                self.publisher.serve_replay()
            )
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._replay_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.publisher is not None:
            self.publisher.close()
        if self.tier is not None:
            await self.tier.drain()

    # -- requests ----------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def submit(self, req: SimRequest) -> None:
        self.scheduler.add(req)
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        """Cancel a request (client gone); its blocks are freed at the next step."""
        if not req.finished:
            req.aborted = True
            self._wake.set()

    def reset_prefix_cache(self) -> bool:
        ok = self.scheduler.reset_prefix_cache()
        if ok:
            self._publish_events(StepOutcome())
        return ok

    # -- the loop -----------------------------------------------------------------------------
    async def _run(self) -> None:
        start = self.clock.now()
        while True:
            step = self.scheduler.schedule(start)
            if step is None:
                self._publish_events(StepOutcome())  # aborted requests may have freed blocks
                start = await self._idle(start)
                continue
            end = start + step.duration_s
            await self.clock.sleep_until(end)
            self._apply(step, end)
            start = self._next_start(end)

    async def _idle(self, start: float) -> float:
        """Wait for work; returns the simulated time at which the next step starts."""
        self._wake.clear()
        if not self.scheduler.has_work():
            await self._wake.wait()
            # The step starts at the arrival, as in an engine that never sleeps; a wake-up later
            # than catch_up_wall_s after it is this machine's delay and counts as lag.
            arrival = self.scheduler.next_arrival()
            return self.clock.now() if arrival is None else self._next_start(arrival)
        arrival = self.scheduler.next_arrival()
        if arrival is not None and arrival > start:  # catching up: jump to that arrival
            return arrival
        # only blocked or aborted requests: retry after one base step
        await asyncio.sleep(self.clock.wall_s(max(self.config.step_base_s, 1e-3)))
        return self.clock.now()

    def _next_start(self, end: float) -> float:
        late_wall_s = self.clock.wall_s(self.clock.now() - end)
        if late_wall_s <= self.config.catch_up_wall_s:
            return end
        self.lag_wall_s += late_wall_s
        self._lag.inc(late_wall_s)
        return self.clock.now()

    def _apply(self, step: ScheduledStep, end: float) -> None:
        outcome = self.scheduler.complete(step, end)
        self.num_steps += 1
        self.metrics.on_step(step, outcome)
        self._publish_events(outcome)
        for req in outcome.progressed:
            if self.tier is not None and req.num_output == 1:
                prompt = req.tokens[: req.num_prompt]
                self.tier.store_soon(prompt, _adapter_key(req), req.cache_salt)
            if req.stream:
                req.notify()  # finished requests were woken by the scheduler

    def _publish_events(self, outcome: StepOutcome) -> None:
        pool_events = self.pool.take_events()
        if self.publisher is None or not (pool_events or outcome.stored):
            return
        self.publisher.publish(to_vllm_events(outcome.stored, pool_events, self.config.block_size))

    # -- /metrics ------------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        s = self.scheduler
        waiting = [r for r in s.waiting if not r.aborted]
        in_use = set(s.running_adapters())
        deferred = sum(
            1
            for r in waiting
            if r.adapter and r.adapter.name not in in_use and len(in_use) >= self.config.max_loras
        )
        return self.metrics.render(
            len(s.running),
            len(waiting),
            deferred,
            self.pool.usage(),
            sorted(in_use),
            s.waiting_adapters(),
        )


def _adapter_key(req: SimRequest) -> str | None:
    """The kvstack namespace adapter of a request: its name and path (the weights' identity)."""
    return None if req.adapter is None else f"{req.adapter.name}@{req.adapter.path}"
