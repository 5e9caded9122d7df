"""The demo's load comparison: a fixed number of requests per workload, through the router.

A cell (one workload, cache off or on) is exactly ``num_requests`` requests from the seeded
workload, sent by ``concurrency`` closed-loop users, so both arms see the same requests and
every cell has as many as the demo promises (the load generator's runs are timed, not counted).
Requests, timing and percentiles are the load generator's own (:mod:`kvstack.bench.load`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvstack.bench.demo.engine_metrics import cache_counters
from kvstack.bench.demo.report import DemoRow
from kvstack.bench.load.client import RequestResult, StreamClient
from kvstack.bench.load.loadgen import Progress
from kvstack.bench.load.progress import progress_bar
from kvstack.bench.load.stats import SLO, summarize
from kvstack.bench.workloads import make_workload
from kvstack.bench.workloads.prompts import PromptBuilder

__all__ = ["LoadCell", "measure_cell"]


@dataclass(frozen=True, slots=True)
class LoadCell:
    """One workload in one mode: exactly ``num_requests`` requests, ``concurrency`` users."""

    workload: str
    params: dict[str, Any]
    mode: str  # off | on
    num_requests: int
    concurrency: int
    seed: int


async def _send_all(
    url: str, cell: LoadCell, builder: PromptBuilder, progress: Progress | None
) -> tuple[list[RequestResult], float]:
    workload = make_workload(cell.workload, cell.params, builder, cell.seed)
    results: list[RequestResult] = []
    sent = 0
    async with StreamClient(url, timeout_s=600) as client:
        t0 = time.perf_counter()

        async def user() -> None:
            nonlocal sent
            while sent < cell.num_requests:
                sent += 1
                spec = workload.next_request()
                result = await client.send(spec, "demo", t0)
                results.append(result)
                workload.on_complete(spec, result.ok, result.text)
                if progress is not None:
                    errors = sum(1 for r in results if not r.ok)
                    progress(sent, len(results), errors, len(results) / cell.num_requests)

        await asyncio.gather(*(user() for _ in range(cell.concurrency)))
        return results, time.perf_counter() - t0


def measure_cell(
    router_url: str,
    engine_urls: Sequence[str],
    cell: LoadCell,
    builder: PromptBuilder,
    show_progress: bool,
) -> DemoRow:
    """One row: the cell's requests through the router, and the engines' cache counters."""
    before = cache_counters(engine_urls)
    with progress_bar(f"{cell.workload}, kvstack {cell.mode}", show_progress) as callback:
        results, duration_s = asyncio.run(_send_all(router_url, cell, builder, callback))
    after = cache_counters(engine_urls)
    s = summarize(results, duration_s, SLO(None, None)).overall
    return DemoRow(
        workload=cell.workload,
        mode=cell.mode,
        requests=s.num_requests,
        errors=s.num_errors,
        ttft_p50_s=s.ttft_s.p50 or 0.0,
        ttft_p90_s=s.ttft_s.p90 or 0.0,
        output_tokens_per_s=s.output_throughput,
        cache_hit_rate=after.hit_rate_since(before),
        ttft_s=sorted(r.ttft_s for r in results if r.ok and r.ttft_s is not None),
    )
