"""The simulator mode of ``kvstack bench lora``: the full manager driving simulated engines.

Per workload: one registry of signed adapters (and version 2 of the ``--rollout`` most popular
gold and standard ones), then every arm on its own ``kvstack sim-engine`` fleet, side by side
in one event loop so that whatever else loads the machine loads every arm alike
(``--sequential``: one after the other). Each workload gets its own directory under the run's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kvstack.bench.lora.records import ArmResult
from kvstack.bench.lora.report import arm_figures
from kvstack.bench.lora.run_sim import ArmSetup, run_arm
from kvstack.bench.lora.seeds import BenchWorkload, streams
from kvstack.bench.lora.setup import ModelledStore, register_all, sim_fleet
from kvstack.bench.workloads.lora_zipf import LoRAZipfAdapter, LoRAZipfArrival
from kvstack.lora.config import LoRAConfig

__all__ = ["run_sim_workload"]


def run_sim_workload(
    args: argparse.Namespace,
    w: BenchWorkload,
    arm_configs: Callable[[Path], dict[str, LoRAConfig]],
    root: Path,
) -> list[dict[str, Any]]:
    """Every arm on workload ``w``; their figures. ``arm_configs(root)``: arm name -> its
    config, with the registry, store and trust under ``root``."""
    from kvstack.lora.plane import ControlPlane
    from kvstack.lora.signing import generate_keypair

    root.mkdir(parents=True, exist_ok=True)
    generate_keypair(root / "key.pem", root / "key.pub.pem")
    (root / "sources").mkdir(exist_ok=True)
    configs = arm_configs(root)
    plane = ControlPlane.from_config(next(iter(configs.values())))
    sizes = ModelledStore(
        plane.store, args.time_scale, args.store_latency_s, args.store_mbps * 1e6, 1e9
    )
    adapters, arrivals = streams(
        w, args.adapters, args.requests, args.rate, args.interactive_fraction
    )
    rollout = _rollout_adapters(adapters, args.rollout)
    specs = [(a.adapter_id, "1", a.tier, a.rank) for a in adapters]
    specs += [(a, "2", a.split("-")[0], 16) for a in rollout]
    print(f"{w.key}: registering {len(specs)} adapter versions ...", file=sys.stderr)
    register_all(plane, sizes, specs, root / "sources", root / "key.pem")
    groups = [[n] for n in configs] if args.sequential else [list(configs)]
    results: list[ArmResult] = []
    for names in groups:
        arms = {n: configs[n] for n in names}
        results += _arms(args, arms, plane, sizes, root, rollout, adapters, arrivals)
        _reset_rollout(plane, rollout)
    return [arm_figures(r) for r in results]


def _arms(
    args: argparse.Namespace,
    configs: dict[str, LoRAConfig],
    plane: Any,
    sizes: ModelledStore,
    root: Path,
    rollout: list[str],
    adapters: list[LoRAZipfAdapter],
    arrivals: list[LoRAZipfArrival],
) -> list[ArmResult]:
    """Run arms side by side in one event loop, each with its own fleet and store wrapper."""
    sim_args = [
        "--model", "base", "--enable-lora",
        "--max-loras", str(args.gpu_slots),
        "--max-cpu-loras", str(args.host_slots),
        "--lora-load-s", str(args.engine_load_s),
        "--lora-activate-s", "0.01",
        "--time-scale", str(args.time_scale),
        "--stream-interval", "8",
    ]  # fmt: skip
    with ExitStack() as stack:
        setups = []
        for arm, config in configs.items():
            store = ModelledStore(
                sizes.inner, args.time_scale, args.store_latency_s, args.store_mbps * 1e6, 1e9
            )
            store.modelled_bytes = sizes.modelled_bytes
            fleet = stack.enter_context(sim_fleet(args.engines, sim_args, root / f"sim-{arm}.log"))
            setups.append(
                ArmSetup(
                    arm,
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
        names = ", ".join(configs)
        print(f"simulator arms {names}: {len(arrivals)} requests each ...", file=sys.stderr)
        return _run_loop(setups, adapters, arrivals)


def _run_loop(
    setups: list[ArmSetup], adapters: list[LoRAZipfAdapter], arrivals: list[LoRAZipfArrival]
) -> list[ArmResult]:
    async def main() -> list[ArmResult]:
        return list(await asyncio.gather(*(run_arm(s, adapters, arrivals) for s in setups)))

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def _rollout_adapters(adapters: list[LoRAZipfAdapter], count: int) -> list[str]:
    """The most popular gold and standard adapters (likely to have requests in flight)."""
    ranked = sorted((a for a in adapters if a.tier != "platinum"), key=lambda a: -a.weight)
    return [a.adapter_id for a in ranked[:count]]


def _reset_rollout(plane: Any, rollout: list[str]) -> None:
    """Back to version 1 for the next arm (rollback is one call)."""
    for adapter_id in rollout:
        release = plane.registry.release(adapter_id)
        if release is not None and release.stable_version == "2":
            plane.rollback(adapter_id, "bench")
