"""``kvstack bench lora``: the adapter-cache benchmark, weighted hotness against LRU.

    kvstack bench lora [--mode des] [--seeds 1,2,3] [--zipf-s 1.0,0.8,1.2] [--jobs 2] ...

Three arms (:mod:`~kvstack.bench.lora.arms`) at equal memory: kvstack's weighted policy with
its never-evict pins, LRU with the same pins, and plain LRU (the engines' own); ``--gpu-slots``
hot and ``--host-slots`` warm adapters per engine, the same arrivals (``lora-zipf``), the same
engine and store timing, the same scheduled warmup of platinum adapters at startup.

Workloads (:mod:`~kvstack.bench.lora.seeds`): the tuning seed the weighted defaults were chosen
on, reported apart, then the held-out seeds of every shape, reported as medians and spreads.

- ``des``: the manager's cache core in virtual time (:mod:`~kvstack.bench.lora.des`), long
  enough for the caches to reach their steady state; deterministic.
- ``sim``: the full manager drives simulated engines over HTTP
  (:mod:`~kvstack.bench.lora.sim_mode`); half way through, ``--rollout`` popular adapters
  publish version 2 while requests are in flight.

The report gives, after the warmup fraction, cold loads, platinum cold starts and TTFT
(simulated seconds) per arm, the three invariants, and each pair of arms' ratios. The result
file (:mod:`kvstack.bench.results`) holds every figure printed, per run and over the seeds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvstack.bench import results
from kvstack.bench.lora.arms import (
    BenchArm,
    arm_config,
    parse_arms,
    parse_overrides,
    weighted_defaults,
)
from kvstack.bench.lora.des import DesTiming
from kvstack.bench.lora.des_mode import DesJob, run_des_jobs
from kvstack.bench.lora.report import run_figures, summarise_runs, write_run, write_summary
from kvstack.bench.lora.seeds import BenchWorkload, bench_workloads, parse_floats, parse_ints
from kvstack.bench.lora.setup import bench_config
from kvstack.lora.config import LoRAConfig, ScheduledWarmup, TenantPolicy

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench lora", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--mode", choices=["sim", "des", "both"], default="des", help="des: discrete events in "
        "virtual time; sim: simulated engines over HTTP (minutes per workload)")  # fmt: skip
    add("--adapters", type=int, default=1000, help="adapters in the registry")
    add("--requests", type=int, default=6000, help="requests per simulator arm")
    add("--des-requests", type=int, default=100_000, help="requests per discrete-event arm")
    add("--seeds", default="1,2,3", help="held-out workload seeds ('none': only the tuning seed)")
    add("--tuning-seed", default="0", help="the seed the defaults were chosen on ('none': skip)")
    add("--zipf-s", default="1.0,0.8,1.2", help="shapes: popularity skew within a tier; "
        "the first is the tuning seed's")  # fmt: skip
    add("--jobs", type=int, default=1, help="discrete-event arms run in this many processes")
    add("--rate", type=float, default=12.0, help="arrivals per simulated second (all engines)")
    add("--engines", type=int, default=4, help="simulated engines")
    add("--gpu-slots", type=int, default=8, help="hot adapters per engine (max_loras)")
    add("--host-slots", type=int, default=64, help="warm adapters per engine host")
    add("--interactive-fraction", type=float, default=0.7)
    add("--interactive-budget-s", type=float, default=5.0, help="cold-start budget")
    add("--time-scale", type=float, default=2.0, help="simulated seconds per wall second")
    add("--engine-load-s", type=float, default=0.25, help="engine load of a warm adapter")
    add("--store-latency-s", type=float, default=0.05, help="artifact store first byte")
    add("--store-mbps", type=float, default=100.0, help="store bandwidth per host, MB/s")
    add("--warmup-fraction", type=float, default=0.25, help="requests excluded from stats")
    add("--rollout", type=int, default=20, help="adapters that publish version 2 mid-run")
    add("--slack", type=int, default=8, help="router: max in-flight gap to the least busy")
    add("--pin-replicas", type=int, default=1, help="engines each platinum adapter is pinned on")
    add("--arms", "--policies", dest="arms", default="weighted-lru,lru-pins,lru", help="arms")
    add("--sequential", action="store_true", help="simulator arms one after the other")
    add("--policy-json", default="{}", help="the weighted arm's hot_score, qps_window_s or "
        'priority_weights, e.g. \'{"hot_score": {"ttft_penalty_if_cold": 0}}\'')  # fmt: skip
    add("--json", "--out", dest="json", type=Path, help="write the result here")
    add("--workdir", type=Path, help="keep the registries, stores and logs here")
    return p


def run(argv: list[str]) -> int:
    started = time.time()
    args = _parser().parse_args(argv)
    try:
        arms = parse_arms(args.arms)
        overrides = parse_overrides(args.policy_json)
        tuning = None if args.tuning_seed.lower() == "none" else int(args.tuning_seed)
        workloads = bench_workloads(tuning, parse_ints(args.seeds), parse_floats(args.zipf_s))
    except ValueError as exc:
        print(f"kvstack bench lora: {exc}", file=sys.stderr)
        return 2
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            print(f"kvstack bench lora: --workdir {args.workdir} must be empty", file=sys.stderr)
            return 2
        result = _run(args, arms, overrides, workloads, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="kvstack-bench-lora-") as tmp:
            result = _run(args, arms, overrides, workloads, Path(tmp))
    results.save("lora", argv, result, args.json, started=started)
    return 0


def _base_config(args: argparse.Namespace, root: Path) -> LoRAConfig:
    """What every arm shares; the weighted arm's pins are ``never_evict_when`` here."""
    # Platinum adapters are prewarmed, and pinned, on their first --pin-replicas engines in
    # rendezvous order: enough copies to absorb load, not one copy per engine (every copy
    # costs a warm slot on that engine).
    platinum = f"tenant_priority == 'platinum' and home_rank < {args.pin_replicas}"
    return bench_config(
        root,
        root / "sources",
        root / "key.pub.pem",
        request_classes={
            "interactive": {"cold_start_budget_s": args.interactive_budget_s},
            "background": {"max_concurrent_cold_loads": 2, "on_over_budget": "reject"},
        },
        scheduled_warmups=[ScheduledWarmup(select=platinum)],
        tenants={},
        default_tenant=TenantPolicy(allow_base_fallback=False),
        load_time_prior_s={"warm": args.engine_load_s, "cold": 1.0},
        reconcile_interval_s=2.0,
        metrics_top_k=50,
        io_threads=256,
        adapter_cache_policy={
            "never_evict_when": ["status == 'canary' and canary_percent > 0", platinum]
        },
    )


def _run(
    args: argparse.Namespace,
    arms: list[BenchArm],
    overrides: dict[str, Any],
    workloads: list[BenchWorkload],
    root: Path,
) -> dict[str, Any]:
    def configs(at: Path) -> dict[str, LoRAConfig]:
        base = _base_config(args, at)
        return {
            a.name: arm_config(base, a, args.gpu_slots, args.host_slots, overrides) for a in arms
        }

    weighted = configs(root).get("weighted-lru")
    result: dict[str, Any] = {
        "args": vars(args),
        "arms": {a.name: {"label": a.label, "policy": a.eviction_policy, "rules": a.rules}
                 for a in arms},
        "tuning": {
            "seed": workloads[0].seed if workloads[0].role == "tuning" else None,
            "zipf_s": workloads[0].zipf_s,
            "weighted_defaults": weighted_defaults(weighted) if weighted else None,
        },
    }  # fmt: skip
    if args.mode in ("des", "both"):
        result["des"] = _des(args, configs(root), workloads)
    if args.mode in ("sim", "both"):
        result["sim"] = _sim(args, configs, workloads, root)
    return result


def _des(
    args: argparse.Namespace, configs: dict[str, LoRAConfig], workloads: list[BenchWorkload]
) -> dict[str, Any]:
    timing = DesTiming(args.engine_load_s, args.store_latency_s, args.store_mbps * 1e6)
    jobs = [
        DesJob(
            arm, config, w, args.adapters, args.des_requests, args.rate,
            args.interactive_fraction, args.engines, args.warmup_fraction, timing, args.slack,
        )
        for w in workloads
        for arm, config in configs.items()
    ]  # fmt: skip
    print(
        f"discrete-event arms: {len(jobs)} runs of {args.des_requests} requests "
        f"({args.jobs} at a time) ...",
        file=sys.stderr,
    )
    figures = iter(run_des_jobs(jobs, args.jobs))
    runs = [run_figures(w, [next(figures) for _ in configs]) for w in workloads]
    print(
        "\n== in-process discrete-event comparison (virtual time; the manager's cache core, "
        "no HTTP, no engines) =="
    )
    return _finish(runs)


def _sim(
    args: argparse.Namespace, configs: Any, workloads: list[BenchWorkload], root: Path
) -> dict[str, Any]:
    from kvstack.bench.lora.sim_mode import run_sim_workload

    runs = [
        run_figures(w, run_sim_workload(args, w, configs, root / f"sim-{w.key}")) for w in workloads
    ]
    print("\n== simulated engines (kvstack sim-engine over HTTP, the full manager) ==")
    return _finish(runs)


def _finish(runs: list[dict[str, Any]]) -> dict[str, Any]:
    for r in runs:
        write_run(r, sys.stdout)
    summary = summarise_runs(runs)
    write_summary(summary, sys.stdout)
    return {"runs": runs, "summary": summary}


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
