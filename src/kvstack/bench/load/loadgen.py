"""The load generator: open-loop Poisson arrivals or a closed loop of concurrent users.

- Open loop (``rate``): arrival gaps are exponential with mean ``1 / rate``, drawn from a
  generator seeded with ``seed``, so two runs send the same requests at the same offsets;
  a slow server does not slow the arrivals down.
- Closed loop (``concurrency``): that many workers each send a request, wait for its answer
  and send the next.

Requests are issued for ``duration_s``; those still running then get ``drain_timeout_s`` to
finish and are cancelled after that (counted as errors). With ``time_scale`` (a simulated
fleet running faster than real time), rates and durations are given in simulated units: the
generator sends ``rate x time_scale`` requests per wall second for ``duration_s /
time_scale`` wall seconds, and reports every time multiplied back by ``time_scale``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstack.bench.load.client import RequestResult, StreamClient
from kvstack.bench.workloads.base import RequestSpec, Workload

__all__ = ["LoadPlan", "LoadRun", "Progress", "run_load"]

Progress = Callable[[int, int, int, float], None]  # sent, done, errors, elapsed fraction


@dataclass(frozen=True, slots=True)
class LoadPlan:
    rate: float | None = None  # requests per (simulated) second: open loop
    concurrency: int | None = None  # closed loop
    duration_s: float = 60.0
    seed: int = 0
    time_scale: float = 1.0
    drain_timeout_s: float = 120.0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate (open loop) and concurrency (closed loop)")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.duration_s <= 0 or self.time_scale <= 0:
            raise ValueError("duration_s and time_scale must be > 0")


@dataclass(frozen=True, slots=True)
class LoadRun:
    results: list[RequestResult]
    duration_s: float  # from the first send to the last completion, in result units
    model: str


class _Runner:
    def __init__(
        self,
        client: StreamClient,
        workload: Workload[Any],
        plan: LoadPlan,
        model: str,
        progress: Progress | None,
    ) -> None:
        self.client = client
        self.workload = workload
        self.plan = plan
        self.model = model
        self.progress = progress
        self.results: list[RequestResult] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.t0 = time.perf_counter()
        self.wall_s = plan.duration_s / plan.time_scale

    async def one(self, spec: RequestSpec, scheduled_s: float | None = None) -> None:
        self.sent += 1
        result = await self.client.send(spec, self.model, self.t0)
        result.scheduled_s = scheduled_s
        self.results.append(result)
        self.workload.on_complete(spec, result.ok, result.text)

    def spawn(self, spec: RequestSpec, scheduled_s: float) -> None:
        task = asyncio.get_running_loop().create_task(self.one(spec, scheduled_s))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def open_loop(self, rate: float) -> None:
        arrivals = random.Random(self.plan.seed + 1)
        rate_wall = rate * self.plan.time_scale
        offset = arrivals.expovariate(rate_wall)
        while offset < self.wall_s:
            delay = self.t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self.spawn(self.workload.next_request(), offset)
            offset += arrivals.expovariate(rate_wall)

    async def closed_loop(self, concurrency: int) -> None:
        end = self.t0 + self.wall_s

        async def worker() -> None:
            while time.perf_counter() < end:
                await self.one(self.workload.next_request())

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def drain(self) -> None:
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=self.plan.drain_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        missing = self.sent - len(self.results)
        for _ in range(missing):
            self.results.append(RequestResult(start_s=self.wall_s, error="cancelled at drain"))

    async def report(self) -> None:
        while self.progress is not None:
            errors = sum(1 for r in self.results if not r.ok)
            elapsed = (time.perf_counter() - self.t0) / self.wall_s
            self.progress(self.sent, len(self.results), errors, min(elapsed, 1.0))
            await asyncio.sleep(0.25)


def _rescale(r: RequestResult, scale: float) -> None:
    r.start_s *= scale
    r.scheduled_s = None if r.scheduled_s is None else r.scheduled_s * scale
    r.ttft_s = None if r.ttft_s is None else r.ttft_s * scale
    r.e2e_s = None if r.e2e_s is None else r.e2e_s * scale
    r.itl_s = [gap * scale for gap in r.itl_s]


async def run_load(
    url: str,
    workload: Workload[Any],
    plan: LoadPlan,
    model: str | None = None,
    progress: Progress | None = None,
) -> LoadRun:
    """Run the plan against ``url``; the model defaults to the server's first."""
    async with StreamClient(url, plan.timeout_s) as client:
        if model is None:
            model = str((await client.get_json("/v1/models"))["data"][0]["id"])
        runner = _Runner(client, workload, plan, model, progress)
        reporter = asyncio.get_running_loop().create_task(runner.report())
        try:
            if plan.rate is not None:
                await runner.open_loop(plan.rate)
            else:
                assert plan.concurrency is not None
                await runner.closed_loop(plan.concurrency)
            await runner.drain()
        finally:
            reporter.cancel()
    ends = [r.start_s + (r.e2e_s or 0.0) for r in runner.results]
    wall = max([runner.wall_s, *ends])
    for r in runner.results:
        _rescale(r, plan.time_scale)
    runner.results.sort(key=lambda r: r.start_s)
    return LoadRun(runner.results, wall * plan.time_scale, model)
