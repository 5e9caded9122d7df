"""``kvstack bench lora``: the adapter-cache benchmark, weighted hotness against LRU.

    python -m kvstack.bench.lora.cli [--mode both] [--adapters 1000] [--requests 8000] ...

Two modes, each running both arms (``--policies``) at equal memory: ``--gpu-slots`` hot and
``--host-slots`` warm adapters per engine, the same arrivals (the ``lora-zipf`` workload of
:mod:`kvstack.bench.workloads.lora_zipf`), the same engine and store timing.

- ``sim``: the full manager drives simulated engines (``kvstack sim-engine`` in a child
  process) over HTTP. The arms run side by side in one event loop, so whatever else loads the
  machine loads both alike (``--sequential`` runs them one after the other). Half way through,
  ``--rollout`` popular adapters publish version 2 while requests are in flight.
- ``des``: the manager's cache core in virtual time (:mod:`kvstack.bench.lora.des`), long
  enough for the caches to reach their steady state.

The weighted arm uses the hot score and never-evict rules (canary, and platinum on its
``--pin-replicas`` home engines); the LRU arm is the engines' own policy (no pins, no rules).
Both get the same scheduled warmup of platinum adapters at startup. The report gives cold
loads, platinum cold starts and TTFT (simulated seconds) after the warmup fraction, the three
invariants, and the weighted/LRU ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kvstack.bench.lora.des import DesTiming, run_des
from kvstack.bench.lora.report import summarise, write_report
from kvstack.bench.lora.run_sim import ArmResult, ArmSetup, run_arm
from kvstack.bench.lora.setup import ModelledStore, bench_config, register_all, sim_fleet
from kvstack.bench.workloads.lora_zipf import LoRAZipfAdapter, make_adapters, make_arrivals
from kvstack.lora.config import AdapterCachePolicy, LoRAConfig, ScheduledWarmup, TenantPolicy

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench lora", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--adapters", type=int, default=1000, help="adapters in the registry")
    add(
        "--mode",
        choices=["sim", "des", "both"],
        default="both",
        help="sim: simulated engines over HTTP; des: in-process discrete events (virtual time)",
    )
    add("--requests", type=int, default=6000, help="requests per simulator arm")
    add("--des-requests", type=int, default=200_000, help="requests per discrete-event arm")
    add("--rate", type=float, default=12.0, help="arrivals per simulated second (all engines)")
    add("--engines", type=int, default=4, help="simulated engines")
    add("--gpu-slots", type=int, default=8, help="hot adapters per engine (max_loras)")
    add("--host-slots", type=int, default=64, help="warm adapters per engine host")
    add("--zipf-s", type=float, default=1.0, help="popularity skew within a tier")
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
    add("--policies", default="weighted-lru,lru", help="arms")
    add("--sequential", action="store_true", help="simulator arms one after the other")
    add(
        "--policy-json",
        default="{}",
        help="overrides of lora.adapter_cache_policy for the weighted arm, e.g. "
        '\'{"hot_score": {"ttft_penalty_if_cold": 0}, "qps_window_s": 3600}\'',
    )
    add("--out", type=Path, help="write the JSON report here")
    add("--workdir", type=Path, help="keep the registry, store and logs here")
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        if any(args.workdir.iterdir()):
            print(f"kvstack bench lora: --workdir {args.workdir} must be empty", file=sys.stderr)
            return 2
        return _run(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="kvstack-bench-lora-") as tmp:
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, root: Path) -> int:
    from kvstack.lora.signing import generate_keypair

    generate_keypair(root / "key.pem", root / "key.pub.pem")
    sources = root / "sources"
    sources.mkdir(exist_ok=True)
    # Platinum adapters are prewarmed, and pinned by the weighted arm, on their first
    # --pin-replicas engines in rendezvous order: enough copies to absorb load, not one copy
    # per engine (every copy costs a warm slot on that engine).
    platinum = f"tenant_priority == 'platinum' and home_rank < {args.pin_replicas}"
    never_evict = ["status == 'canary' and canary_percent > 0", platinum]
    config = bench_config(
        root,
        sources,
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
        adapter_cache_policy={"never_evict_when": never_evict},
    )
    adapters = make_adapters(args.adapters, args.zipf_s)
    policies = args.policies.split(",")
    reports: dict[str, Any] = {}
    if args.mode in ("des", "both"):
        reports["des"] = _des(args, config, adapters, policies)
    if args.mode in ("sim", "both"):
        reports["sim"] = _sim(args, config, adapters, policies, root)
    if args.out is not None:
        args.out.write_text(json.dumps(reports, indent=2, default=str))
    return 0


def _des(
    args: argparse.Namespace,
    config: LoRAConfig,
    adapters: list[LoRAZipfAdapter],
    policies: list[str],
) -> dict[str, Any]:
    arrivals = make_arrivals(adapters, args.des_requests, args.rate, args.interactive_fraction)
    timing = DesTiming(args.engine_load_s, args.store_latency_s, args.store_mbps * 1e6)
    warmup = int(len(arrivals) * args.warmup_fraction)
    print(f"discrete-event arms: {len(arrivals)} requests each ...", file=sys.stderr)
    results = [
        run_des(
            _arm_config(config, p, args),
            adapters,
            arrivals,
            args.engines,
            warmup,
            timing,
            args.slack,
        )
        for p in policies
    ]
    report = summarise(results, vars(args))
    print(
        "\n== in-process discrete-event comparison (virtual time; the manager's cache core, "
        "no HTTP, no engines) =="
    )
    write_report(report, sys.stdout)
    return report


def _sim(
    args: argparse.Namespace,
    config: LoRAConfig,
    adapters: list[LoRAZipfAdapter],
    policies: list[str],
    root: Path,
) -> dict[str, Any]:
    from kvstack.lora.plane import ControlPlane

    plane = ControlPlane.from_config(config)
    sizes = ModelledStore(
        plane.store, args.time_scale, args.store_latency_s, args.store_mbps * 1e6, 1e9
    )
    rollout = _rollout_adapters(adapters, args.rollout)
    specs = [(a.adapter_id, "1", a.tier, a.rank) for a in adapters]
    specs += [(a, "2", a.split("-")[0], 16) for a in rollout]
    print(f"registering {len(specs)} adapter versions ...", file=sys.stderr)
    register_all(plane, sizes, specs, root / "sources", root / "key.pem")
    arrivals = make_arrivals(adapters, args.requests, args.rate, args.interactive_fraction)
    configs = [_arm_config(config, p, args) for p in policies]
    if args.sequential:
        results = [
            _sim_arms(args, [c], plane, sizes, root, rollout, adapters, arrivals)[0]
            for c in configs
        ]
    else:
        results = _sim_arms(args, configs, plane, sizes, root, rollout, adapters, arrivals)
    report = summarise(results, vars(args))
    print("\n== simulated engines (kvstack sim-engine over HTTP, the full manager) ==")
    write_report(report, sys.stdout)
    return report


def _arm_config(config: LoRAConfig, policy: str, args: argparse.Namespace) -> LoRAConfig:
    """Equal memory for every arm; LRU is the engines' own policy: no pins, no rules."""
    update: dict[str, Any] = {
        "eviction_policy": policy,
        "gpu_slots_per_base_model": args.gpu_slots,
        "host_slots_per_base_model": args.host_slots,
    }
    if policy == "lru":
        update |= {"never_evict_when": [], "demote_when": []}
    data = config.adapter_cache_policy.model_dump() | update
    if policy != "lru":
        overrides = json.loads(args.policy_json)
        data = {
            **data,
            **overrides,
            "hot_score": {**data["hot_score"], **overrides.get("hot_score", {})},
        }
    cache = AdapterCachePolicy.model_validate(data)
    return config.model_copy(update={"adapter_cache_policy": cache})


def _sim_arms(
    args: argparse.Namespace,
    configs: list[LoRAConfig],
    plane: Any,
    sizes: ModelledStore,
    root: Path,
    rollout: list[str],
    adapters: Any,
    arrivals: Any,
) -> list[ArmResult]:
    """Run arms side by side in one event loop, each with its own fleet and store wrapper, so
    that whatever else loads the machine loads every arm alike."""
    sim_args = [
        "--model",
        "base",
        "--enable-lora",
        "--max-loras",
        str(args.gpu_slots),
        "--max-cpu-loras",
        str(args.host_slots),
        "--lora-load-s",
        str(args.engine_load_s),
        "--lora-activate-s",
        "0.01",
        "--time-scale",
        str(args.time_scale),
        "--stream-interval",
        "8",
    ]
    with ExitStack() as stack:
        setups = []
        for config in configs:
            policy = config.adapter_cache_policy.eviction_policy
            store = ModelledStore(
                sizes.inner, args.time_scale, args.store_latency_s, args.store_mbps * 1e6, 1e9
            )
            store.modelled_bytes = sizes.modelled_bytes
            log = root / f"sim-{policy}.log"
            fleet = stack.enter_context(sim_fleet(args.engines, sim_args, log))
            setups.append(
                ArmSetup(
                    policy,
                    config,
                    plane,
                    store,
                    fleet.urls,
                    root / "warm",
                    args.time_scale,
                    args.slack,
                    rollout,
                    args.warmup_fraction,
                )
            )
        names = ", ".join(s.policy for s in setups)
        print(f"simulator arms {names}: {len(arrivals)} requests each ...", file=sys.stderr)
        results = _run_loop(setups, adapters, arrivals)
    _reset_rollout(plane, rollout)
    return results


def _run_loop(setups: list[ArmSetup], adapters: Any, arrivals: Any) -> list[ArmResult]:
    async def main() -> list[ArmResult]:
        return list(await asyncio.gather(*(run_arm(s, adapters, arrivals) for s in setups)))

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def _rollout_adapters(adapters: Any, count: int) -> list[str]:
    """The most popular gold and standard adapters (likely to have requests in flight)."""
    ranked = sorted((a for a in adapters if a.tier != "platinum"), key=lambda a: -a.weight)
    return [a.adapter_id for a in ranked[:count]]


def _reset_rollout(plane: Any, rollout: list[str]) -> None:
    """Back to version 1 for the next arm (rollback is one call)."""
    for adapter_id in rollout:
        release = plane.registry.release(adapter_id)
        if release is not None and release.stable_version == "2":
            plane.rollback(adapter_id, "bench")


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
