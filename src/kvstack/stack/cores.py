"""Which cores each vLLM CPU engine of a stack computes on, and which are kept for the rest.

vLLM's CPU build binds its worker's OpenMP threads to cores. With its default
(``VLLM_CPU_OMP_THREADS_BIND=auto``) every engine of a host picks the same ones: two engines
started side by side both computed on core 0 and left core 1 idle. So ``kvstack up`` gives each
engine its own cores explicitly. The rule, over the CPUs the stack may use (``stack.cores.cpus``,
else the affinity mask of the process that runs ``kvstack up``):

1. **Reserved cores.** ``stack.cores.reserved`` cores (default: 1 when there are more cores than
   engines, else none) carry no engine compute. The router, the index server and redis are
   pinned to them, kvstack's connector moves its background threads (tier writers, I/O, lookups)
   there (``KVSTACK_BACKGROUND_CPUS``), and vLLM's API-server and scheduler processes, which
   are not pinned, find them idle. They are the last cores of the list. With none reserved,
   the connector's threads may run on any of the stack's cores, the engine's own included:
   left to their default, the cores the worker is not bound to, they would all sit on the other
   engines' compute cores. Measured with the demo's load (2 cores, two engines, a disk tier,
   32 requests a cell): TTFT p50 0.79-0.83 s pinned to the other engine's core against
   0.16-0.22 s free on both, multi-round-qa; 0.54-0.63 s against 0.09-0.10 s, long-doc-qa.
2. **Equal shares.** Each engine gets ``(cores - reserved) // engines`` contiguous cores, in the
   order engines are listed. Equal on purpose: every engine then computes with the same number
   of threads, so KV one engine computed is bit for bit what another would have computed and a
   kvstack hit gives the tokens the engine's own prefix-cache hit gives. Cores left over join
   the reserved ones.
3. **Fewer cores than engines.** Each engine gets one core, engines share cores round-robin,
   none is reserved, and the plan carries a warning: every engine will run slower.

An engine with tensor parallelism (``--tensor-parallel-size N``) counts as N engines, one per
rank; its binding lists one core list per rank, joined by ``|`` (vLLM's syntax). An engine whose
``env`` sets ``VLLM_CPU_OMP_THREADS_BIND`` keeps that setting and is left out of the plan.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvstack.errors import ConfigError
from kvstack.kv.affinity import BACKGROUND_ENV
from kvstack.stack.config import StackConfig, StackEngineSpec

__all__ = [
    "BACKGROUND_ENV",
    "BIND_ENV",
    "CorePlan",
    "bind_engine",
    "engine_core_plan",
    "format_cpu_list",
    "host_cpus",
    "plan_cores",
    "replica_names",
    "vllm_cpu_build",
]

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True, slots=True)
class CorePlan:
    """Cores per engine (one tuple per rank), the reserved cores, and a warning if any."""

    engines: Mapping[str, tuple[tuple[int, ...], ...]]
    reserved: tuple[int, ...]
    num_cpus: int
    warning: str | None = None

    def cores(self, engine: str) -> tuple[int, ...]:
        """Every core ``engine`` computes on (all ranks)."""
        return tuple(core for rank in self.engines[engine] for core in rank)

    def all_cores(self) -> tuple[int, ...]:
        """Every core of the plan: the engines' and the reserved ones."""
        used = {core for name in self.engines for core in self.cores(name)}
        return tuple(sorted(used | set(self.reserved)))

    def bind(self, engine: str) -> str:
        """The engine's ``VLLM_CPU_OMP_THREADS_BIND`` value, e.g. ``0-3`` or ``0-1|2-3``."""
        return "|".join(format_cpu_list(rank) for rank in self.engines[engine])

    def summary(self) -> str:
        """One line: who computes where, what is reserved."""
        parts = [f"{name} on {format_cpu_list(self.cores(name))}" for name in self.engines]
        reserved = format_cpu_list(self.reserved) if self.reserved else "none"
        return f"cores ({self.num_cpus}): {', '.join(parts)}; reserved: {reserved}"


def replica_names(spec: StackEngineSpec) -> list[str]:
    """The component names of an engine group: ``name``, or ``name-0``, ``name-1``, ..."""
    if spec.replicas == 1:
        return [spec.name]
    return [f"{spec.name}-{i}" for i in range(spec.replicas)]


def engine_core_plan(config: StackConfig) -> CorePlan | None:
    """The plan for the stack's vLLM engines; None when binding is off (``cores.bind: off``, or
    ``auto`` without vLLM's CPU build) or every vLLM engine sets its own binding."""
    bind = config.cores.bind
    if bind == "off" or (bind == "auto" and not vllm_cpu_build()):
        return None
    ranks = {
        name: _tensor_parallel_size(spec.args)
        for spec in config.engines
        if spec.kind == "vllm" and BIND_ENV not in spec.env
        for name in replica_names(spec)
    }
    if not ranks:
        return None
    return plan_cores(ranks, config.cores.cpus or host_cpus(), config.cores.reserved)


def bind_engine(
    env: dict[str, str], plan: CorePlan | None, name: str, connector: bool
) -> tuple[int, ...]:
    """Put engine ``name`` on its planned cores (its environment); returns them, or nothing
    when it is not in the plan. Its connector's threads go to the reserved cores; with none
    reserved, to any of the stack's cores, its own included."""
    if plan is None or name not in plan.engines:
        return ()
    env[BIND_ENV] = plan.bind(name)
    if connector:
        env.setdefault(BACKGROUND_ENV, format_cpu_list(plan.reserved or plan.all_cores()))
    return plan.cores(name)


def _tensor_parallel_size(args: Sequence[str]) -> int:
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag in ("--tensor-parallel-size", "-tp"):
            raw = value or (args[i + 1] if i + 1 < len(args) else "")
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"engine args: {flag} needs a positive integer, got {raw!r}")
            return int(raw)
    return 1


def plan_cores(
    engine_ranks: Mapping[str, int], cpus: Sequence[int], reserved: int | None = None
) -> CorePlan:
    """The plan for engines ``{name: ranks}`` (in order) on ``cpus``; see the module docstring."""
    if not cpus:
        raise ConfigError("stack.cores.cpus: no CPUs to plan engines on")
    if reserved is not None and not 0 <= reserved < len(cpus):
        raise ConfigError(f"stack.cores.reserved must be in [0, {len(cpus) - 1}], got {reserved}")
    cpus = sorted(set(cpus))
    num_ranks = sum(engine_ranks.values())
    if num_ranks > len(cpus):
        return _shared_plan(engine_ranks, cpus)
    wanted = reserved if reserved is not None else (1 if len(cpus) > num_ranks else 0)
    wanted = min(wanted, len(cpus) - num_ranks)  # every rank keeps at least one core
    per_rank = (len(cpus) - wanted) // num_ranks
    plan: dict[str, tuple[tuple[int, ...], ...]] = {}
    start = 0
    for name, ranks in engine_ranks.items():
        plan[name] = tuple(
            tuple(cpus[start + i * per_rank : start + (i + 1) * per_rank]) for i in range(ranks)
        )
        start += ranks * per_rank
    return CorePlan(plan, tuple(cpus[start:]), len(cpus))


def _shared_plan(engine_ranks: Mapping[str, int], cpus: list[int]) -> CorePlan:
    plan: dict[str, tuple[tuple[int, ...], ...]] = {}
    index = 0
    for name, ranks in engine_ranks.items():
        plan[name] = tuple((cpus[(index + i) % len(cpus)],) for i in range(ranks))
        index += ranks
    num_ranks = sum(engine_ranks.values())
    what = "engines" if num_ranks == len(engine_ranks) else "engine ranks"
    warning = (
        f"{num_ranks} vLLM CPU {what} but only {len(cpus)} core(s): engines share cores and each "
        "runs slower; start fewer engines or give the stack more cores"
    )
    return CorePlan(plan, (), len(cpus), warning)


def format_cpu_list(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the syntax of vLLM and taskset)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def host_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
