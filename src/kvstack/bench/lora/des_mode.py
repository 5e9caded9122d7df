"""The discrete-event mode of ``kvstack bench lora``: every (workload, arm) pair as one job.

A job rebuilds its workload's adapters and arrivals from the seed and runs one arm of
:mod:`kvstack.bench.lora.des`; jobs share nothing, so ``--jobs N`` runs them in N processes
with the same figures as one (virtual time: only ``wall_s`` depends on the machine).
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvstack.bench.lora.des import DesTiming, run_des
from kvstack.bench.lora.report import arm_figures
from kvstack.bench.lora.seeds import BenchWorkload, streams
from kvstack.lora.config import LoRAConfig

__all__ = ["DesJob", "run_des_jobs"]


@dataclass(frozen=True)
class DesJob:
    arm: str
    config: LoRAConfig
    workload: BenchWorkload
    num_adapters: int
    num_requests: int
    rate_per_s: float
    interactive_fraction: float
    engines: int
    warmup_fraction: float
    timing: DesTiming
    slack: int


def run_des_job(job: DesJob) -> dict[str, Any]:
    """One arm on one workload; its figures (:func:`~kvstack.bench.lora.report.arm_figures`)."""
    adapters, arrivals = streams(
        job.workload, job.num_adapters, job.num_requests, job.rate_per_s, job.interactive_fraction
    )
    warmup = int(len(arrivals) * job.warmup_fraction)
    result = run_des(
        job.arm, job.config, adapters, arrivals, job.engines, warmup, job.timing, job.slack
    )
    print(f"  {job.workload.key} {job.arm}: {result.wall_s:.0f} s", file=sys.stderr)
    return arm_figures(result)


def run_des_jobs(jobs: list[DesJob], processes: int) -> list[dict[str, Any]]:
    """Every job's figures, in the order of ``jobs``."""
    if processes <= 1:
        return [run_des_job(j) for j in jobs]
    with ProcessPoolExecutor(processes) as pool:
        return list(pool.map(run_des_job, jobs))
